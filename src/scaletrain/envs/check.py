"""Will the job start? Asked on the login node, before ``sbatch``.

A job whose Python lacks scaletrain (or the launcher's package, or what the program imports)
waits in the queue, starts and stops at its first line. ``submit`` asks first, in this order:

1. the program: it is read here (``scaletrain.envs.imports``); one that cannot be read as Python
   (no such file, unreadable, a syntax error: a shell script given as the program) is refused
   (``UsageError``), since the job's ``python`` would stop on it too;
2. the ``--venv`` folder, or a ``--conda`` path: one that does not exist here or is not a finished
   environment is refused without running anything (on a login node whose CPU differs from the
   GPU nodes' too);
3. the job's own set-up lines (the plan's ``Software``: the profile's modules, ``--module``,
   ``--venv``/``--conda``, the running environment; the MPS daemon is left out), then the user's
   ``--setup`` lines, in a fresh ``bash`` with the environment sbatch will hand the job, then the
   job's Python, which reports which of the names it cannot find. The names: scaletrain (when the
   launch imports it), the launcher's package (``scaletrain.plan.software.LAUNCHER_PACKAGES``),
   the program's needed imports (refused when missing) and its optional ones (named in one note).

The ``--setup`` lines run here under ``set -u``, so that a variable only the job has (``$SLURM_TMPDIR``)
stops the line instead of expanding to nothing. A job whose set-up or ``--setup`` line fails is
refused with its exit status and last line: the job runs them under ``set -e`` and would stop
there. What cannot be judged on this machine is said, not refused: a command it does not have
(exit 127, ``module: command not found`` off the cluster), a ``--setup`` line that reads a
variable only the job has, a container runtime absent here or an image that does not start,
nodes of another CPU architecture, the bound of ``CHECK_TIMEOUT_S``. A job that builds its venv
from the centre's wheels (the Alliance profiles) is judged without running anything: that venv
holds what the profile's wheels for the launcher name (torch, or tensorflow).

``check_job_python`` returns a ``CheckResult`` (checked, or not checked here and why, and its
notes) or raises the refusal with the fix. ``submit --no-check`` / ``submit(check=False)`` skip
it; ``skipped`` says what that leaves unasked.
"""

from __future__ import annotations

import os
import platform
import selectors
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from scaletrain.errors import DistEnvError, UsageError

if TYPE_CHECKING:
    from scaletrain.envs.imports import ProgramImports
    from scaletrain.plan.records import Plan

CHECK_TIMEOUT_S = 120.0       # module loads on a busy login node take seconds, not minutes
SKIP_HINT = "--no-check (scaletrain.submit(check=False))"   # the way past the check, in every hint
_MISSING_EXIT = 96            # the probe's "these are missing" (any other failure is the set-up's)
_NO_RUNTIME_EXIT = 97         # the container runtime is not on this node
_NOT_FOUND_EXIT = 127         # bash: a command this machine does not have
_OUTPUT_LIMIT = 64 * 1024     # what is kept of the probe's output for the message
_POLL_S = 0.1                 # how often the check looks whether bash ended while a helper holds its output
_MARK = "scaletrain-check:"   # the probe's own lines: the stage reached, the names missing
# importable names the launch itself needs, besides scaletrain (scaletrain.plan.launchers): torchrun
# and scaletrain run are torch's agent, scaletrain.init() imports torch. TensorFlow's launch line
# needs scaletrain alone (the program's own imports are the program's).
_LAUNCH_IMPORTS = {"scaletrain": ("torch",), "scaletrain-run": ("torch",), "torchrun": ("torch",)}
# The probe: import scaletrain for real (cheap: no torch), only look the others up (importing
# torch or deepspeed on a login node takes seconds and starts threads). Its arguments: the needed
# names, "--", the optional ones.
_PROBE = ("import importlib.util, sys\n"
          "i = sys.argv.index('--')\n"
          "def lacking(names):\n"
          "    return [n for n in names if importlib.util.find_spec(n) is None]\n"
          "missing, optional = lacking(sys.argv[1:i]), lacking(sys.argv[i + 1:])\n"
          "if 'scaletrain' in sys.argv[1:i] and 'scaletrain' not in missing:\n"
          "    try:\n"
          "        import scaletrain\n"
          "    except Exception as exc:\n"
          "        missing.append('scaletrain (' + type(exc).__name__ + ')')\n"
          f"print('{_MARK}missing:' + ','.join(missing))\n"
          f"print('{_MARK}optional:' + ','.join(optional))\n"
          f"sys.exit({_MISSING_EXIT} if missing else 0)\n")


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """What the check before sbatch found; a job it refuses raises instead."""

    checked: tuple[str, ...] = ()    # what the job's Python was found to import here
    not_checked: str | None = None   # why the job's Python could not be asked here ("not checked here: ...")
    notes: tuple[str, ...] = ()      # said, never refused: optional imports it lacks, what was not read

    @property
    def line(self) -> str:
        """The outcome in one line, as a dry run prints it."""
        if self.not_checked:
            return self.not_checked
        if self.checked:
            return f"checked here: the job's Python imports {', '.join(self.checked)} (after its set-up)"
        return "checked here: the program reads as Python; nothing is asked of the job's Python"


