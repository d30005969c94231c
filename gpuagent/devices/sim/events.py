"""The simulated NVML's event sets: XID and ECC events of the scenario's faults, waited on as NVML does."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuagent.devices.sim.core import NO_INSTANCE, SimCore, nvml_error
from gpuagent.devices.sim.scenario import (
    EccFault,
    GpuSpec,
    Scenario,
    XidFault,
)


@dataclass
class _EventSet:
    buffer: Any
    registrations: dict[int, tuple[int, float]] = field(default_factory=dict)  # gpu -> (mask, since t)
    cursor: int = 0
    freed: bool = False
    wake: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, order=True)
class _Event:
    t: float
    seq: int
    gpu: int
    type: int
    data: int
    gpu_instance: int | None


class EventCalls(SimCore):
    """Event sets and ``nvmlEventSetWait``: events are real ``c_nvmlEventData_t`` structs."""

    def __init__(self, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(scenario, **kwargs)
        self._events = self._build_events(scenario)
        self._event_sets: dict[int, _EventSet] = {}


    @staticmethod
    def _build_events(scenario: Scenario) -> list[_Event]:
        events: list[_Event] = []
        seq = 0
        for f in scenario.faults:
            if isinstance(f, XidFault):
                for k in range(f.count):
                    events.append(_Event(f.at + k * f.interval, seq, f.gpu,
                                         pynvml.nvmlEventTypeXidCriticalError, f.code, f.gpu_instance))
                    seq += 1
            elif isinstance(f, EccFault):
                kind = (pynvml.nvmlEventTypeDoubleBitEccError if f.double_bit
                        else pynvml.nvmlEventTypeSingleBitEccError)
                events.append(_Event(f.at, seq, f.gpu, kind, 0, None))
                seq += 1
        events.sort()
        return events

    def _supported_events(self, g: GpuSpec) -> int:
        mask = pynvml.nvmlEventTypeXidCriticalError
        if g.model.ecc:
            mask |= pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
        return mask

    def _event_set(self, event_set: Any) -> _EventSet:
        try:
            addr = ctypes.cast(event_set, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            addr = None
        es = self._event_sets.get(addr or 0)
        if es is None or es.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return es

    def nvmlEventSetCreate(self) -> Any:
        self._node_call()
        buf = (ctypes.c_byte * 8)()
        with self._lock:
            self._event_sets[ctypes.addressof(buf)] = _EventSet(buf)
        return ctypes.cast(buf, pynvml.c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return self._supported_events(g)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: Any, eventSet: Any) -> Any:
        g, _, t = self._device(handle)
        if eventTypes & ~self._supported_events(g):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es = self._event_set(eventSet)
            mask, since = es.registrations.get(g.index, (0, t))
            es.registrations[g.index] = (mask | eventTypes, since)

    def nvmlEventSetFree(self, eventSet: Any) -> Any:
        self._node_call()
        with self._lock:
            es = self._event_set(eventSet)
            es.freed = True
            es.wake.set()

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: Any) -> Any:
        return self._wait(eventSet, timeoutms, "nvmlEventSetWait")

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: Any) -> Any:
        return self._wait(eventSet, timeoutms, "nvmlEventSetWait_v2")

    def _wait(self, event_set: Any, timeout_ms: int, name: str) -> Any:
        t = self._node_call(name)
        deadline = t + max(0, timeout_ms) / 1000.0
        while True:
            with self._lock:
                es = self._event_set(event_set)
                t = self._now()
                event, next_t = self._next_event(es, t)
            if event is not None:
                return self._event_data(event)
            remaining = deadline - t
            if remaining <= 0:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            delay = remaining if next_t is None else min(remaining, max(next_t - t, 0.0))
            if self._sleep is not None:
                self._sleep(delay)
            else:
                es.wake.wait(delay)
            if es.freed:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            if self._now() <= t:  # a clock that does not move while we wait: do not spin
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)

    def _next_event(self, es: _EventSet, t: float) -> tuple[_Event | None, float | None]:
        """The next due event registered in ``es`` (consumed), else the time of the next event."""
        events = self._events
        i = es.cursor
        while i < len(events) and events[i].t <= t:
            e = events[i]
            i += 1
            reg = es.registrations.get(e.gpu)
            if reg is not None and reg[0] & e.type and e.t >= reg[1]:
                es.cursor = i
                return e, None
        es.cursor = i
        return None, events[i].t if i < len(events) else None

    def _event_data(self, e: _Event) -> Any:
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handle(self._gpu_addr[e.gpu])
        data.eventType = e.type
        data.eventData = e.data
        if e.gpu_instance is None:
            data.gpuInstanceId = data.computeInstanceId = NO_INSTANCE
        else:
            data.gpuInstanceId, data.computeInstanceId = e.gpu_instance, 0
        return data

