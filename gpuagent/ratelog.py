"""Repeated log records held back: a few of each kind per interval, then one line saying how many were not.

A storm of one error (a client flood making every accept fail with "Too many open files", a bad request
repeated thousands of times a second) must not become a storm of log lines: the issue's agent wrote 221,381
lines in 15 s. ``RepeatFilter`` is a ``logging.Filter`` for a handler (``gpuagent.cli.setup_logging`` puts
it on the agent's and the extender's one handler): records of WARNING and above are grouped by kind (logger,
level and message template, so one line about many nodes is one kind), ``burst`` of each kind pass per
``interval_seconds``, and the first to pass after that carries the count of those held back. INFO and DEBUG
pass untouched (they are not errors and are rate-bounded where they are logged).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KINDS = 1024  # kinds remembered; the least recent is forgotten past this


class RepeatFilter(logging.Filter):
    """See the module docstring."""

    def __init__(
        self, *, interval_seconds: float = 10.0, burst: int = 5, clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        super().__init__()
        self.interval_seconds = interval_seconds
        self.burst = burst
        self.level = level
        self._clock = clock
        # kind -> [interval start, records passed in it, records held back since the last one passed]
        self._kinds: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        template = record.msg if isinstance(record.msg, str) else repr(type(record.msg))
        key = (record.name, record.levelno, template)
        now = self._clock()
        state = self._kinds.get(key)
        if state is None:
            state = self._kinds[key] = [now, 0, 0]
            if len(self._kinds) > MAX_KINDS:
                self._kinds.popitem(last=False)
        else:
            self._kinds.move_to_end(key)
        if now - state[0] >= self.interval_seconds:
            state[0], state[1] = now, 0
        if state[1] >= self.burst:
            state[2] += 1
            return False
        state[1] += 1
        held = int(state[2])
        if held:
            state[2] = 0
            note = f" [{held} more like this held back in the last {self.interval_seconds:g} s]"
            record.msg = str(record.msg) + (note.replace("%", "%%") if record.args else note)
        return True
