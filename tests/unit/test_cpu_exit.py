"""A ``--cpu`` program exits cleanly however its threads end: no SIGABRT at exit.

The cause, found with gdb on a core of the abort (torch 2.15.0+cu132, Python 3.11): a thread the
program started had entered the CPU mapping's TorchFunctionMode (launch/inproc/cpu_map.py), and
torch keeps a thread's modes in a C++ thread_local. Its destructor runs after the thread's
Python part has ended - ``join()`` may have returned - and takes the GIL to release the mode::

    #14 take_gil -> PyThread_exit_thread -> pthread_exit (the interpreter is finalizing)
    #16 pybind11::gil_scoped_acquire::gil_scoped_acquire()
    #17 torch::detail::ConcretePyInterpreterVTable::decref(_object*)
    #18 std::_Sp_counted_ptr_inplace<c10::SafePyObject, ...>::_M_dispose()
    #19 at::impl::PythonTorchFunctionTLS::~PythonTorchFunctionTLS()
    #20 __call_tls_dtors -> start_thread

while the main thread was in Py_FinalizeEx. CPython ends a thread that asks for the GIL then
with pthread_exit, whose unwinding meets the noexcept destructor: std::terminate, "terminate
called without an active exception". Only sometimes: the destructor checks Py_IsInitialized()
first, so the main thread must start finalizing between that check and the GIL - a loaded
machine deschedules the ending thread there, or the main thread keeps the GIL into
finalization. Now the mapping leaves the mode before the thread ends, under the GIL.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from workers import REPO, worker_env

ABORT = "terminate called"

# The thread's C++ destructors held (as a loaded machine holds them by chance) until the main
# thread, in its last atexit call, keeps the GIL into finalization: before the fix, the mode's
# destructor then asked for the GIL and the process aborted, every time. glibc only: its
# __cxa_thread_atexit_impl queues the hold before torch's destructor, a POSIX semaphore ends it.
_HELD = textwrap.dedent("""
    import atexit, ctypes, os, random, threading
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    libc, with_gil = ctypes.CDLL(None), ctypes.PyDLL(None)
    hold = (ctypes.c_long * 8)()   # a sem_t
    assert libc.sem_init(ctypes.byref(hold), 0, 0) == 0
    keys = list(range(2_000_000))
    random.Random(0).shuffle(keys)
    atexit.register(sorted, keys)   # first registered, last run: C work under the GIL
    atexit.register(with_gil.sem_post, ctypes.byref(hold))   # the thread's destructors go on
    import torch
    from scaletrain.launch.inproc import cpu_smoke
    cpu_smoke.patch_torch(torch)

    def work():
        print(torch.ones(2, device="cuda").device)
        queue = libc.__cxa_thread_atexit_impl
        queue.argtypes = [ctypes.c_void_p] * 3
        sem_wait = ctypes.cast(libc.sem_wait, ctypes.c_void_p)
        queue(sem_wait, ctypes.addressof(hold), sem_wait)

    t = threading.Thread(target=work)
    t.start()
    t.join()
""")

# A program under --cpu whose helper threads (pin-memory threads, prefetchers) end as it exits,
# and whose last atexit call is C work: torch's mode destructors of those threads met the
# interpreter's finalization in most runs before the fix (10 of 10 alone, 8 of 10 beside a hog).
_EXIT_PROBE = textwrap.dedent("""
    import atexit, os, random, threading, time
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    keys = list(range(1_000_000))
    random.Random(0).shuffle(keys)
    atexit.register(sorted, keys)
    import torch
    from scaletrain.launch.inproc import cpu_smoke
    cpu_smoke.patch_torch(torch)
    gate, ready = threading.Event(), threading.Semaphore(0)

    def work():
        torch.ones(2, device="cuda").add_(1)
        ready.release()
        gate.wait()
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:   # the threads end one after another
            pass

    def release():   # the program's last Python: its threads end now
        gate.set()
        time.sleep(0.002)

    atexit.register(release)
    for _ in range(16):
        threading.Thread(target=work, daemon=True).start()
    for _ in range(16):
        ready.acquire()   # each past its torch call: at exit they run Python only
""")
RUNS = 8


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=worker_env(), capture_output=True,
                          text=True, timeout=300)


def test_a_thread_leaves_nothing_for_its_destructors_to_release_at_exit():
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.__cxa_thread_atexit_impl, libc.sem_init, libc.sem_wait  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("needs glibc (__cxa_thread_atexit_impl and POSIX semaphores)")
    proc = _run(_HELD)
    assert proc.returncode == 0 and ABORT not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip() == "cpu"


def _newest() -> str:
    text = (REPO / "constraints" / "torch-newest.txt").read_text()
    match = re.search(r"^torch==(\S+)", text, re.M)
    assert match, "constraints/torch-newest.txt pins no torch"
    return match.group(1)


def test_the_exit_probe_ends_cleanly_run_after_run_beside_a_cpu_hog():
    newest = _newest()
    if torch.__version__.split("+")[0] != newest:
        pytest.skip(f"runs on torch {newest}, the newest of the range (constraints/"
                    f"torch-newest.txt), in scripts/test_torch_range.sh's unit tier; this is "
                    f"torch {torch.__version__}")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results = [_run(_EXIT_PROBE) for _ in range(RUNS)]
    finally:
        hog.kill()
        hog.wait()
    failed = [(p.returncode, p.stderr[-300:]) for p in results
              if p.returncode != 0 or ABORT in p.stderr]
    assert not failed, f"{len(failed)} of {RUNS} runs ended badly: {failed}"
