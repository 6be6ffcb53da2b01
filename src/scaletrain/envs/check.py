"""Will the job's Python import what it needs? Asked on the login node, before ``sbatch``.

A job whose Python lacks scaletrain (or the launcher's package) waits in the queue, starts and
stops at its first line with exit 3. ``submit`` asks first: it runs the job's own set-up lines
(the profile's modules, ``--module``, ``--venv``/``--conda``, the running environment) in a
fresh ``bash`` with the environment sbatch will hand the job, then the job's Python, which
reports which of the needed packages it cannot find. The lines are the plan's own, read from its
software record (``Plan.software``: set-up lines, container prefix, interpreter); the user's
``--setup`` lines and the MPS daemon are not run here. A miss is refused with ``--setup`` too: the
job's environment is made by what this check runs (``--venv``/``--conda``/``--module``), and one
that a ``--setup`` line makes must be made before the job, where it can be checked. The names asked for: scaletrain (when the
launch imports it), the launcher's package (``scaletrain.plan.software.LAUNCHER_PACKAGES``) and
the program's own imports when its file is readable here (``scaletrain.envs.imports``).

A ``--venv`` folder that does not exist here, or is not a finished venv (no ``bin/activate``, no
``pyvenv.cfg``), and a ``--conda`` path with no ``conda-meta``, are refused first, without running
anything: that holds on a login node whose CPU differs from the GPU nodes' too.

Outcomes: ``None`` (the job's Python has everything), a warning (could not be asked here: a
container runtime absent on this node, an image that does not start, nodes of another CPU
architecture, the bound of ``CHECK_TIMEOUT_S``), or ``DistEnvError`` with the fix. A job that
builds its venv from the centre's wheels (the Alliance profiles) is judged without running
anything: that venv holds what the profile's wheels for the launcher name (torch, or tensorflow).
"""

from __future__ import annotations

import os
import platform
import selectors
import shlex
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Mapping

from scaletrain.errors import DistEnvError

if TYPE_CHECKING:
    from scaletrain.plan.records import Plan

CHECK_TIMEOUT_S = 120.0       # module loads on a busy login node take seconds, not minutes
_MISSING_EXIT = 96            # the probe's "these are missing" (any other failure is the set-up's)
_NO_RUNTIME_EXIT = 97         # the container runtime is not on this node
_OUTPUT_LIMIT = 64 * 1024     # what is kept of the probe's output for the message
_POLL_S = 0.1                 # how often the check looks whether bash ended while a helper holds its output
# importable names the launch itself needs, besides scaletrain (scaletrain.plan.launchers): torchrun
# and scaletrain run are torch's agent, scaletrain.init() imports torch. TensorFlow's launch line
# needs scaletrain alone (the program's own imports are the program's).
_LAUNCH_IMPORTS = {"scaletrain": ("torch",), "scaletrain-run": ("torch",), "torchrun": ("torch",)}
# The probe: import scaletrain for real (cheap: no torch), only look the others up (importing
# torch or deepspeed on a login node takes seconds and starts threads).
_PROBE = ("import importlib.util, sys\n"
          "missing = [n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]\n"
          "if 'scaletrain' in sys.argv[1:] and 'scaletrain' not in missing:\n"
          "    try:\n"
          "        import scaletrain\n"
          "    except Exception as exc:\n"
          "        missing.append('scaletrain (' + type(exc).__name__ + ')')\n"
          "print('scaletrain-missing:' + ','.join(missing))\n"
          f"sys.exit({_MISSING_EXIT} if missing else 0)\n")


def this_arch(machine: str | None = None) -> str:
    """``platform.machine()`` in the profiles' words (arm64 is aarch64, AMD64 is x86_64)."""
    m = (platform.machine() if machine is None else machine).lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(m, m)


