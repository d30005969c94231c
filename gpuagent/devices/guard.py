"""The one wrapper every NVML call goes through.

Triage, as nvitop's ``nvmlQuery`` and node_exporter's readers do it:
- NOT_SUPPORTED / FUNCTION_NOT_FOUND: the field is absent (``None``), remembered per device so the
  unsupported call is not repeated every poll;
- an expected "nothing to report" code named by the caller (e.g. NOT_FOUND from process utilization on an
  idle GPU): ``None``, not an error;
- GPU_IS_LOST: :class:`GpuLostError`, the caller marks the GPU unhealthy;
- the library itself gone (uninitialized, driver not loaded, version mismatch): :class:`NvmlUnavailableError`,
  the poller re-initialises NVML;
- anything else: counted by function and code, logged once per change of state, the field is ``None``.
Time spent in each function is summed for ``gpuagent_nvml_call_duration_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import pynvml

from gpuagent.snapshot.node import NvmlCallStats, NvmlErrorCount

log = logging.getLogger(__name__)

_DEFAULT = object()  # ``empty`` not given: an ``absent_on`` code returns ``default``


class GpuLostError(Exception):
    def __init__(self, scope: Hashable, function: str) -> None:
        super().__init__(f"GPU {scope} is lost (NVML_ERROR_GPU_IS_LOST from {function})")
        self.scope = scope
        self.function = function


class NvmlUnavailableError(Exception):
    """NVML as a whole does not answer: not initialised, driver unloaded or replaced."""


def error_code_name(code: int) -> str:
    """``NVML_ERROR_GPU_IS_LOST``'s value -> ``"GPU_IS_LOST"``; unknown codes as ``CODE_<n>``."""
    return _ERROR_NAMES.get(code, f"CODE_{code}")


# The codes are NVML's own, the same for the real module and the simulated one.
_ERROR_NAMES = {
    getattr(pynvml, n): n.removeprefix("NVML_ERROR_") for n in dir(pynvml) if n.startswith("NVML_ERROR_")
}


class NvmlGuard:
    """Calls functions of a pynvml-shaped module with the triage above. Thread-safe."""

    def __init__(self, nvml: Any, *, timer: Callable[[], float] = time.perf_counter) -> None:
        self.nvml = nvml
        self._timer = timer
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._absent: set[tuple[Hashable, str, tuple]] = set()
        self._failing: dict[tuple[Hashable, str], str] = {}
        e = nvml
        self._not_supported = {e.NVML_ERROR_NOT_SUPPORTED, e.NVML_ERROR_FUNCTION_NOT_FOUND}
        self._lost = e.NVML_ERROR_GPU_IS_LOST
        self._unavailable = {
            e.NVML_ERROR_UNINITIALIZED,
            e.NVML_ERROR_DRIVER_NOT_LOADED,
            e.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            e.NVML_ERROR_LIBRARY_NOT_FOUND,
        }

    def call(
        self,
        function: str,
        *args: Any,
        scope: Hashable = None,
        absent_on: tuple[int, ...] = (),
        default: Any = None,
        empty: Any = _DEFAULT,
    ) -> Any:
        """``nvml.<function>(*args)`` triaged; ``scope`` names the device for memos and messages.

        Returns ``default`` whenever the call gave no result (absent or failed); pass a sentinel to tell
        a failure from a function that returns None on success. ``empty``, when given, is returned instead
        for an ``absent_on`` code: an answer that means "nothing to report", told apart from a failure.
        """
        variant = tuple(a for a in args if isinstance(a, (int, str)))
        memo = (scope, function, variant)
        if memo in self._absent:
            return default
        fn = getattr(self.nvml, function, None)
        started = self._timer()
        try:
            if fn is None:
                raise self.nvml.NVMLError(self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            result = fn(*args)
        except self.nvml.NVMLError as exc:
            self._account(function, started)
            if self._triage(exc, function, scope, memo, absent_on) and empty is not _DEFAULT:
                return empty
            return default
        self._account(function, started)
        if (scope, function) in self._failing:
            self._recovered(scope, function)
        return result

    def _triage(
        self, exc: Exception, function: str, scope: Hashable, memo: tuple, absent_on: tuple[int, ...]
    ) -> bool:
        """True for an ``absent_on`` code (nothing to report); False for anything else that returns."""
        code = getattr(exc, "value", None)
        if code in self._not_supported:
            self._absent.add(memo)
            if code == self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                log.info("NVML function %s is not in this driver; its fields are absent", function)
            return False
        if code in absent_on:
            return True
        name = error_code_name(code) if isinstance(code, int) else type(exc).__name__
        with self._lock:
            self._errors[(function, name)] = self._errors.get((function, name), 0) + 1
        if code == self._lost:
            raise GpuLostError(scope, function) from exc
        if code in self._unavailable:
            raise NvmlUnavailableError(f"{function}: NVML_ERROR_{name}") from exc
        if self._failing.get((scope, function)) != name:
            self._failing[(scope, function)] = name
            log.warning("NVML %s on GPU %s failed: NVML_ERROR_%s (%s)", function, scope, name, exc)
        return False

    def _recovered(self, scope: Hashable, function: str) -> None:
        name = self._failing.pop((scope, function), None)
        if name is not None:
            log.info("NVML %s on GPU %s works again (was NVML_ERROR_%s)", function, scope, name)

    def _account(self, function: str, started: float) -> None:
        elapsed = self._timer() - started
        with self._lock:
            self._seconds[function] = self._seconds.get(function, 0.0) + elapsed
            self._calls[function] = self._calls.get(function, 0) + 1

    def count_error(self, function: str, code: str) -> None:
        """Count an error the guard did not see itself (a call that timed out in its worker)."""
        with self._lock:
            self._errors[(function, code)] = self._errors.get((function, code), 0) + 1

    def forget(self, scope: Hashable) -> None:
        """Drop the "not supported" memos of a device (its MIG mode changed, or NVML restarted)."""
        self._absent = {m for m in self._absent if m[0] != scope and not _within(m[0], scope)}

    def forget_all(self) -> None:
        self._absent.clear()
        self._failing.clear()

    def call_stats(self) -> tuple[NvmlCallStats, ...]:
        with self._lock:
            return tuple(
                NvmlCallStats(function=f, calls_total=self._calls[f], seconds_total=self._seconds[f])
                for f in sorted(self._calls)
            )

    def error_counts(self) -> tuple[NvmlErrorCount, ...]:
        with self._lock:
            return tuple(
                NvmlErrorCount(function=f, code=c, count=n) for (f, c), n in sorted(self._errors.items())
            )


def _within(inner: Hashable, outer: Hashable) -> bool:
    """A MIG scope ``(3, gi)`` lies within the GPU scope ``3``."""
    return isinstance(inner, tuple) and len(inner) > 0 and inner[0] == outer
