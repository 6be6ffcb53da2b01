"""Hostile Slurm for probe/check and the one wait loop; pipes in a checkpoint folder (issue 29
items 7-9, issue 31's one wait loop): one line and the right exit code, never a hang."""

from __future__ import annotations

import os
import threading

import pytest
from helpers import run_cli

from scaletrain.errors import SlurmError, UsageError
from scaletrain.slurm import commands
from scaletrain.slurm.poll import poll_until

NODE = "NodeName=g1 CPUTot=32 RealMemory=64000 Gres=gpu:v100:4 Partitions=gpu\n"


def _scontrol(tmp_path, monkeypatch, partitions: bytes, nodes: bytes = NODE.encode()) -> None:
    (tmp_path / "nodes").write_bytes(nodes)
    (tmp_path / "parts").write_bytes(partitions)
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\ncase "$*" in *node*) cat {tmp_path}/nodes;; *partition*) cat {tmp_path}/parts;; '
                      '*config*) echo "ClusterName = puhti";; esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


@pytest.mark.parametrize("verb", [("clusters", "probe"), ("clusters", "check", "roihu")])
def test_probe_and_check_on_a_max_time_that_is_a_command(tmp_path, monkeypatch, capsys, verb):
    _scontrol(tmp_path, monkeypatch, b"PartitionName=gpu$(id) MaxTime=$(reboot) MaxNodes=4 Default=YES\n")
    code, out, err = run_cli(capsys, *verb)
    assert code == 4 and err.count("\n") == 2 and "MaxTime='$(reboot)'" in err
    assert "show partition 'gpu$(id)'" in err                  # the hint to paste is quoted


@pytest.mark.parametrize("verb", [("clusters", "probe"), ("clusters", "check", "roihu")])
def test_probe_and_check_on_bytes_that_are_not_utf8(tmp_path, monkeypatch, capsys, verb):
    _scontrol(tmp_path, monkeypatch, b"PartitionName=gpu\xff\x1b[2J MaxTime=1-00:00:00 Default=YES\n",
              nodes=NODE.replace("g1", "g1\xfe").encode("latin-1"))
    code, out, err = run_cli(capsys, *verb)
    assert code in (0, 1, 2) and "Traceback" not in err and "\x1b" not in out + err


def test_slurm_text_is_decoded_and_escaped_at_the_one_place_that_runs_slurm():
    assert commands.decode(b"ok\xff\r\n\x1b[2Jx\ty") == "ok\ufffd\n\\x1b[2Jx\ty"


def test_the_wait_loop_retries_silence_then_gives_up_with_slurms_words():
    calls, notes, slept = [], [], []
    answers = iter([SlurmError("timed out"), SlurmError("timed out"), "RUNNING", "RUNNING", "COMPLETED"])

    def fetch() -> str:
        calls.append(1)
        value = next(answers)
        if isinstance(value, Exception):
            raise value
        return value

    waited = poll_until(fetch, lambda s: s == "COMPLETED", timeout=None, poll=1.0, max_poll=1.5,
                        on_note=notes.append, sleep=slept.append, clock=lambda: float(len(calls)))
    assert (waited.value, waited.done, len(calls)) == ("COMPLETED", True, 5)
    assert slept == [1.0, 1.2, 1.44, 1.5]                     # slows by 20 % a round, up to max_poll
    assert notes[0].startswith("Slurm did not answer (timed out); still waiting") and notes[1] == "Slurm answers again"

    def silent() -> str:
        raise SlurmError("Socket timed out")

    with pytest.raises(SlurmError, match="did not answer 3 times in a row.*Socket timed out"):
        poll_until(silent, bool, timeout=None, poll=0.5, patience=3, sleep=lambda s: None)


def test_the_wait_loop_ends_at_its_timeout_and_refuses_endless_ones():
    ticks = iter(range(100))
    waited = poll_until(lambda: "RUNNING", lambda s: False, timeout=3, poll=1.0,
                        sleep=lambda s: None, clock=lambda: float(next(ticks)))
    assert (waited.done, waited.value, waited.seconds) == (False, "RUNNING", 3.0)
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(UsageError, match="timeout must be a finite number"):
            poll_until(lambda: "", bool, timeout=bad, poll=1.0)
    with pytest.raises(UsageError, match="^poll must be a finite number above 0 \\(seconds\\), got '1'"):
        poll_until(lambda: "", bool, timeout=None, poll="1")   # type: ignore[arg-type]


def _returns_within(fn, seconds: float = 20.0):
    """Run ``fn`` in a thread: a read that blocks on a pipe fails the test instead of hanging it."""
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(result=_call(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on a pipe"
    return box["result"]


def _call(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects what came back
        return exc


def test_pipes_and_devices_in_a_checkpoint_folder_are_refused_not_waited_on(tmp_path):
    from scaletrain.checkpoint import marker, verified
    from scaletrain.fileio import read_bounded, read_json_object

    folder = tmp_path / "step-00000003"
    folder.mkdir()
    os.mkfifo(folder / "COMMIT.json")
    os.mkfifo(folder / "rank-00000.pt")
    (folder / "zero").symlink_to("/dev/zero")
    found = _returns_within(lambda: marker.load(folder))   # refused, not waited on: named as unreadable
    assert isinstance(found, marker.Unreadable) and "not a regular file" in found
    assert isinstance(_returns_within(lambda: verified.file_crc(folder / "rank-00000.pt")), OSError)
    assert isinstance(_returns_within(lambda: read_bounded(folder / "zero")), OSError)
    assert _returns_within(lambda: read_json_object(folder / "zero")) is None
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 64 + b"{}")
    assert isinstance(_returns_within(lambda: read_bounded(big, limit=16)), OSError)
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    assert read_json_object(nested) is None


def test_sbatch_bytes_that_are_not_utf8(tmp_path):
    script = tmp_path / "sbatch"
    script.write_bytes(b"#!/bin/sh\nprintf 'sbatch: warning: \\377\\033[2J odd\\n4242;ci\\n'\n")
    script.chmod(0o755)
    assert commands.sbatch_parsable("job.sh", env={"PATH": f"{tmp_path}:/usr/bin:/bin"}) == "4242"
    script.write_bytes(b"#!/bin/sh\nprintf 'sbatch: error: \\377\\033]0;owned\\007 refused\\n' >&2; exit 1\n")
    with pytest.raises(SlurmError) as info:
        commands.sbatch_parsable("job.sh", env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert info.value.message == "sbatch failed: sbatch: error: \ufffd\\x1b]0;owned\\x07 refused"
