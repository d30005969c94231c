"""What NVML says about the GPU over a run, kept with its own timestamps: the check's view of the device.

``NvmlTrace`` is a thread that reads, every ``interval`` seconds (0.1 in the plant: a read gives one figure
per process, the mean of its samples since the cursor, so reads faster than NVML's ~200 ms grid keep
each sample apart), the per-process utilization samples
(``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``: ``pid``, ``timeStamp`` in µs, ``smUtil``,
``memUtil``) and the device's own utilization samples (``nvmlDeviceGetSamples(handle,
NVML_GPU_UTILIZATION_SAMPLES, lastSeenTimeStamp)``: ``timeStamp`` in µs and a value whose type the call
returns), each from the newest timestamp it saw, and keeps every sample once. Every read also keeps the
host's CLOCK_MONOTONIC and wall clock, from which ``clock_offset`` finds which clock NVML stamps with and
turns its timestamps into the monotonic seconds the tenants and the freezer write. ``processes`` lists who
holds a context (the idle check). An NVML error of one read is kept as that read's error, never raised:
NOT_FOUND, no sample since the cursor, is the usual one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
         "nvmlDeviceGetMPSComputeRunningProcesses_v3")


def _value(sample: Any, value_type: int) -> float:
    """A ``c_nvmlSample_t``'s value by NVML's value type (0 double, 1 uint, 2 ulong, 3 ulonglong, 4 long
    long, 5 int, 6 ushort)."""
    union = sample.sampleValue
    names = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(union, names.get(value_type, "uiVal")))


def process_samples(nvml: Any, handle: Any, cursor: int) -> list[tuple[int, int, int, int]]:
    """(pid, timeStamp µs, smUtil, memUtil) of every per-process sample newer than ``cursor``."""
    try:
        got = nvml.nvmlDeviceGetProcessUtilization(handle, cursor)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
            return []
        raise
    return [(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil)) for s in got]


def device_samples(nvml: Any, handle: Any, cursor: int) -> list[tuple[int, float]]:
    """(timeStamp µs, GPU utilization %) of every device sample newer than ``cursor``."""
    try:
        value_type, got = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, cursor)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
            return []
        raise
    return [(int(s.timeStamp), _value(s, int(value_type))) for s in got if int(s.timeStamp) > cursor]


def processes(nvml: Any, handle: Any) -> dict[int, str]:
    """PID -> which list named it, of every process holding a context on the GPU (compute, graphics, MPS
    clients where this driver lists them)."""
    found: dict[int, str] = {}
    for name in LISTS:
        call = getattr(nvml, name, None)
        if call is None:
            continue
        try:
            listed = call(handle)
        except nvml.NVMLError:  # NOT_SUPPORTED (no MPS list on this driver): nothing listed there
            continue
        for process in listed:
            found.setdefault(int(process.pid), name.removeprefix("nvmlDeviceGet").removesuffix("_v3"))
    return found


@dataclass
class Read:
    monotonic: float
    wall: float
    newest_us: int | None  # the newest timestamp of the per-process samples this read returned
    error: str = ""
    device_newest_us: int | None = None  # the same of the device's samples


@dataclass
class Trace:
    process: list[tuple[int, int, int, int]] = field(default_factory=list)  # pid, µs, sm %, mem %
    device: list[tuple[int, float]] = field(default_factory=list)  # µs, utilization %
    reads: list[Read] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"process": self.process, "device": self.device,
                "reads": [[r.monotonic, r.wall, r.newest_us, r.device_newest_us, r.error]
                          for r in self.reads]}


def clock_offset(reads: list[Read], device: bool = False) -> tuple[str, float] | None:
    """(clock, offset): NVML's timestamps in µs, divided by 1e6 and less ``offset``, are CLOCK_MONOTONIC
    seconds. ``clock`` is "wall" or "monotonic", whichever the newest sample of each read trails by a
    plausible lag (0 to 10 s); None without a read that returned samples. Of the per-process samples, or
    of the device's with ``device`` (each found on its own: the two calls need not share a clock)."""
    lags: dict[str, list[float]] = {"wall": [], "monotonic": []}
    for read in reads:
        newest = read.device_newest_us if device else read.newest_us
        if newest is None:
            continue
        stamp = newest / 1e6
        lags["wall"].append(read.wall - stamp)
        lags["monotonic"].append(read.monotonic - stamp)
    for clock in ("wall", "monotonic"):
        seen = lags[clock]
        if seen and all(-0.05 <= lag <= 10.0 for lag in seen):
            # wall = mono + (wall - mono): stamp - (wall - mono) is monotonic time
            if clock == "monotonic":
                return clock, 0.0
            gaps = sorted(r.wall - r.monotonic for r in reads)
            return clock, gaps[len(gaps) // 2]
    return None


class NvmlTrace:
    """The sampling thread: ``start()``, then ``stop()`` returns the :class:`Trace`."""

    def __init__(self, nvml: Any, index: int = 0, interval: float = 0.5) -> None:
        self.nvml, self.index, self.interval = nvml, index, interval
        self.trace = Trace()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-trace", daemon=True)

    def start(self) -> NvmlTrace:
        self.nvml.nvmlInit()
        self._handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
        # from now: what the driver buffered before the run is not wanted
        self._process_cursor = max((s[1] for s in self._safe(process_samples, 0)), default=0)
        self._device_cursor = max((s[0] for s in self._safe(device_samples, 0)), default=0)
        self._thread.start()
        return self

    def _safe(self, read: Any, cursor: int) -> list[Any]:
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            return list(read(self.nvml, self._handle, cursor))
        return []

    def read_once(self) -> None:
        error, newest, device_newest = "", None, None
        monotonic, wall = time.monotonic(), time.time()
        try:
            got = process_samples(self.nvml, self._handle, self._process_cursor)
            self.trace.process += got
            if got:
                newest = max(s[1] for s in got)
                self._process_cursor = max(self._process_cursor, newest)
        except (self.nvml.NVMLError, AttributeError) as exc:
            error = f"process: {exc!r}"
        try:
            dev = device_samples(self.nvml, self._handle, self._device_cursor)
            self.trace.device += dev
            if dev:
                device_newest = max(s[0] for s in dev)
                self._device_cursor = max(self._device_cursor, device_newest)
        except (self.nvml.NVMLError, AttributeError) as exc:  # AttributeError: an NVML without the call
            error += f" device: {exc!r}"
        self.trace.reads.append(Read(monotonic, wall, newest, error.strip(), device_newest))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.read_once()

    def stop(self) -> Trace:
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.read_once()  # the samples of the last interval
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
        return self.trace
