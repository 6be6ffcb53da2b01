"""Never silently alone: did the workers of a run form one process group of all of them?

An Accelerate program on CPU without its CPU setting, a Lightning Trainer not told how many
processes there are, an example that skips ``init_process_group`` when it sees no GPU: each
worker then trains alone (world size 1), and the run exits 0 - N independent trainings, found
out after the GPU hours are spent. No launcher tells; ``scaletrain run`` does.

Launcher side: once the workers have finished, :func:`verdict` judges what they recorded
(:mod:`scaletrain.launch.inproc.group_record`, the worker side) and returns a warning, or None
when every worker joined one group of the run's size.
"""

from __future__ import annotations

from scaletrain.launch.inproc.group_record import FRAMEWORK_HINTS, Records

_GENERIC_HINT = ("the program may skip torch.distributed when it sees no GPU "
                 "(try 'scaletrain run --cpu' for a CPU smoke test), or call "
                 "init_process_group only under a launcher it recognises")
# Under --cpu the GPU checks already pass: suggesting --cpu again would send users in a circle.
_GENERIC_HINT_CPU = ("the program calls init_process_group only under a launcher it "
                     "recognises, or skips it on a path the CPU smoke test does not cover: look "
                     "for the condition around its init_process_group call")


# The program's files name no call that forms a group (group_record's exit record): it was
# written for one process, and every worker ran the whole training on its own.
_SINGLE_PROCESS_HINT = ("the program never calls init_process_group (nor scaletrain.init() or a "
                        "framework that forms a group): it is written for one process. Run it "
                        "with --nproc-per-node 1, or make it distributed first to train on {world} "
                        "processes together: scaletrain.init() and scaletrain.setup(model, "
                        "optimizer, strategy='ddp') (README, 'In a training script')")


def verdict(records: Records, *, expected_world: int, local_ranks: list[str],
            cpu: bool = False, crashed: bool = False) -> str | None:
    """The warning to print when this node's workers did not all join one group of
    ``expected_world`` processes; None when they did (or there is nothing to judge).

    ``cpu``: the run was ``--cpu`` (the hint does not suggest it again). ``crashed``: the
    workers failed; then only evidence that they trained alone (a smaller group, a framework
    that counted fewer processes, an optimizer step outside any group) speaks - a worker that
    crashed before it reached ``init_process_group`` is the failure report's business, not a
    lone worker.
    """
    if expected_world <= 1 or not local_ranks:
        return None
    alone_in = sorted({name for r in local_ranks
                       for name, n in records.framework_worlds.get(r, {}).items()
                       if n != expected_world})
    joined = [r for r in local_ranks if records.groups.get(r) == expected_world]
    if len(joined) == len(local_ranks) and not alone_in:
        return None
    never = [r for r in local_ranks if r not in records.groups]
    smaller = sorted({records.groups[r] for r in local_ranks if r in records.groups
                      and records.groups[r] != expected_world})
    stepped_alone = [r for r in never if r in records.stepped]
    if crashed and not (smaller or alone_in or stepped_alone):
        return None
    parts = []
    if never:
        steps = (f", {len(stepped_alone)} of them took optimizer steps"
                 if crashed and stepped_alone else "")
        parts.append(f"{len(never)} of {len(local_ranks)} never started torch.distributed{steps}")
    if smaller:
        sizes = ", ".join(str(s) for s in smaller)
        parts.append(f"some formed groups of size {sizes} instead of {expected_world}")
    for name in alone_in:
        counts = sorted({records.framework_worlds[r][name] for r in local_ranks
                         if name in records.framework_worlds.get(r, {})})
        parts.append(f"{name} trained with {', '.join(map(str, counts))} process(es) instead of "
                     f"{expected_world}")
    blamed = alone_in or sorted(records.frameworks)
    hints = [FRAMEWORK_HINTS[f] for f in blamed if f in FRAMEWORK_HINTS]
    if hints:
        hint = "; ".join(dict.fromkeys(hints))
    elif never and all(r in records.no_group_call for r in never):
        hint = _SINGLE_PROCESS_HINT.format(world=expected_world)
    else:
        hint = _GENERIC_HINT_CPU if cpu else _GENERIC_HINT
    then = " before they failed" if crashed else ""
    return (f"the {expected_world} workers did not form one process group{then} "
            f"({'; '.join(parts)}): each trained on its own, not together.\nHINT: {hint}")
