"""Progress of a command's queries (``report``, ``recommend``) on stderr: a line rewritten in place on a
terminal, one line per query when asked for elsewhere (``--progress``), nothing otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None, *, in_place: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``stream`` None shows nothing; ``in_place`` rewrites one line (a terminal)."""
        self._stream = stream
        self._in_place = in_place
        self._clock = clock
        self._started = clock()
        self._total = 0
        self._done = 0
        self._width = 0

    def start(self, total: int) -> None:
        self._total, self._done, self._started = total, 0, self._clock()

    def step(self, what: str) -> None:
        """Say that query ``what`` is being sent (the one after those done)."""
        self._done += 1
        if self._stream is None:
            return
        elapsed = self._clock() - self._started
        line = f"[{self._done}/{self._total}] {_bar(self._done - 1, self._total)} {elapsed:5.1f}s  {what}"
        if self._in_place:
            padded = line.ljust(self._width)
            self._width = len(line)
            self._stream.write("\r" + padded)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def finish(self) -> None:
        if self._stream is None:
            return
        elapsed = self._clock() - self._started
        line = f"{self._total} queries in {elapsed:.1f}s"
        if self._in_place:
            self._stream.write("\r" + line.ljust(self._width) + "\n")
        else:
            self._stream.write(line + "\n")
        self._stream.flush()


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"
