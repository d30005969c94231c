"""The tenants the items run: each in its own kubelet-shaped cgroup, counting its iterations in a file.

On a GPU they are PyTorch programs: ``matmul`` (bf16 matrix products, synchronised each iteration, so a frozen
process stops submitting work at once), ``deep`` (a CUDA graph of large products replayed with several
replays always queued, about 90 ms of work: a deep queue that keeps the GPU busy for a while after its
process is frozen) and ``hog`` (allocates GPU memory past its limit and ignores SIGTERM). On the simulator
they are CPU burners pinned to one CPU, whose simulated GPU use follows their real CPU progress
(``follow_cpu``; ``cpu-deep`` with a longer queue), and a memory ``hog`` whose GPU memory the scenario gives.
Their own iteration counts are the truth the shares are measured by, never what the agent reports.

Beside its count each tenant keeps the completion time of every iteration (``<counter>.times``, float64
seconds of CLOCK_MONOTONIC, the clock this process reads too): on a GPU the time the GPU finished it, from a
CUDA event read against a host anchor, so work a frozen process's queue finishes is dated when it was done;
the ``deep`` tenant also keeps each replay's enqueue time (``<counter>.enqueued``): their difference is the
queue in front of it.

Each tenant is a pod known by its UID (no API server): the agent's policies match it with ``match_pod``.
"""

from __future__ import annotations

import array
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every tenant writes its iteration count to the file named by its first argument, at most every 0.1 s,
# what it prints on stderr (a traceback: CUDA out of memory, no GPU) to that file's ".log", and the completion
# time of each iteration (and, for the deep tenant, its enqueue time) to ".times" (".enqueued"), appended
# as native float64 at each flush.
_COUNTER = r"""
import array, os, sys, time
sys.stderr = open(sys.argv[1] + ".log", "a", buffering=1)
_fd, _last = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644), 0.0
_traces = {ext: (os.open(sys.argv[1] + ext, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), array.array("d"))
           for ext in (".times", ".enqueued")}
def tick(n, done=None, enqueued=None):
    global _last
    if done is not None:
        _traces[".times"][1].append(done)
    if enqueued is not None:
        _traces[".enqueued"][1].append(enqueued)
    now = time.monotonic()
    if now - _last > 0.1:
        for fd, buffer in _traces.values():
            if buffer:
                os.write(fd, buffer.tobytes())
                del buffer[:]
        os.pwrite(_fd, f"{n:020d}".encode(), 0)
        _last = now
"""

# The GPU tenants' clock: a CUDA event recorded on an idle stream, dated by the host clock around it, against
# which every later event's elapsed time gives the host time the GPU reached it; taken again every 20 s
# (the GPU's timer and the host's clock drift apart by a few parts per million).
_ANCHOR = r"""
import torch
def anchor():
    torch.cuda.synchronize()
    ref = torch.cuda.Event(enable_timing=True)
    before = time.monotonic()
    ref.record()
    ref.synchronize()
    return ref, (before + time.monotonic()) / 2
"""

# bf16 products, synchronised each iteration; DUTY < 1 sleeps between products (a light tenant)
MATMUL = _COUNTER + _ANCHOR + r"""
path, size, duty = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
done_event = torch.cuda.Event(enable_timing=True)
ref, ref_t = anchor()
n = 0
while True:
    t0 = time.perf_counter()
    total = (a @ b).sum()
    done_event.record()
    total.item()
    n += 1
    tick(n, ref_t + ref.elapsed_time(done_event) / 1000.0)
    if duty < 1.0:
        busy = time.perf_counter() - t0
        time.sleep(busy * (1.0 - duty) / duty)
    if time.monotonic() - ref_t > 20.0:
        ref, ref_t = anchor()
"""

# A CUDA graph of KERNELS products; replays are enqueued while DEPTH are in flight, DEPTH chosen from one
# replay's time so that about QUEUE_MS of work is queued in front of each new replay (the first line of the
# ".log" says what it chose). One iteration = one replay, counted when its event completes.
DEEP = _COUNTER + _ANCHOR + r"""
import collections
path, size, kernels, queue_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    for _ in range(3):
        torch.matmul(a, b, out=c)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    for _ in range(kernels):
        torch.matmul(a, b, out=c)
torch.cuda.synchronize()
with torch.cuda.stream(stream):
    began = time.perf_counter()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    replay_s = (time.perf_counter() - began) / 5
    depth = max(1, round(queue_ms / 1000.0 / replay_s) - 1)
    print(f"deep: one replay {replay_s * 1000:.2f} ms, {depth} in flight before each new one "
          f"(about {(depth + 1) * replay_s * 1000:.0f} ms queued)", file=sys.stderr)
    ring = [torch.cuda.Event(enable_timing=True) for _ in range(depth + 2)]
    pending = collections.deque()
    ref, ref_t = anchor()
    n = k = 0
    while True:
        event = ring[k % len(ring)]
        enqueued = time.monotonic()
        graph.replay()
        event.record()
        pending.append((event, enqueued))
        k += 1
        again = time.monotonic() - ref_t > 20.0
        while len(pending) > depth or (again and pending):
            done_event, at = pending.popleft()
            done_event.synchronize()
            n += 1
            tick(n, ref_t + ref.elapsed_time(done_event) / 1000.0, at)
        if again:
            ref, ref_t = anchor()
"""

