"""Shared fixtures. Hygiene fixtures fail any test that leaks state into the next one:
environment variables, a live process group, installed signal handlers, threads, or processes -
children, and grandchildren too: pytest is made a child subreaper (Linux), so a process orphaned
below a test (a worker's daemon that outlived `scaletrain run`) is reparented to pytest, not init,
and is seen here."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import NO_GPUS, alive as _alive, is_launcher_var

REPO = Path(__file__).resolve().parent.parent

# Variables that legitimately change under pytest itself, or that torch sets in os.environ on
# its own the first time an optimizer is built (inductor's cache folder) - not our code's doing.
_ENV_IGNORE = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


def _children(pid: int) -> set[int]:
    """Direct child processes of ``pid`` (Linux /proc), as a set of PIDs."""
    kids: set[int] = set()
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.exists():
        return kids
    for task in task_dir.iterdir():
        try:
            text = (task / "children").read_text()
        except OSError:
            continue
        kids.update(int(p) for p in text.split())
    return kids


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for kid in _children(todo.pop()) - found:
            found.add(kid)
            todo.append(kid)
    return found


def _reap_zombies(pids: set[int]) -> None:
    """Collect orphans that died after being reparented to pytest (our subreaper duty)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


try:  # PR_SET_CHILD_SUBREAPER: orphans below pytest come to pytest, where the fixture sees them
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
except (OSError, AttributeError):  # not Linux: direct children only
    pass


