"""Destroying a gloo group never waits for ever on a tensor torch's threads still hold.

A gloo worker thread drops a finished work only after marking it complete; when the work holds
a tensor whose Python object the program has already let go (the buffers inside
``broadcast_object_list``, a temporary), that drop takes the GIL. ``destroy_process_group()``
joins the worker in ~ProcessGroupGloo while holding the GIL: on torch 2.6 the two wait for each
other for ever (seen in the range's unit tier, after the pipeline probe's broadcast). So:

- every collective scaletrain issues returns only once torch's threads let go of its tensors
  (runtime/collectives.py), so a program may destroy its group with torch's own call right
  after the pipeline probe (or any of them);
- every group scaletrain or a test fixture destroys goes through one guard
  (``settle.destroy_group``), which also covers a program's own collectives.

Each check runs many rounds in a child, which a hang ends with its stacks (faulthandler), so a
deadlock fails the test instead of stopping pytest.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest
import torch

from workers import REPO, worker_env

ROUNDS = 150      # a round takes ~50 ms; torch 2.6 deadlocked within the first ~40 (see below)
HANG_S = 60.0     # no round takes near this: past it the child is stuck, and ends with its stacks

_CHILD = textwrap.dedent("""
    import faulthandler, sys, tempfile
    faulthandler.dump_traceback_later({hang}, exit=True)   # a deadlock: stacks, then exit 1
    import torch, torch.distributed as dist
    from scaletrain.parallel import pipeline_probe
    from scaletrain.runtime import settle

    pipeline_probe.probe_schedule = {{"1f1b": None}}.get  # the probe's verdict, without its children
    folder = tempfile.mkdtemp()
    for i in range({rounds}):
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{{folder}}/pg{{i}}")
        if sys.argv[1] == "probe":   # a program: the pipeline probe, then torch's own destroy
            assert pipeline_probe.choose_schedule("1f1b", "gloo") == "1f1b"
            dist.destroy_process_group()
        else:                        # a fixture: torch's collective on a temporary, our destroy
            dist.all_reduce(torch.ones(3))
            settle.destroy_group()
    print("rounds", {rounds})
""")


def _rounds(kind: str) -> subprocess.CompletedProcess:
    code = _CHILD.format(hang=HANG_S, rounds=ROUNDS)
    try:
        return subprocess.run([sys.executable, "-c", code, kind], env=worker_env(),
                              capture_output=True, text=True, timeout=HANG_S + 240)
    except subprocess.TimeoutExpired as exc:  # not even faulthandler could end it
        pytest.fail(f"{kind}: the child did not end within {HANG_S + 240:.0f} s: "
                    f"{(exc.stderr or b'')[-2000:]!r}")


@pytest.mark.parametrize("kind", ["probe", "fixture"])
def test_a_group_is_destroyed_right_after_a_collective_round_after_round(kind):
    proc = _rounds(kind)
    assert proc.returncode == 0 and f"rounds {ROUNDS}" in proc.stdout, (
        f"{kind}: exit {proc.returncode} (a deadlock in destroy_process_group ends as exit 1 "
        f"with every thread's stack):\n{proc.stderr[-4000:]}")


def test_our_collectives_return_with_their_tensors_let_go(tmp_path):
    import torch.distributed as dist

    from scaletrain.runtime import collectives
    from scaletrain.runtime.settle import destroy_group

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path}/pg")
    try:
        t = torch.arange(4.0)
        alone = t._use_count()
        for _ in range(50):  # each returns only once gloo's thread dropped its work
            collectives.all_reduce(t)
            assert t._use_count() == alone
        assert collectives.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
        assert collectives.all_gather_objects(("x", 3)) == [("x", 3)]
        assert collectives.gather_objects(b"\x00" * 1000) == [b"\x00" * 1000]
    finally:
        destroy_group()


# Where scaletrain calls torch's collectives itself, and why each may: a buffer that lives on
# (the stop agreement reuses one; the benchmarks' timed calls hand theirs to settle.let_go after
# the timing), or a tensor DDP holds (the comm hook's bucket). Everything else goes through
# runtime/collectives.py.
ALLOWED = {
    "runtime/collectives.py": {"all_reduce", "broadcast", "all_gather", "gather"},
    "runtime/agreement.py": {"all_reduce"},
    "observe/commwait.py": {"all_reduce"},
    "bench/comm.py": {"all_reduce", "all_gather", "broadcast"},  # in make_call's timed calls
    "observe/doctor.py": {"all_reduce"},                          # the timed loop
}
COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "gather", "scatter", "reduce",
               "broadcast_object_list", "all_gather_object", "gather_object",
               "scatter_object_list", "all_to_all", "reduce_scatter", "send", "recv"}


def _calls(tree: ast.AST, names: set[str], owner: str) -> list[tuple[str, int]]:
    """``owner.name(...)`` calls in ``tree`` for each name of ``names``."""
    return [(node.func.attr, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in names and isinstance(node.func.value, ast.Name)
            and node.func.value.id == owner]


def test_every_collective_of_scaletrain_goes_through_its_collectives():
    src = REPO / "src" / "scaletrain"
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        for name, line in _calls(ast.parse(path.read_text()), COLLECTIVES, "dist"):
            if name not in ALLOWED.get(rel, set()):
                found.append(f"{rel}:{line}: dist.{name} (call runtime/collectives.py instead)")
        for _, line in _calls(ast.parse(path.read_text()), {"destroy_process_group"}, "dist"):
            found.append(f"{rel}:{line}: dist.destroy_process_group (use settle.destroy_group)")
    assert not found, "\n".join(found)


def test_every_group_a_test_destroys_goes_through_the_guard():
    """A test's own process group is destroyed by settle.destroy_group, never by torch's call
    (the programs the multi-process tests launch are users' programs: they call torch's)."""
    tests = REPO / "tests"
    found = []
    for path in sorted([tests / "conftest.py", *(tests / "unit").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        for _, line in _calls(tree, {"destroy_process_group"}, "dist"):
            found.append(f"{path.relative_to(REPO)}:{line}")
    assert not found, "destroy it with scaletrain.runtime.settle.destroy_group():\n" + \
        "\n".join(found)