# GPU memory: START_GIB at once, everything up to PEAK_GIB after AFTER_S; ignores SIGTERM (needs the KILL)
HOG = _COUNTER + r"""
import signal, torch
path, start_gib, peak_gib, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
gib = 1 << 30
held = [torch.empty(int(start_gib * gib), dtype=torch.uint8, device="cuda")]
began, grown, n = time.monotonic(), False, 0
x = torch.randn(1024, 1024, device="cuda")
while True:
    if not grown and time.monotonic() - began > after:
        held.append(torch.empty(int((peak_gib - start_gib) * gib), dtype=torch.uint8, device="cuda"))
        grown = True
    (x @ x).sum().item()
    n += 1
    time.sleep(0.01)
    tick(n, time.monotonic())
"""

# the simulator's tenants: CPU progress on one CPU, counted; HOLD_TERM ignores SIGTERM
CPU = _COUNTER + r"""
import signal
path, cpu, hold_term, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
os.sched_setaffinity(0, {cpu})
if hold_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
n = 0
while True:
    for _ in range(20000):
        pass
    n += 1
    tick(n, time.monotonic())
    if rest:
        time.sleep(rest)
"""

GPU_KINDS = ("matmul", "deep")
DEEP_QUEUE_MS = 90.0  # the work a deep tenant keeps queued
SIM_KINDS = ("cpu", "cpu-deep")
QUEUE_SECONDS = {"cpu": 0.2, "cpu-deep": 1.0, "hog": 0.2}  # the simulated queue behind each CPU tenant


@dataclass
class Tenant:
    name: str
    kind: str
    uid: str  # its pod's UID: the name the agent knows it by
    process: Any  # tests/cgroups.py CgroupProcess
    counter: Path

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def count(self) -> int:
        return read_count(self.counter)

    def alive(self) -> bool:
        return self.process.popen.poll() is None

    def times(self) -> array.array:
        """Completion time of each iteration so far (CLOCK_MONOTONIC seconds; on a GPU, when it finished)."""
        return read_times(self.counter, ".times")

    def enqueued(self) -> array.array:
        """Enqueue time of each iteration (``deep`` only; empty for the others)."""
        return read_times(self.counter, ".enqueued")

    def said(self) -> str:
        """The last line the tenant wrote on stderr (its error, when it died)."""
        try:
            lines = self.counter.with_name(self.counter.name + ".log").read_text().strip().splitlines()
        except OSError:
            return "nothing on stderr"
        return lines[-1] if lines else "nothing on stderr"

    def freeze(self, frozen: bool) -> None:
        """Freeze or thaw its cgroup by hand (v2 ``cgroup.freeze``, else the v1 freezer)."""
        paths = self.process.paths
        if "unified" in paths:
            (paths["unified"] / "cgroup.freeze").write_text("1" if frozen else "0")
        elif "freezer" in paths:
            (paths["freezer"] / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def frozen(self) -> bool:
        paths = self.process.paths
        if "unified" in paths:
            return (paths["unified"] / "cgroup.freeze").read_text().strip() == "1"
        if "freezer" in paths:
            return (paths["freezer"] / "freezer.state").read_text().strip() != "THAWED"
        return False


def read_count(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


def read_times(counter: Path, ext: str) -> array.array:
    """The float64 times a tenant appended to ``<counter><ext>`` (a partly written last value dropped)."""
    times = array.array("d")
    try:
        data = counter.with_name(counter.name + ext).read_bytes()
    except FileNotFoundError:
        return times
    times.frombytes(data[: len(data) - len(data) % times.itemsize])
    return times


def argv(kind: str, counter: Path, *, cpu: int | None = None, **options: Any) -> list[str]:
    """The command line of a tenant of ``kind``."""
    python = sys.executable
    if kind == "matmul":
        return [python, "-c", MATMUL, str(counter), str(options.get("size", 8192)),
                str(options.get("duty", 1.0))]
    if kind == "deep":
        # graphs of 16 products of 8192^2 (about 1.4 ms each on an H100): about 90 ms of work queued in
        # front of each new replay, near a whole share_period, when the process is frozen
        return [python, "-c", DEEP, str(counter), str(options.get("size", 8192)),
                str(options.get("kernels", 16)), str(options.get("queue_ms", DEEP_QUEUE_MS))]
    if kind == "hog" and cpu is None:
        return [python, "-c", HOG, str(counter), str(options.get("start_gib", 1.0)),
                str(options.get("peak_gib", 6.0)), str(options.get("after_s", 3.0))]
    if kind in (*SIM_KINDS, "hog"):
        assert cpu is not None, "simulator tenants are pinned to a CPU"
        hold_term = "1" if kind == "hog" else "0"
        rest = "0.01" if kind == "hog" else "0"
        return [python, "-c", CPU, str(counter), str(cpu), hold_term, rest]
    raise ValueError(f"unknown tenant kind {kind!r}")


def wait_counting(tenants: list[Tenant], timeout: float = 120.0) -> None:
    """Until every tenant has counted an iteration (CUDA start-up takes seconds); raises if one died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [t for t in tenants if not t.alive()]
        if dead:
            said = "; ".join(f"{t.name}: {t.said()}" for t in dead)
            raise RuntimeError(f"tenant(s) exited before computing ({said})")
        if all(t.count() > 0 for t in tenants):
            return
        time.sleep(0.2)
    raise RuntimeError(f"tenants did not start computing within {timeout:g} s")


def rates(tenants: list[Tenant], seconds: float) -> dict[str, float]:
    """Iterations per second of each tenant over the next ``seconds``."""
    before = {t.name: t.count() for t in tenants}
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {t.name: (t.count() - before[t.name]) / wall for t in tenants}


def counter_path(directory: Path, name: str) -> Path:
    path = directory / f"{name}.count"
    for ext in ("", ".times", ".enqueued"):
        old = path.with_name(path.name + ext)
        if old.exists():
            os.unlink(old)
    return path
