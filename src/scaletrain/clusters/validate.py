"""The shape of every cluster profile field, checked when a profile is loaded.

A profile is input like any other: users share the files and ``clusters probe`` writes them from
what ``sinfo`` says. Its values reach generated batch scripts, so each field has a shape, checked
here before anything is rendered (issue 22). How each lands in the script:

- names and GRES types (``name``, partition names, ``gres_type``, ``scratch_gres``): one plain
  word, as Slurm spells them; they land on ``#SBATCH`` lines and in comments.
- ``master_addr_suffix``: host-name characters only; rendered in single quotes after the
  double-quoted ``$(scontrol ...)`` (never inside them, where ``$(...)`` would run).
- ``scratch_var``: a variable (``$LOCAL_SCRATCH``, ``${SLURM_TMPDIR}``) or an absolute path of
  plain characters; rendered inside double quotes so the variable expands on each node.
- ``python``: one command word (``python3``, ``/appl/bin/python``), written as the command.
- ``container`` and ``exec_wrapper``: a command with plain options (``apptainer exec --nv``),
  written as the start of the launch line.
- ``env``: variable names as bash exports them; values are single-quoted when rendered.
- ``setup_lines``, ``container_setup_lines``, ``python_env_lines``: shell code **by design**
  (``module load pytorch``, ``source $VENV/bin/activate``): written as they are, so a profile is
  trusted like a script you run. Each must be one line (no newline, NUL or other control
  character), so one entry cannot end a construct the next depends on.
- numbers: finite (``nan`` and ``inf`` are refused) and within what a node can have.
- free text (``description``, ``site``, ``gpu_model``, ``notes``, ``sources``): no control
  characters, so it cannot break a comment line or a terminal.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from scaletrain.errors import ProfileError

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
HOST_SUFFIX = re.compile(r"[A-Za-z0-9.-]*")
SCRATCH = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})|/[A-Za-z0-9_.+/-]*")
COMMAND_WORD = re.compile(r"[A-Za-z0-9_./+-]+")
COMMAND = re.compile(r"[A-Za-z0-9_./+-]+( +[A-Za-z0-9_./+=:,-]+)*")
IMAGE = re.compile(r"[A-Za-z0-9_./:@+-]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Upper bounds well above any machine (a 16-GPU node, 1,000 cores, 100 TB of memory) that still
# catch a slip of the keyboard before it becomes a plan with 10^20 GPUs.
MAX_GPUS_PER_NODE = 1024
MAX_CORES_PER_NODE = 1 << 20
MAX_GB = 1e8
MAX_COUNT = 10**7


def _bad(profile: "ClusterProfile", field: str, value: object, shape: str) -> ProfileError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ProfileError(f"profile {profile.path or profile.name or '(inline)'}: field {field!r} = {shown} "
                        f"is not {shape}",
                        f"write {field} as {shape} (see the shipped profiles in scaletrain/clusters/profiles)")


def _match(profile: "ClusterProfile", field: str, value: str | None, pattern: re.Pattern[str],
           shape: str, *, empty_ok: bool = True) -> None:
    if value is None or (value == "" and empty_ok):
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _bad(profile, field, value, shape)


def _line(profile: "ClusterProfile", field: str, value: object) -> None:
    if not isinstance(value, str) or _CONTROL.search(value):
        raise _bad(profile, field, value, "one line of text (no newline or other control character)")


def _number(profile: "ClusterProfile", field: str, value: float | int | None, *, low: float,
            high: float, none_ok: bool = True) -> None:
    if value is None and none_ok:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value) or not low <= value <= high:
        raise _bad(profile, field, value, f"a finite number from {low:g} to {high:g}")


def check_profile(profile: "ClusterProfile") -> "ClusterProfile":
    """``profile`` unchanged when every field has its shape (module docstring); else ProfileError."""
    p = profile
    _match(p, "name", p.name, WORD, "a plain name (letters, digits, _ . + -)", empty_ok=False)
    for pname, part in p.partitions.items():
        _match(p, "partitions", pname, WORD, "a partition name (letters, digits, _ . + -)", empty_ok=False)
        _line(p, f"partitions.{pname}.description", part.description)
        _line(p, f"partitions.{pname}.access", part.access)
        for field in ("max_gpus", "min_gpus", "max_nodes", "min_nodes", "max_nodes_no_allocation"):
            _number(p, f"partitions.{pname}.{field}", getattr(part, field), low=0, high=MAX_COUNT)
        _number(p, f"partitions.{pname}.cores_per_node", part.cores_per_node, low=1, high=MAX_CORES_PER_NODE)
    _match(p, "gres_type", p.gres_type, WORD, "a GRES type such as v100")
    _match(p, "scratch_gres", p.scratch_gres, WORD, "a GRES name such as nvme")
    _match(p, "master_addr_suffix", p.master_addr_suffix, HOST_SUFFIX,
           "host-name characters (letters, digits, '.' and '-'), e.g. 'i'")
    _match(p, "scratch_var", p.scratch_var, SCRATCH,
           "a variable such as '$LOCAL_SCRATCH' or an absolute path of plain characters")
    _match(p, "python", p.python, COMMAND_WORD, "one command word such as python3 or /appl/bin/python",
           empty_ok=False)
    _match(p, "container", p.container, COMMAND, "a command with plain options, e.g. 'apptainer exec --nv'")
    _match(p, "exec_wrapper", p.exec_wrapper, COMMAND, "a command with plain options, e.g. 'apptainer_wrapper exec'")
    # the fields of live/retired systems: an image path reaches the script, a successor a hint
    _match(p, "default_image", getattr(p, "default_image", None), IMAGE,
           "an image path or URI of plain characters, e.g. /appl/local/containers/pytorch.sif")
    _match(p, "successor", getattr(p, "successor", None), WORD, "a profile name such as roihu")
    for name, pip_name in p.wheels.items():   # a pip name lands on the job's 'pip install' line
        _match(p, "wheels", name, WORD, "a framework name such as tensorflow", empty_ok=False)
        _match(p, "wheels", pip_name, WORD, "a pip package name such as tensorflow", empty_ok=False)
    for prefix in p.no_allocation_accounts:
        _match(p, "no_allocation_accounts", prefix, WORD, "an account prefix such as def-", empty_ok=False)
    _line(p, "cpu_jobs", p.cpu_jobs)
    for key, value in p.env.items():
        _match(p, "env", key, ENV_NAME, "a variable name (letters, digits and _)", empty_ok=False)
        _line(p, f"env.{key}", value)
    for field in ("setup_lines", "container_setup_lines", "python_env_lines", "container_binds",
                  "notes", "sources"):
        for item in getattr(p, field):
            _line(p, field, item)
    for field in ("description", "site", "gpu_model", "gpu_vendor"):
        _line(p, field, getattr(p, field))
    _number(p, "gpus_per_node", p.gpus_per_node, low=0, high=MAX_GPUS_PER_NODE, none_ok=False)
    _number(p, "cores_per_node", p.cores_per_node, low=1, high=MAX_CORES_PER_NODE, none_ok=False)
    _number(p, "mem_per_node_gb", p.mem_per_node_gb, low=0, high=MAX_GB, none_ok=False)
    _number(p, "gpu_memory_gb", p.gpu_memory_gb, low=0, high=MAX_GB, none_ok=False)
    for field in ("mem_per_gpu_gb", "max_mem_per_gpu_gb", "scratch_max_gb", "intra_node_gbps", "inter_node_gbps"):
        _number(p, field, getattr(p, field), low=0, high=MAX_GB)
    _number(p, "max_cores_per_gpu", p.max_cores_per_gpu, low=1, high=MAX_CORES_PER_NODE)
    for gpu, cores in (p.gpu_cpu_map or {}).items():
        _number(p, "gpu_cpu_map", gpu, low=0, high=MAX_GPUS_PER_NODE, none_ok=False)
        for core in cores:
            _number(p, "gpu_cpu_map", core, low=0, high=MAX_CORES_PER_NODE, none_ok=False)
    return profile


__all__ = ["check_profile"]