def this_arch(machine: str | None = None) -> str:
    """``platform.machine()`` in the profiles' words (arm64 is aarch64, AMD64 is x86_64)."""
    m = (platform.machine() if machine is None else machine).lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(m, m)


def needed_imports(plan: Plan) -> tuple[str, ...]:
    """What the job's Python must import: scaletrain (when the launch imports it), the launcher's
    package and what the program imports whatever happens (``JobRequest.program_imports``)."""
    from scaletrain.plan.software import LAUNCHER_PACKAGES

    launcher = plan.settled.request.launcher
    names = ["scaletrain"] if plan.software.check_scaletrain else []
    names += _LAUNCH_IMPORTS.get(launcher, ())
    if launcher in LAUNCHER_PACKAGES:
        names.append(LAUNCHER_PACKAGES[launcher])
    names += plan.settled.request.program_imports or ()
    return tuple(dict.fromkeys(names))


def skipped(plan: Plan) -> str:
    """What ``--no-check`` leaves unasked, in one line."""
    names = needed_imports(plan)
    imports = f" and whether its Python imports {', '.join(names)}" if names else ""
    return (f"not checked (skipped on request): whether the program reads as Python, whether the job's "
            f"set-up and --setup lines run{imports}")


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


def check_program(program: ProgramImports) -> None:
    """``UsageError`` for a program that cannot be read here as Python: the job would stop on it."""
    if program.unread:
        raise UsageError(f"the job would stop at its first line: {program.unread}",
                         "give the Python file the job runs (it runs 'python -u PROGRAM' in the folder you "
                         f"submit from); if only this machine cannot read it, pass {SKIP_HINT}")


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


def probe_script(plan: Plan, optional: tuple[str, ...] = (), *, user_setup: bool = True) -> str:
    """The bash the check runs: the job's set-up (without MPS), the user's ``--setup`` lines under
    ``set -u`` (``user_setup``), then the probe; a line before each stage names it in the output."""
    sw = plan.software
    lines = ["set -eo pipefail", f"echo {_MARK}stage:set-up", *sw.setup, "set -u"]
    if user_setup and plan.settled.request.setup:
        lines += [f"echo {_MARK}stage:--setup", *plan.settled.request.setup]
    lines.append(f"echo {_MARK}stage:probe")
    prefix = sw.container_here   # node-local binds exist on the nodes only
    if prefix:
        runtime = prefix.split()[0]
        lines.append(f"command -v {shlex.quote(runtime)} >/dev/null 2>&1 || exit {_NO_RUNTIME_EXIT}")
    names = " ".join(shlex.quote(n) for n in (*needed_imports(plan), "--", *optional))
    lines.append(f"{prefix}{sw.python} -c {shlex.quote(_PROBE)} {names}")
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
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(_MARK)]
    return lines[-1][:300] if lines else "no output"


def _said(out: str, what: str) -> str | None:
    """The probe's last ``scaletrain-check:WHAT:`` value, or None when it never said it."""
    found = [ln.partition(f"{_MARK}{what}:")[2] for ln in out.splitlines() if ln.startswith(f"{_MARK}{what}:")]
    return found[-1].strip() if found else None


def _whether(asked: str) -> str:
    return "whether the job's set-up runs" + (f" and its Python has {asked}" if asked else "")


def _optional_note(lacking: tuple[str, ...], where: str) -> tuple[str, ...]:
    if not lacking:
        return ()
    return (f"the program imports {', '.join(lacking)} only on some paths (inside a function, a branch, or a try "
            f"that catches ImportError), and the job's Python {where} has none of them: fine unless the run "
            "takes such a path (install them into the job's environment if it does)",)