def needed_imports(plan: Plan) -> tuple[str, ...]:
    """What the job's Python must import: scaletrain (when the launch imports it) and the launcher's package."""
    from scaletrain.plan.software import LAUNCHER_PACKAGES

    launcher = plan.settled.request.launcher
    names = ["scaletrain"] if plan.software.check_scaletrain else []
    names += _LAUNCH_IMPORTS.get(launcher, ())
    if launcher in LAUNCHER_PACKAGES:
        names.append(LAUNCHER_PACKAGES[launcher])
    names += plan.settled.request.program_imports or ()
    return tuple(dict.fromkeys(names))


def check_env_folder(venv: str | None, conda: str | None) -> None:
    """``DistEnvError`` when the ``--venv`` folder (or a ``--conda`` path) is not a finished
    environment here; a conda environment given by name is left to conda."""
    if venv:
        root = venv.rstrip("/") or "/"
        lacking = [f for f in ("bin/activate", "pyvenv.cfg") if not os.path.isfile(os.path.join(root, f))]
        if not os.path.isdir(root):
            raise DistEnvError(f"--venv {venv}: no such folder here, so the job's 'source {root}/bin/activate' "
                               "would fail", "make it first ('scaletrain env create --cluster NAME DIR') or "
                               "give the path of an existing venv")
        if lacking:
            raise DistEnvError(f"--venv {venv} is not a finished venv: it has no {' and no '.join(lacking)} "
                               "(an interrupted 'env create' or 'python -m venv'?)",
                               "make it again ('scaletrain env create --cluster NAME DIR'), or give another folder")
    if conda and "/" in conda and not os.path.isdir(os.path.join(conda, "conda-meta")):
        raise DistEnvError(f"--conda {conda}: no conda environment there (no conda-meta folder)",
                           "give the path of an existing environment ('conda env list' shows them), or its name")


def _fix(plan: Plan, names: tuple[str, ...]) -> str:
    from scaletrain.envs.create import PACKAGES

    profile = plan.settled.profile
    modules = profile.tensorflow_setup_lines
    if plan.settled.request.launcher == "tensorflow" and modules and not profile.python_env_lines:
        # the job runs the centre's TensorFlow module; a venv for it is made on that module
        return (f"leave out --venv/--conda: the job then runs {profile.name}'s TensorFlow module "
                f"({'; '.join(modules)}); or make a venv on that module: 'scaletrain env create "
                f"--cluster {profile.name} --with tensorflow DIR'")
    known = {*PACKAGES.values(), *profile.wheels.values()}
    extra = [n for n in names if n in known]
    other = [n for n in names if n not in known and n not in ("scaletrain", "torch")]
    with_ = f"--with {','.join(extra)} " if extra else ""
    also = f", install what provides {', '.join(other)} into it," if other else ""
    return (f"on this login node run 'scaletrain env create --cluster {profile.name} {with_}DIR'{also} and submit "
            "with --venv DIR (or submit from an environment that has them)")


def probe_script(plan: Plan) -> str:
    """The bash the check runs: the job's set-up (without --setup lines and MPS), then the probe."""
    sw = plan.software
    lines = ["set -eo pipefail", *sw.setup, "set -u"]
    prefix = sw.container_here   # node-local binds exist on the nodes only
    if prefix:
        runtime = prefix.split()[0]
        lines.append(f"command -v {shlex.quote(runtime)} >/dev/null 2>&1 || exit {_NO_RUNTIME_EXIT}")
    lines.append(f"{prefix}{sw.python} -c {shlex.quote(_PROBE)} {' '.join(needed_imports(plan))}")
    return "\n".join(lines) + "\n"


