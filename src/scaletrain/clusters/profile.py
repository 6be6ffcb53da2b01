"""Cluster profiles: what a cluster offers and how a job asks for it, loaded from TOML data files.

A profile is data, not code: one small TOML file per cluster in ``clusters/profiles/``. The user
may shadow or add profiles in ``$SCALETRAIN_CLUSTERS_DIR`` (or ``~/.config/scaletrain/clusters``)
and pass any file with ``--profile FILE``. Values the seed documents state are copied from them;
the rest come from the centres' public documentation, cited in each file's ``sources``.

Lookup order for a name: the user directory first (so a site can correct a shipped value), then
the shipped files. Loading never imports torch; only the ``local`` profile looks at this machine
(its core count, when the file declares ``cores_per_node = 0``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from scaletrain.clusters.validate import check_profile
from scaletrain.errors import ProfileError
from scaletrain.slurm.parse import format_time, parse_time_seconds  # Slurm's time syntax, one parser

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

GPU_REQUESTS = ("gres_typed", "gres", "gpus_per_node", "gpus_per_task")
MEM_REQUESTS = ("proportional", "whole_node", "none")


@dataclass(frozen=True, kw_only=True)
class Partition:
    """One Slurm partition and the limits a plan must respect."""

    name: str
    gpus: bool = True                   # a GPU partition
    max_gpus: int | None = None         # per job (Mahti gpusmall: 2)
    max_nodes: int | None = None
    min_nodes: int | None = None
    whole_node: bool = False            # only whole nodes are allocated (LUMI standard-g)
    max_time: str | None = None         # "HH:MM:SS" or "D-HH:MM:SS"
    default: bool = False
    # additions beyond the shared contract
    test: bool = False                  # a short test/debug queue: chosen only when named
    implicit: bool = False              # the scheduler routes jobs itself: no --partition line
    description: str = ""

    @property
    def max_seconds(self) -> int | None:
        """``max_time`` in seconds, or None when the partition has no limit."""
        return parse_time(self.max_time) if self.max_time else None


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """Everything scaletrain knows about one cluster (see the module docstring for the source)."""

    name: str
    description: str
    site: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: float
    gpu_vendor: str                     # "nvidia" | "amd" | "none"
    cores_per_node: int                 # usable by jobs
    mem_per_node_gb: float              # requestable
    partitions: dict[str, Partition]    # in file order
    gpu_request: str                    # "gres_typed" | "gres" | "gpus_per_node" | "gpus_per_task"
    gres_type: str | None               # "v100", "a100", ...
    account_required: bool
    scratch_var: str | None             # "$LOCAL_SCRATCH", "$SLURM_TMPDIR", "$TMPDIR"
    setup_lines: tuple[str, ...]        # module loads etc.
    container: str | None               # wrapper command for containers, or None
    env: dict[str, str]                 # e.g. {"NCCL_SOCKET_IFNAME": "hsn"} on LUMI
    master_addr_suffix: str             # "i" on JUWELS (InfiniBand host names), else ""
    gpu_cpu_map: dict[int, tuple[int, ...]] | None   # GPU index -> nearest cores (LUMI GCD->CCD)
    intra_node_gbps: float | None       # Gbit/s between two GPUs of a node (peak, per GPU)
    inter_node_gbps: float | None       # Gbit/s between nodes (peak, per node, all NICs)
    sources: tuple[str, ...]            # where values came from (seed file or centre doc URL)
    # additions beyond the shared contract (all defaulted)
    scheduler: str = "slurm"            # "slurm" | "none" (the local machine)
    python: str = "python3"             # interpreter the set-up lines provide
    mem_request: str = "proportional"   # "proportional" | "whole_node" (--mem=0) | "none" (no --mem)
    mem_per_gpu_gb: float | None = None  # the per-GPU share to request; None: mem_per_node/gpus
    gpu_request_accepts: tuple[str, ...] = ()  # every GPU syntax the cluster takes (for lint)
    exec_wrapper: str | None = None     # prefix for launchers the module does not wrap (deepspeed)
    scratch_gres: str | None = None     # GRES that buys node-local disk ("nvme" on Puhti/Mahti)
    scratch_max_gb: float | None = None
    scratch_in_memory: bool = False     # node-local "scratch" is a RAM disk (LUMI-G /tmp): no NVMe offload
    default_time: str = "01:00:00"
    notes: tuple[str, ...] = ()
    path: str = ""                      # the file the profile was read from
    # the centre's per-GPU share of a shared node, and what happens beyond it (clusters/resources.py)
    max_cores_per_gpu: int | None = None
    max_mem_per_gpu_gb: float | None = None
    gpu_share_policy: str = "billed"    # "enforced": refused beyond the share; "billed": charged for it
    billing: str = "gpus"               # "gpus": GPU x hours; "max_share": max(GPUs, cores/share, mem/share)
    # containers: what `apptainer exec` needs on this cluster (bind mounts, set-up before it)
    container_binds: tuple[str, ...] = ()
    container_setup_lines: tuple[str, ...] = ()
    # the Python environment a job gets when it names none (--venv/--conda): e.g. a virtualenv
    # built on each node from the centre's wheels (Alliance)
    python_env_lines: tuple[str, ...] = ()

    @property
    def cores_per_gpu(self) -> int:
        """The node's usable cores shared per GPU (Puhti 10, Mahti 32, LUMI 7)."""
        return max(1, self.cores_per_node // max(1, self.gpus_per_node))

    @property
    def mem_per_gpu(self) -> float:
        """The memory share per GPU, in GB."""
        if self.mem_per_gpu_gb is not None:
            return self.mem_per_gpu_gb
        return self.mem_per_node_gb / max(1, self.gpus_per_node)

    @property
    def default_partition(self) -> Partition | None:
        """The partition marked ``default`` (else the first GPU partition)."""
        for part in self.partitions.values():
            if part.default:
                return part
        gpu = [p for p in self.partitions.values() if p.gpus]
        return gpu[0] if gpu else None

    def partition(self, name: str) -> Partition:
        """The partition ``name``, or ProfileError listing the known ones."""
        try:
            return self.partitions[name]
        except KeyError:
            known = ", ".join(self.partitions) or "(none)"
            raise ProfileError(
                f"unknown partition {name!r} on cluster {self.name!r} (known: {known})",
                f"use one of: {known}, or leave --partition out to let scaletrain choose",
            ) from None


def parse_time(text: str) -> int:
    """Slurm time ``[D-]HH:MM:SS`` (also ``MM``, ``MM:SS``, ``D-HH``, ``D-HH:MM``) to seconds."""
    try:
        seconds = parse_time_seconds(str(text))
    except ValueError:
        seconds = None
    if seconds is None:  # malformed, or a limit word such as UNLIMITED where a time is needed
        raise ProfileError(f"bad time {str(text).strip()!r}",
                           "write it as HH:MM:SS or D-HH:MM:SS, e.g. 01:30:00")
    return seconds


# --------------------------------------------------------------------------- locating files

def _shipped_dir() -> Path:
    return Path(str(resources.files("scaletrain.clusters").joinpath("profiles")))


def user_dir() -> Path:
    """The user's profile directory: ``$SCALETRAIN_CLUSTERS_DIR`` or ~/.config/scaletrain/clusters."""
    env = os.environ.get("SCALETRAIN_CLUSTERS_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "scaletrain" / "clusters"


def _profile_files() -> dict[str, Path]:
    """name -> file; user files shadow shipped ones of the same name."""
    found: dict[str, Path] = {}
    for folder in (_shipped_dir(), user_dir()):
        if folder.is_dir():
            for f in sorted(folder.glob("*.toml")):
                found[f.stem] = f
    return found


def list_profiles() -> list[str]:
    """Names of every known profile (shipped and the user's), sorted."""
    return sorted(_profile_files())


def load_profile(name_or_path: str) -> ClusterProfile:
    """Load a profile by name (user dir, then shipped) or from a ``.toml`` file path.

    Raises ProfileError (exit 2) naming the known profiles when the name is unknown, or saying
    which field is wrong when the file is malformed.
    """
    candidate = Path(name_or_path).expanduser()
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        if not candidate.is_file():
            raise ProfileError(f"profile file {name_or_path!r} not found",
                               "give an existing .toml file, or a cluster name: "
                               + ", ".join(list_profiles()))
        return _load_file(candidate)
    files = _profile_files()
    key = name_or_path.strip().lower()
    if key not in files:
        known = ", ".join(sorted(files))
        raise ProfileError(f"unknown cluster {name_or_path!r} (known: {known})",
                           "pick one of the known clusters, run 'scaletrain clusters probe' on an "
                           "unknown one, or pass --profile FILE")
    return _load_file(files[key])


def _load_file(path: Path) -> ClusterProfile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}", "check the file's path and permissions") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {path} is not valid TOML: {exc}", "fix the TOML syntax") from None
    return profile_from_dict(data, path=str(path), default_name=path.stem)


# --------------------------------------------------------------------------- validation

_PROFILE_KEYS = {
    "name", "description", "site", "gpus_per_node", "gpu_model", "gpu_memory_gb", "gpu_vendor",
    "cores_per_node", "mem_per_node_gb", "partitions", "gpu_request", "gres_type",
    "account_required", "scratch_var", "setup_lines", "container", "env", "master_addr_suffix",
    "gpu_cpu_map", "intra_node_gbps", "inter_node_gbps", "sources", "scheduler", "python",
    "mem_request", "mem_per_gpu_gb", "gpu_request_accepts", "exec_wrapper", "scratch_gres",
    "scratch_max_gb", "scratch_in_memory", "default_time", "notes", "max_cores_per_gpu", "max_mem_per_gpu_gb",
    "gpu_share_policy", "billing", "container_binds", "container_setup_lines", "python_env_lines",
}
_PARTITION_KEYS = {"gpus", "max_gpus", "max_nodes", "min_nodes", "whole_node", "max_time",
                   "default", "test", "implicit", "description"}


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


def profile_from_dict(data: dict[str, Any], *, path: str = "", default_name: str = "") -> ClusterProfile:
    """Build and validate a ClusterProfile from parsed TOML (used by the loader and by probe)."""
    unknown = set(data) - _PROFILE_KEYS
    if unknown:
        raise _bad(path, f"unknown field(s) {', '.join(sorted(unknown))}")
    name = _typed(data, "name", str, path, default_name)
    if not name:
        raise _bad(path, "missing field 'name'")

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
            max_nodes=_typed(pdata, "max_nodes", int, ppath, None, none_ok=True),
            min_nodes=_typed(pdata, "min_nodes", int, ppath, None, none_ok=True),
            whole_node=_typed(pdata, "whole_node", bool, ppath, False),
            max_time=max_time,
            default=_typed(pdata, "default", bool, ppath, False),
            test=_typed(pdata, "test", bool, ppath, False),
            implicit=_typed(pdata, "implicit", bool, ppath, False),
            description=_typed(pdata, "description", str, ppath, ""),
        )

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

    cpu_map_raw = _typed(data, "gpu_cpu_map", dict, path, None, none_ok=True)
    gpu_cpu_map: dict[int, tuple[int, ...]] | None = None
    if cpu_map_raw:
        gpu_cpu_map = {}
        for key, cores in cpu_map_raw.items():
            if not str(key).isdigit() or not isinstance(cores, list) or not all(isinstance(c, int) for c in cores):
                raise _bad(path, f"gpu_cpu_map entry {key!r} must map a GPU index to a list of core numbers")
            gpu_cpu_map[int(key)] = tuple(cores)

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

    # every field's shape (issue 22: a profile value must not run as a command): clusters/validate.py
    return check_profile(ClusterProfile(
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


def profile_to_dict(profile: ClusterProfile) -> dict[str, Any]:
    """A JSON-friendly dict of the profile (partitions as dicts, map keys as strings)."""
    from dataclasses import asdict

    out = asdict(profile)
    out["partitions"] = {k: asdict(v) for k, v in profile.partitions.items()}
    if profile.gpu_cpu_map is not None:
        out["gpu_cpu_map"] = {str(k): list(v) for k, v in profile.gpu_cpu_map.items()}
    for key in ("setup_lines", "sources", "notes", "gpu_request_accepts", "container_binds",
                "container_setup_lines", "python_env_lines"):
        out[key] = list(out[key])
    return out


__all__ = [
    "Partition", "ClusterProfile", "load_profile", "list_profiles", "profile_from_dict",
    "profile_to_dict", "parse_time", "format_time", "user_dir",
]