# Every signal a handler can be installed for (SIGKILL and SIGSTOP cannot have one).
_SIGNALS = sorted(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


def _handlers() -> dict[int, object]:
    """The Python-level handler of each signal now (getsignal reads, installs nothing)."""
    return {s: signal.getsignal(s) for s in _SIGNALS}


def _torchs_own(handler: object) -> bool:
    """A handler torch installs once per process on purpose (the DataLoader's SIGCHLD handler,
    set at the first multi-worker loader and never removed): not a test's leak."""
    return str(getattr(handler, "__module__", "") or "").startswith("torch.")


# Module-level state of scaletrain, registered by the module that defines it
# (scaletrain.module_state): after every test each is put back as it was. With leak=True a change is
# also a failure: the test left the runtime set up (an init() without shutdown(), stop handlers
# still counted). The others are caches a test may fill on purpose (the last set-up model, warnings
# given once, a decision taken at first use): reset only, so the next test starts from the same
# state whatever ran before it. Once-per-process facts (reset=False) are left alone.
def _registered() -> list[tuple[str, str, bool]]:
    from scaletrain import module_state

    return [(s.module, s.name, s.leak) for s in module_state.registered() if s.reset]


def _module_state() -> dict[tuple[str, str], tuple[object, object]]:
    """(module, attribute) -> (the object, a shallow copy of its contents) for loaded modules."""
    found: dict[tuple[str, str], tuple[object, object]] = {}
    for module, attr, _ in _registered():
        mod = sys.modules.get(module)
        if mod is not None and hasattr(mod, attr):
            value = getattr(mod, attr)
            contents = value.copy() if isinstance(value, (dict, set, list)) else None
            found[(module, attr)] = (value, contents)
    return found


def _differs(old_value: object, old_contents: object, value: object) -> bool:
    """Another object now, or the same container with other contents."""
    return value is not old_value or (old_contents is not None and value != old_contents)


def _changed_module_state(before: dict[tuple[str, str], tuple[object, object]]) -> bool:
    """True when a module attribute of ``before`` now holds another object or other contents."""
    after = _module_state()
    for key, (old_value, old_contents) in before.items():
        if key in after:
            value = after[key][0]
            if _differs(old_value, old_contents, value):
                return True
    return False


def _restore_module_state(before: dict[tuple[str, str], tuple[object, object]]) -> list[str]:
    """Put every module attribute back as ``before`` had it; the leaks among the changes."""
    leaks = []
    after = _module_state()
    for module, attr, leak in _registered():
        key = (module, attr)
        if key not in after:
            continue
        value, _ = after[key]
        if key not in before:  # the test imported the module: its state must be fresh
            old_value, old_contents = value, None
            changed = False
        else:
            old_value, old_contents = before[key]
            changed = _differs(old_value, old_contents, value)
        if not changed:
            continue
        if isinstance(old_value, (dict, set, list)) and old_contents is not None:
            old_value.clear()
            old_value.update(old_contents) if not isinstance(old_value, list) else old_value.extend(old_contents)
        setattr(sys.modules[module], attr, old_value)
        if leak:
            leaks.append(f"{module.removeprefix('scaletrain.')}.{attr}")
    return leaks


@pytest.fixture(autouse=True)
def _hygiene():
    env_before = {k: v for k, v in os.environ.items() if k not in _ENV_IGNORE}
    modules_before = _module_state()
    handlers_before = _handlers()
    threads_before = {t.ident for t in threading.enumerate()}
    kids_before = _descendants(os.getpid())
    yield
    problems: list[str] = []

    env_after = {k: v for k, v in os.environ.items() if k not in _ENV_IGNORE}
    if env_after != env_before:
        changed = sorted(k for k in env_before.keys() | env_after.keys()
                         if env_before.get(k) != env_after.get(k))
        os.environ.clear()
        os.environ.update(env_before)
        problems.append(f"environment variables leaked: {changed}")

    handlers_after = _handlers()
    changed_signals = [s for s in _SIGNALS if handlers_after[s] is not handlers_before[s]
                       and not _torchs_own(handlers_after[s])]
    if changed_signals:
        for s in changed_signals:  # put the previous handler back so the next test starts clean
            previous = handlers_before[s]
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        problems.append("signal handlers left installed: "
                        f"{[signal.Signals(s).name for s in changed_signals]}")

    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from scaletrain.runtime.settle import destroy_group

            destroy_group()
            problems.append("a torch.distributed process group was left initialised")

    deadline = time.monotonic() + 5.0
    while True:
        leaked_threads = [t for t in threading.enumerate()
                          if t.ident not in threads_before and t.is_alive() and not t.daemon]
        new = _descendants(os.getpid()) - kids_before
        _reap_zombies(new & _children(os.getpid()))
        leaked_kids = [p for p in new if _alive(p)]
        if not (leaked_threads or leaked_kids) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if leaked_threads:
        problems.append(f"threads leaked: {[t.name for t in leaked_threads]}")
    if leaked_kids:
        for pid in leaked_kids:  # stop what the test started, by PID
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        problems.append(f"child processes leaked: {leaked_kids}")

    if _changed_module_state(modules_before):
        # a Checkpointer that raised inside pytest.raises lives on in a cycle (the exception's
        # traceback holds the test's frame, which holds the exception) and releases its stop
        # listener only when collected: collect before judging
        import gc

        gc.collect()
    leaked_state = _restore_module_state(modules_before)
    if leaked_state:
        problems.append(f"module state left set: {leaked_state}")

    if problems:
        pytest.fail("hygiene: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def clean_env(monkeypatch):
    """Remove every launcher variable so detectors see a bare process; returns monkeypatch."""
    # also the GPU and thread choices a surrounding job would pass on
    extra = {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
             "OMP_NUM_THREADS"}
    for key in list(os.environ):
        if is_launcher_var(key) or key in extra:
            monkeypatch.delenv(key, raising=False)
    return monkeypatch


def pytest_report_header(config: pytest.Config) -> str:
    """Say at the start where the centre guides' jobs come from (ours always; the guides if present)."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    try:
        from lint_seed_blocks import GUIDES, OURS
    finally:
        sys.path.pop(0)
    also = (f"and the guides in {GUIDES}" if GUIDES.is_dir() else
            f"(the guides themselves are read too where present: {GUIDES} or $SCALETRAIN_TEST_SEEDS)")
    return f"centre guides' jobs: {OURS.relative_to(REPO)} {also}"


@pytest.fixture
def no_gpu(monkeypatch):
    """This test sees a machine without GPUs, as a CPU-only CI machine is: the variables of
    helpers.NO_GPUS for itself and its child processes, and torch.cuda answering "none" in
    this process (the variables alone do not hide a GPU from a process whose CUDA is already
    initialised, and initialising it under them would hide the GPU from the GPU tests that
    follow here). Returns monkeypatch."""
    import torch

    for name, value in NO_GPUS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    return monkeypatch
