"""The profile file's schema: which fields a cluster profile may have, their types, and the checks.

``build_profile`` turns parsed TOML into a validated :class:`ClusterProfile`; every mistake is a
ProfileError naming the field. Besides the hardware and Slurm facts, a profile records where
each fact came from (``checked``: the date the centre's documentation was read; ``[facts]``: a
source per field; ``unconfirmed``: the facts no document confirmed) and, for a system that no
longer takes jobs, ``retired`` (a date) and ``successor`` (the profile to port to).
"""

from __future__ import annotations

import os
import re
from typing import Any

from scaletrain.clusters.model import GPU_REQUESTS, MEM_REQUESTS, ClusterProfile, Partition, parse_time
from scaletrain.clusters.validate import check_profile
from scaletrain.errors import ProfileError

SOFTWARE = ("module", "container")
CPU_ARCHES = ("x86_64", "aarch64")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


_PROFILE_KEYS = {
    "name", "description", "site", "gpus_per_node", "gpu_model", "gpu_memory_gb", "gpu_vendor",
    "cores_per_node", "mem_per_node_gb", "partitions", "gpu_request", "gres_type",
    "account_required", "scratch_var", "setup_lines", "container", "env", "master_addr_suffix",
    "gpu_cpu_map", "intra_node_gbps", "inter_node_gbps", "sources", "scheduler", "python",
    "mem_request", "mem_per_gpu_gb", "gpu_request_accepts", "exec_wrapper", "scratch_gres",
    "scratch_max_gb", "scratch_in_memory", "default_time", "notes", "max_cores_per_gpu", "max_mem_per_gpu_gb",
    "gpu_share_policy", "billing", "container_binds", "container_setup_lines", "python_env_lines",
    "software", "default_image", "cpu_arch", "checked", "facts", "unconfirmed", "retired", "successor",
    "module_multinode_warning", "tensorflow_setup_lines", "missing_launchers", "cpu_mem_per_core_gb",
    "gpus_per_billing_unit", "gpus_per_node_allowed", "no_allocation_accounts", "cpu_jobs", "wheels",
}
_PARTITION_KEYS = {"gpus", "max_gpus", "min_gpus", "max_nodes", "min_nodes", "max_nodes_no_allocation",
                   "cores_per_node", "whole_node", "max_time", "default", "test", "implicit", "description",
                   "access"}


