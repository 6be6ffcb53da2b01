"""A chart line of bounded size, however many points are fed to it (the report's series).

``report`` on a long run's ``metrics.jsonl`` kept every step record in memory (830 MB for a
108 MB file); the charts draw at most a few hundred points anyway. :class:`Thinned` keeps every
``stride``-th point it is given, doubling the stride and dropping every other kept point when
more than twice the bound are held: at most ``2 * limit`` points, evenly spaced, first point
kept, in one pass.
"""

from __future__ import annotations

from typing import Generic, TypeVar

MAX_POINTS = 600        # points per chart line: a long run is thinned, not drawn step by step

T = TypeVar("T")


class Thinned(Generic[T]):
    """Evenly spaced points of a stream, at most ``2 * limit`` of them held at any time."""

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self.limit = max(1, limit)
        self.points: list[T] = []
        self.stride = 1         # every stride-th point of the stream is kept
        self.seen = 0           # points fed so far

    def add(self, point: T) -> None:
        """Feed the next point of the stream."""
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) > 2 * self.limit:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1

    def drawn(self) -> list[T]:
        """The points to draw: at most about ``limit`` of those held, evenly spaced."""
        return self.points[::max(1, len(self.points) // self.limit)]
