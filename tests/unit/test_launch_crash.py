"""The Python stack a fatal signal leaves in a rank's stack file (scaletrain.launch.crash)."""

from __future__ import annotations

from scaletrain.launch import crash, rundir
from scaletrain.launch.failure import collect_failures, render_tail, worker_failed_error

MAIN = 0x00007F0000000001
DUMP = f"""Fatal Python error: Aborted

Thread 0x00007f00000000aa (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x{MAIN:016x} (most recent call first):
  File "/home/u/train.py", line 40 in step
  File "/home/u/train.py", line 77 in main
  File "/home/u/train.py", line 90 in <module>
  File "<frozen runpy>", line 88 in _run_code

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_the_crashing_threads_frames_innermost_first_without_runpy():
    error, thread, frames = crash.parse(DUMP, MAIN)
    assert error == "Aborted"
    assert thread == "the thread that crashed"
    assert frames == ('File "/home/u/train.py", line 40 in step',
                      'File "/home/u/train.py", line 77 in main',
                      'File "/home/u/train.py", line 90 in <module>')


def test_a_crash_in_a_thread_without_python_shows_the_main_thread():
    text = f"""Fatal Python error: Segmentation fault

Thread 0x{MAIN:016x} (most recent call first):
  File "/home/u/train.py", line 12 in all_reduce_step
  File "/home/u/train.py", line 30 in <module>

Current thread 0x00007f00000000bb (most recent call first):
  <no Python frame>
"""
    error, thread, frames = crash.parse(text, MAIN)
    assert error == "Segmentation fault"
    assert thread.startswith("the main thread")
    assert frames[0].endswith("in all_reduce_step")


def test_the_last_of_several_dumps_and_no_dump():
    older = DUMP.replace("line 40 in step", "line 1 in old_attempt")
    assert crash.parse(older + "\n" + DUMP, MAIN)[2][0].endswith("line 40 in step")
    assert crash.parse("Thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f\n") is None
    assert crash.parse("") is None


def test_frames_are_capped():
    body = "".join(f'  File "/u/r.py", line {i} in f{i}\n' for i in range(30))
    frames = crash.parse(f"Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n{body}")[2]
    assert len(frames) == crash.FRAMES_SHOWN and frames[0].endswith("in f0")


def test_read_from_the_run_folder_and_rendered_under_the_stderr(tmp_path):
    path = rundir.stack_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(DUMP)
    rundir.write_rank_info(tmp_path, rundir.RankInfo(rank=3, host="h", pid=9, thread=MAIN))
    found = crash.crash_stack(tmp_path, 3)
    assert found is not None and found.path == str(path)
    assert crash.crash_stack(tmp_path, 2) is None  # no file

    class Failure:
        local_rank, pid, exitcode = 3, 9, -6

    [item] = collect_failures({3: Failure()}, {}, crashes={3: found})
    text = render_tail(item)
    assert "rank 3 crashed in native code (Aborted)" in text
    assert "  | File \"/home/u/train.py\", line 40 in step" in text
    assert f"the whole dump: {path}" in text
    err = worker_failed_error([item])
    assert "SIGABRT" in err.args[0] and "native code" in err.hint


def test_a_dump_is_not_shown_for_a_rank_the_agent_stopped(tmp_path):
    found = crash.CrashStack("Aborted", "the thread that crashed", ("File \"a.py\", line 1 in f",), "p")

    class Stopped:
        local_rank, pid, exitcode = 0, 1, -15  # SIGTERM from the agent; the dump is older

    [stopped] = collect_failures({0: Stopped()}, {}, crashes={0: found})
    assert stopped.crash is None
    assert "crashed in native code" not in render_tail(stopped)
    assert "native code" not in worker_failed_error([stopped]).hint