def _bad(path: str, what: str) -> ProfileError:
    return ProfileError(f"profile {path or '(inline)'}: {what}",
                        "fix the profile file (see the shipped ones in scaletrain/clusters/profiles)")


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str,
           default: Any = ..., *, none_ok: bool = False) -> Any:
    if key not in data:
        if default is ...:
            raise _bad(path, f"missing field {key!r}")
        return default
    value = data[key]
    if value is None and none_ok:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _bad(path, f"field {key!r} must be {getattr(kind, '__name__', kind)}, not a boolean")
    if not isinstance(value, kind):
        raise _bad(path, f"field {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _detect_cores() -> int:
    # Only the cores this process may use (a cgroup or taskset narrows them), not the whole box.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def build_profile(data: dict[str, Any], *, path: str = "", default_name: str = "") -> ClusterProfile:
    """Build and validate a ClusterProfile from parsed TOML (used by the loader and by probe)."""
    unknown = set(data) - _PROFILE_KEYS
    if unknown:
        raise _bad(path, f"unknown field(s) {', '.join(sorted(unknown))}")
    name = _typed(data, "name", str, path, default_name)
    if not name:
        raise _bad(path, "missing field 'name'")

    partitions = _partitions(data, path)
    gpu_request, accepts, gres_type, mem_request, scheduler = _requests(data, path)
    gpu_cpu_map = _gpu_cpu_map(data, path)

    cores = _typed(data, "cores_per_node", int, path)
    if cores == 0:  # declared "detect": only meaningful for the local machine
        cores = _detect_cores()
    gpus_per_node = _typed(data, "gpus_per_node", int, path)
    if gpus_per_node < 0 or cores < 1:
        raise _bad(path, "gpus_per_node must be >= 0 and cores_per_node >= 1")
    env = _typed(data, "env", dict, path, {})
    default_time = _typed(data, "default_time", str, path, "01:00:00")
    parse_time(default_time)
    share_policy = _typed(data, "gpu_share_policy", str, path, "billed")
    billing = _typed(data, "billing", str, path, "gpus")
    if share_policy not in ("enforced", "billed") or billing not in ("gpus", "max_share"):
        raise _bad(path, "gpu_share_policy must be 'enforced' or 'billed', billing 'gpus' or 'max_share'")

    prov = _provenance(data, path)
    software = prov["software"]
    if software == "container" and not prov["default_image"]:
        raise _bad(path, "software 'container' needs default_image (the image a job gets when it names none)")
    # every value that reaches a batch script has its shape checked (clusters/validate.py)
    return check_profile(ClusterProfile(
        **prov,
        name=name,
        description=_typed(data, "description", str, path, ""),
        site=_typed(data, "site", str, path, ""),
        gpus_per_node=gpus_per_node,
        gpu_model=_typed(data, "gpu_model", str, path, ""),
        gpu_memory_gb=_typed(data, "gpu_memory_gb", float, path, 0.0),
        gpu_vendor=_typed(data, "gpu_vendor", str, path, "nvidia"),
        cores_per_node=cores,
        mem_per_node_gb=_typed(data, "mem_per_node_gb", float, path),
        partitions=partitions,
        gpu_request=gpu_request,
        gres_type=gres_type,
        account_required=_typed(data, "account_required", bool, path, False),
        scratch_var=_typed(data, "scratch_var", str, path, None, none_ok=True) or None,
        setup_lines=tuple(str(s) for s in _typed(data, "setup_lines", list, path, [])),
        container=_typed(data, "container", str, path, None, none_ok=True) or None,
        env={str(k): str(v) for k, v in env.items()},
        master_addr_suffix=_typed(data, "master_addr_suffix", str, path, ""),
        gpu_cpu_map=gpu_cpu_map,
        intra_node_gbps=_typed(data, "intra_node_gbps", float, path, None, none_ok=True),
        inter_node_gbps=_typed(data, "inter_node_gbps", float, path, None, none_ok=True),
        sources=tuple(str(s) for s in _typed(data, "sources", list, path, [])),
        scheduler=scheduler,
        python=_typed(data, "python", str, path, "python3"),
        mem_request=mem_request,
        mem_per_gpu_gb=_typed(data, "mem_per_gpu_gb", float, path, None, none_ok=True),
        gpu_request_accepts=accepts,
        exec_wrapper=_typed(data, "exec_wrapper", str, path, None, none_ok=True) or None,
        scratch_gres=_typed(data, "scratch_gres", str, path, None, none_ok=True) or None,
        scratch_max_gb=_typed(data, "scratch_max_gb", float, path, None, none_ok=True),
        scratch_in_memory=_typed(data, "scratch_in_memory", bool, path, False),
        default_time=default_time,
        notes=tuple(str(s) for s in _typed(data, "notes", list, path, [])),
        path=path,
        max_cores_per_gpu=_typed(data, "max_cores_per_gpu", int, path, None, none_ok=True),
        max_mem_per_gpu_gb=_typed(data, "max_mem_per_gpu_gb", float, path, None, none_ok=True),
        gpu_share_policy=share_policy,
        billing=billing,
        container_binds=tuple(str(s) for s in _typed(data, "container_binds", list, path, [])),
        container_setup_lines=tuple(str(s) for s in _typed(data, "container_setup_lines", list, path, [])),
        python_env_lines=tuple(str(s) for s in _typed(data, "python_env_lines", list, path, [])),
    ))


def _partitions(data: dict[str, Any], path: str) -> dict[str, Partition]:
    """The profile's ``[partitions.NAME]`` tables, each field checked."""
    parts_raw = _typed(data, "partitions", dict, path, {})
    partitions: dict[str, Partition] = {}
    for pname, pdata in parts_raw.items():
        if not isinstance(pdata, dict):
            raise _bad(path, f"partition {pname!r} must be a table")
        extra = set(pdata) - _PARTITION_KEYS
        if extra:
            raise _bad(path, f"partition {pname!r}: unknown field(s) {', '.join(sorted(extra))}")
        ppath = f"{path} [partitions.{pname}]"
        max_time = _typed(pdata, "max_time", str, ppath, None, none_ok=True)
        if max_time:
            parse_time(max_time)
        partitions[pname] = Partition(
            name=pname,
            gpus=_typed(pdata, "gpus", bool, ppath, True),
            max_gpus=_typed(pdata, "max_gpus", int, ppath, None, none_ok=True),
            min_gpus=_typed(pdata, "min_gpus", int, ppath, None, none_ok=True),
            max_nodes=_typed(pdata, "max_nodes", int, ppath, None, none_ok=True),
            min_nodes=_typed(pdata, "min_nodes", int, ppath, None, none_ok=True),
            max_nodes_no_allocation=_typed(pdata, "max_nodes_no_allocation", int, ppath, None, none_ok=True),
            cores_per_node=_typed(pdata, "cores_per_node", int, ppath, None, none_ok=True),
            whole_node=_typed(pdata, "whole_node", bool, ppath, False),
            max_time=max_time,
            default=_typed(pdata, "default", bool, ppath, False),
            test=_typed(pdata, "test", bool, ppath, False),
            implicit=_typed(pdata, "implicit", bool, ppath, False),
            description=_typed(pdata, "description", str, ppath, ""),
            access=_typed(pdata, "access", str, ppath, ""),
        )
    return partitions


def _requests(data: dict[str, Any], path: str) -> tuple[str, tuple[str, ...], str | None, str, str]:
    """How the cluster is asked for GPUs and memory, and its scheduler, checked:
    ``(gpu_request, gpu_request_accepts, gres_type, mem_request, scheduler)``."""
    gpu_request = _typed(data, "gpu_request", str, path, "gres")
    if gpu_request not in GPU_REQUESTS:
        raise _bad(path, f"gpu_request {gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
    accepts = tuple(_typed(data, "gpu_request_accepts", list, path, [gpu_request]))
    for a in accepts:
        if a not in GPU_REQUESTS:
            raise _bad(path, f"gpu_request_accepts has {a!r}, not one of {', '.join(GPU_REQUESTS)}")
    gres_type = _typed(data, "gres_type", str, path, None, none_ok=True) or None
    if gpu_request == "gres_typed" and not gres_type:
        raise _bad(path, "gpu_request 'gres_typed' needs gres_type (e.g. 'v100')")
    mem_request = _typed(data, "mem_request", str, path, "proportional")
    if mem_request not in MEM_REQUESTS:
        raise _bad(path, f"mem_request {mem_request!r} is not one of {', '.join(MEM_REQUESTS)}")
    scheduler = _typed(data, "scheduler", str, path, "slurm")
    if scheduler not in ("slurm", "none"):
        raise _bad(path, f"scheduler {scheduler!r} must be 'slurm' or 'none'")
    return gpu_request, accepts, gres_type, mem_request, scheduler


def _gpu_cpu_map(data: dict[str, Any], path: str) -> dict[int, tuple[int, ...]] | None:
    """``gpu_cpu_map``: GPU index -> the cores next to it, or None when not given."""
    cpu_map_raw = _typed(data, "gpu_cpu_map", dict, path, None, none_ok=True)
    gpu_cpu_map: dict[int, tuple[int, ...]] | None = None
    if cpu_map_raw:
        gpu_cpu_map = {}
        for key, cores in cpu_map_raw.items():
            if not str(key).isdigit() or not isinstance(cores, list) or not all(isinstance(c, int) for c in cores):
                raise _bad(path, f"gpu_cpu_map entry {key!r} must map a GPU index to a list of core numbers")
            gpu_cpu_map[int(key)] = tuple(cores)
    return gpu_cpu_map


def _date(data: dict[str, Any], key: str, path: str) -> str | None:
    value = _typed(data, key, str, path, None, none_ok=True) or None
    if value is not None and not _DATE.match(value):
        raise _bad(path, f"field {key!r} must be a date YYYY-MM-DD, got {value!r}")
    return value


def _provenance(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The software default, the CPU architecture, the sources and the retirement fields."""
    software = _typed(data, "software", str, path, "module")
    if software not in SOFTWARE:
        raise _bad(path, f"software {software!r} is not one of {', '.join(SOFTWARE)}")
    arch = _typed(data, "cpu_arch", str, path, "x86_64")
    if arch not in CPU_ARCHES:
        raise _bad(path, f"cpu_arch {arch!r} is not one of {', '.join(CPU_ARCHES)}")
    facts = _typed(data, "facts", dict, path, {})
    unconfirmed = _typed(data, "unconfirmed", list, path, [])
    for entry in unconfirmed:
        if not isinstance(entry, str) or ":" not in entry:
            raise _bad(path, f"unconfirmed entry {entry!r} must read 'FIELD: why it is unconfirmed'")
    for key in [*facts, *(str(e).partition(":")[0].strip() for e in unconfirmed)]:
        if key.split(".", 1)[0] not in _PROFILE_KEYS:
            raise _bad(path, f"facts/unconfirmed name {key!r}, which is not a profile field")
    retired = _date(data, "retired", path)
    successor = _typed(data, "successor", str, path, None, none_ok=True) or None
    if successor and not retired:
        raise _bad(path, "successor goes with retired (the date the system stopped taking jobs)")
    missing = _typed(data, "missing_launchers", dict, path, {})
    unit = _typed(data, "gpus_per_billing_unit", int, path, 1)
    if unit < 1:
        raise _bad(path, "gpus_per_billing_unit must be at least 1")
    allowed = _typed(data, "gpus_per_node_allowed", list, path, [])
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in allowed):
        raise _bad(path, "gpus_per_node_allowed must list positive GPU counts, e.g. [1, 4]")
    wheels = _typed(data, "wheels", dict, path, {})
    return {
        "no_allocation_accounts": tuple(str(a) for a in _typed(data, "no_allocation_accounts", list, path, [])),
        "cpu_jobs": _typed(data, "cpu_jobs", str, path, ""),
        "wheels": {str(k): str(v) for k, v in wheels.items()},
        "gpus_per_node_allowed": tuple(allowed),
        "module_multinode_warning": _typed(data, "module_multinode_warning", str, path, ""),
        "tensorflow_setup_lines": tuple(str(s) for s in _typed(data, "tensorflow_setup_lines", list, path, [])),
        "missing_launchers": {str(k): str(v) for k, v in missing.items()},
        "cpu_mem_per_core_gb": _typed(data, "cpu_mem_per_core_gb", float, path, None, none_ok=True),
        "gpus_per_billing_unit": unit,
        "software": software,
        "default_image": _typed(data, "default_image", str, path, None, none_ok=True) or None,
        "cpu_arch": arch,
        "checked": _date(data, "checked", path) or "",
        "facts": {str(k): str(v) for k, v in facts.items()},
        "unconfirmed": tuple(unconfirmed),
        "retired": retired,
        "successor": successor,
    }