def check_job_python(plan: Plan, *, program: ProgramImports | None = None, environ: Mapping[str, str] | None = None,
                     cwd: str | None = None, timeout: float = CHECK_TIMEOUT_S) -> CheckResult:
    """Refuse a job that would stop at its first line (``UsageError`` for a program that cannot
    be read, ``DistEnvError`` for its environment), with the fix; else what was found.

    ``program``: the program as read here (:func:`scaletrain.envs.imports.program_imports`; None:
    not read, only the plan's names are asked). ``environ``: sbatch's environment (default this
    process's); ``cwd``: the folder the job starts in.
    """
    if program is not None:
        check_program(program)
    read_note = (program.note,) if program and program.note else ()
    names = needed_imports(plan)
    optional = tuple(n for n in program.optional if n not in names) if program else ()
    request, profile, image = plan.settled.request, plan.settled.profile, plan.settled.image
    if profile.scheduler != "slurm":
        return CheckResult(notes=read_note)
    check_env_folder(request.venv, request.conda)
    if plan.software.builds_venv:
        # the job builds a venv from the centre's wheels on the node: what it installs, nothing else
        has = set(plan.software.wheels.split())
        lacking = tuple(n for n in names if n not in has)
        if lacking:
            raise DistEnvError(f"the job would stop at its first line: the venv it builds from {profile.name}'s "
                               f"wheels has only {', '.join(sorted(has))}, no {', '.join(lacking)}",
                               _fix(plan, lacking))
        where = f"(the venv it builds from {profile.name}'s wheels)"
        return CheckResult(checked=names, notes=(*read_note, *_optional_note(
            tuple(n for n in optional if n not in has), where)))
    arch = this_arch()
    asked = ", ".join((*names, *optional))
    if profile.cpu_arch and arch and arch != profile.cpu_arch:
        return CheckResult(not_checked=f"not checked here: {_whether(asked)}: this login node is {arch}, "
                                       f"{profile.name}'s GPU nodes are {profile.cpu_arch}", notes=read_note)
    env = os.environ if environ is None else environ
    code, out = _run(probe_script(plan, optional), env, cwd, timeout)
    notes: tuple[str, ...] = read_note
    unrun = _said(out, "stage") == "--setup" and "unbound variable" in _last_line(out)
    if unrun:   # a --setup line reads a variable only the job has (run under set -u here): ask without them
        notes += (f"your --setup lines were not run here: a line reads a variable this machine does not set "
                  f"({_last_line(out)})",)
        code, out = _run(probe_script(plan, optional, user_setup=False), env, cwd, timeout)
    return _judge(plan, code, out, asked=asked, notes=notes, setup_unrun=unrun)


def _judge(plan: Plan, code: int | None, out: str, *, asked: str, notes: tuple[str, ...],
           setup_unrun: bool) -> CheckResult:
    """The probe's exit status and output, in words: checked, not checked here, or refused."""
    names, image, profile = needed_imports(plan), plan.settled.image, plan.settled.profile
    stage, last = _said(out, "stage"), _last_line(out)
    where = f"inside {image}" if image else "after the job's set-up"
    if code == 0:
        lacking = tuple(n for n in (_said(out, "optional") or "").split(",") if n)
        return CheckResult(checked=names, notes=(*notes, *_optional_note(lacking, where)))
    if code is None:
        return CheckResult(not_checked=f"not checked here: {_whether(asked)}: {out}", notes=notes)
    if code == _NOT_FOUND_EXIT:   # off the cluster: 'module: command not found' cannot run here, not fail
        what = {"--setup": "a command of your --setup lines is", "probe": "the job's Python is"}.get(
            stage or "", "a command of the job's set-up is")
        return CheckResult(not_checked=f"not checked here: {what} not on this machine (exit {code}: {last}); "
                                       f"on a {profile.name} login node it is", notes=notes)
    if code == _MISSING_EXIT and stage == "probe":
        missing = tuple(n for n in (_said(out, "missing") or "").split(",") if n) or names
        fix = _fix(plan, missing)
        if setup_unrun:
            fix += ("; your --setup lines were not run here: make that environment before submitting, "
                    f"or pass {SKIP_HINT}")
        raise DistEnvError(f"the job would stop at its first line: {plan.software.python} {where} cannot import "
                           f"{', '.join(missing)}", fix)
    if stage == "probe" and (code == _NO_RUNTIME_EXIT or image):
        why = "the container runtime is not on PATH here" if code == _NO_RUNTIME_EXIT else last
        has = f"has {asked}" if asked else "starts"
        return CheckResult(not_checked=f"not checked here: whether the image {image} {has} ({why})", notes=notes)
    if stage == "--setup":
        raise DistEnvError(f"the job would stop at its first line: a --setup line fails on this login node "
                           f"(exit {code}: {last})",
                           "the job runs --setup lines as written, under 'set -e', and would stop there: fix the "
                           f"line; if it fails only on this machine, pass {SKIP_HINT}")
    what = "its Python fails" if stage == "probe" else "its set-up fails"
    raise DistEnvError(f"the job would stop at its first line: {what} on this login node (exit {code}: {last})",
                       "check the module names (--module) and --venv/--conda; 'scaletrain plan' shows the "
                       "set-up lines")
