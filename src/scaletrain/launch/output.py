"""Worker output: ``[rank N]`` prefixes, ``--ranks 0`` filtering, and each worker's stderr on disk.

All of it is torch's own machinery: the elastic agent "tees" each worker's stdout/stderr into
per-rank files and tails them to the console with a per-rank line prefix
(``log_line_prefix_template``); ``local_ranks_filter`` keeps a rank's lines in its file but
off the console. We only subclass ``DefaultLogsSpecs`` to remember where each local rank's
``stderr.log`` went, so that when a worker fails the launcher can show its last lines even
when its output was filtered from the console.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from typing import Any

from scaletrain.fileio import read_tail

PREFIX_TEMPLATE = "[rank ${rank}] "

# ``local_ranks_filter`` treats an empty set as "show all"; a set holding no real local rank
# hides every rank (used on nodes other than node 0 under ``--ranks 0``).
_HIDE_ALL: frozenset[int] = frozenset({-1})


def console_filter(ranks: str, node_rank: int) -> set[int] | None:
    """``local_ranks_filter`` for ``--ranks``: None shows every local rank."""
    if ranks == "all":
        return None
    # Global rank 0 is local rank 0 of node rank 0 under both of our rendezvous modes.
    return {0} if node_rank == 0 else set(_HIDE_ALL)


def shown_on_console(ranks: str, node_rank: int, local_rank: int) -> bool:
    """Whether the console showed the lines of ``local_rank`` of node ``node_rank``."""
    shown = console_filter(ranks, node_rank)
    return shown is None or local_rank in shown


def prefix_template(ranks: str) -> str:
    """Line prefix: ``[rank N] `` in both modes.

    With ``--ranks 0`` the prefix stays: torch's tailer has no "no prefix" setting (an empty
    template falls back to ``[default0]:``), and the rank tag tells filtered output apart.
    """
    del ranks
    return PREFIX_TEMPLATE


def make_logs_specs(log_dir: str, *, ranks: str, node_rank: int) -> Any:
    """A torch ``LogsSpecs`` that tees every worker's output and records its stderr path.

    The returned object has ``stderr_paths: dict[int, str]`` (local rank -> file) filled in
    when workers start (and refreshed on each restart attempt).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    class _RecordingLogsSpecs(DefaultLogsSpecs):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.stderr_paths: dict[int, str] = {}

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = super().reify(envs)
            self.stderr_paths = {r: p for r, p in dest.stderrs.items() if p}
            return dest

    return _RecordingLogsSpecs(log_dir=log_dir, tee=Std.ALL,
                               local_ranks_filter=console_filter(ranks, node_rank))


def tail_lines(path: str | None, count: int = 15, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``count`` lines of a text file (empty list if it is missing)."""
    if not path or not os.path.isfile(path):
        return []
    text = read_tail(path, max_bytes).decode("utf-8", errors="replace")
    return list(deque((line for line in text.splitlines() if line.strip()), maxlen=count))


def ensure_std_streams() -> None:
    """A launcher started with stdin, stdout or stderr closed (``>&-``) gets /dev/null there.

    Python leaves ``sys.stdout`` None then, and the first file the launcher opens takes the
    free descriptor: the workers, who inherit descriptors 0-2, would read that file as their
    input, and the launcher's prints would fail with a traceback. The user asked for the output
    to go nowhere; now it does, and the run's exit code is the training's.
    """
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue   # open (if some file of ours took it, it is not ours to close)
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))