def _run(script: str, environ: Mapping[str, str], cwd: str | None,
         timeout: float) -> tuple[int | None, str]:
    """(exit status or None on timeout, output tail), within ``timeout`` whatever the set-up starts.

    The output is read with a deadline, and only while bash runs: a helper the set-up started in
    a session of its own (``setsid``, a daemon) may hold the pipe open for ever, and waiting for
    its end of file would outlast any bound. When bash ends, what it printed is read and the rest
    of its process group ended; past the deadline, the whole group is ended and the message says
    which limit did it.
    """
    try:
        proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(environ),
                                cwd=cwd if cwd and os.path.isdir(cwd) else None, start_new_session=True)
    except OSError as exc:
        return None, f"cannot run bash: {exc.strerror or exc}"
    assert proc.stdout is not None
    out = bytearray()
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, (f"no answer within {timeout:g} s (the pre-sbatch check's time limit; "
                                  "module loads on a busy login node take seconds, not minutes)")
                if sel.select(min(left, _POLL_S)) and not _read(fd, out):
                    sel.unregister(fd)   # end of file: every holder closed it; wait for bash alone
                    try:
                        proc.wait(max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        continue         # the deadline check above ends it
            _read(fd, out)               # what bash printed before it ended (a helper's pipe is not waited on)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # what the set-up left running in bash's group
        except OSError:
            pass
        proc.stdout.close()
        if proc.poll() is None:
            proc.wait()          # SIGKILLed: reaped at once
    return proc.returncode, bytes(out[-_OUTPUT_LIMIT:]).decode("utf-8", "replace")


def _read(fd: int, out: bytearray) -> bool:
    """Append what ``fd`` holds now (non-blocking) to ``out``, keeping the tail; False at end of file."""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        out += chunk
        del out[:-_OUTPUT_LIMIT]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("scaletrain-missing:")]
    return lines[-1][:300] if lines else "no output"


def check_job_python(plan: Plan, *, environ: Mapping[str, str] | None = None, cwd: str | None = None,
                     timeout: float = CHECK_TIMEOUT_S) -> str | None:
    """Refuse (``DistEnvError``) a job whose Python would not import what it needs; a warning
    when that cannot be asked on this machine; None when it would."""
    names = needed_imports(plan)
    request, profile, image = plan.settled.request, plan.settled.profile, plan.settled.image
    if not names or profile.scheduler != "slurm":
        return None
    check_env_folder(request.venv, request.conda)
    if plan.software.builds_venv:
        # the job builds a venv from the centre's wheels on the node: what it installs, nothing else
        has = set(plan.software.wheels.split())
        lacking = tuple(n for n in names if n not in has)
        if lacking:
            raise DistEnvError(f"the job would stop at its first line: the venv it builds from {profile.name}'s "
                               f"wheels has only {', '.join(sorted(has))}, no {', '.join(lacking)}",
                               _fix(plan, lacking))
        return None
    arch = this_arch()
    if profile.cpu_arch and arch and arch != profile.cpu_arch:
        return (f"not checked here whether the job's Python has {', '.join(names)}: this login node is {arch}, "
                f"{profile.name}'s GPU nodes are {profile.cpu_arch}")
    env = os.environ if environ is None else environ
    code, out = _run(probe_script(plan), env, cwd, timeout)
    if code == 0:
        return None
    where = f"inside {image}" if image else "after the job's set-up"
    if code == _MISSING_EXIT:
        found = next((ln for ln in out.splitlines() if ln.startswith("scaletrain-missing:")), "")
        missing = tuple(n for n in found.partition(":")[2].split(",") if n) or names
        what = f"{plan.software.python} {where} cannot import {', '.join(missing)}"
        fix = _fix(plan, missing)
        if request.setup:   # not run here; an environment they would make can be made now
            fix += "; your --setup lines are not run here: make that environment before submitting"
        raise DistEnvError(f"the job would stop at its first line: {what}", fix)
    if code == _NO_RUNTIME_EXIT or image:
        why = "the container runtime is not on PATH here" if code == _NO_RUNTIME_EXIT else _last_line(out)
        return f"not checked whether the image {image} has {', '.join(names)} ({why})"
    if code is None:
        return f"not checked whether the job's Python has {', '.join(names)}: the set-up gave {out}"
    if request.setup:
        return f"the job's set-up failed here ({_last_line(out)}); your --setup lines were not run here"
    raise DistEnvError(f"the job would stop at its first line: its set-up fails on this login node "
                       f"(exit {code}: {_last_line(out)})",
                       "check the module names (--module) and --venv/--conda; 'scaletrain plan' shows the "
                       "set-up lines")
