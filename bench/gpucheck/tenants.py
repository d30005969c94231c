"""The tenants the items run: each in its own kubelet-shaped cgroup, counting its iterations in a file.

On a GPU they are PyTorch programs: ``matmul`` (bf16 matrix products, synchronised each iteration, so a frozen
process stops submitting work at once), ``deep`` (a CUDA graph of large products replayed with several
replays always queued, about 90 ms of work: a deep queue that keeps the GPU busy for a while after its
process is frozen), ``hog`` (allocates GPU memory past its limit and ignores SIGTERM), and the latency
item's pair: ``serve`` (a request-driven service: requests at Poisson times from a seeded stream, each a few
products then a synchronisation, timed from its arrival to its completion) and ``trainer`` (PyTorch-style:
an iteration's products, about 100 ms of them, queued at once, then one synchronisation and 2 ms of host
work). On the simulator they are CPU burners pinned to one CPU, whose simulated GPU use follows their real
CPU progress (``follow_cpu``; ``cpu-deep`` with a longer queue), ``cpu-serve`` (the same service, each
product 1.6 ms of its CPU on that CPU) and a memory ``hog`` whose GPU memory the scenario gives.
Their own iteration counts are the truth the shares are measured by, never what the agent reports.

Beside its count each tenant keeps the completion time of every iteration (``<counter>.times``, float64
seconds of CLOCK_MONOTONIC, the clock this process reads too): on a GPU the time the GPU finished it, from a
CUDA event read against a host anchor, so work a frozen process's queue finishes is dated when it was done;
the ``deep`` tenant also keeps each replay's enqueue time (``<counter>.enqueued``): their difference is the
queue in front of it. A service counts requests: ``.times`` when each was answered, ``.enqueued`` when it
arrived, and ``<counter>.serve`` (JSON) its schedule's start, rate and seed, from which ``requests`` draws
the same arrivals and sizes here, so a request not answered yet is known too.

Each tenant is a pod known by its UID (no API server): the agent's policies match it with ``match_pod``.
"""

from __future__ import annotations

import array
import inspect
import json
import os
import random
import sys
import time
from collections.abc import Iterator
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

def requests(seed: int, rate: float, low: int, high: int) -> Iterator[tuple[float, int]]:
    """A service's requests, in order: (seconds after its schedule's start, products asked). Poisson arrivals
    at ``rate`` a second, sizes uniform in [``low``, ``high``], one stream seeded with ``seed``: the tenant
    runs this very function (its source is part of the program), so the harness draws the same requests."""
    rng = random.Random(seed)
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        yield at, rng.randint(low, high)


_REQUESTS = "import random\nfrom collections.abc import Iterator\n" + inspect.getsource(requests)

# A service: argv PATH SEED LOAD LOW HIGH, then its device's own. ``work(k)`` serves a request of k products
# (set up below by the GPU or the CPU version, with ``kernel_s``, one product's time alone); the rate gives
# LOAD of the device alone at the mean size. Requests are served one after the other in arrival order: one
# arriving while another is served waits (its latency counts the wait), the service sleeps while none is due.
_SERVE_ARGS = r"""
import json
path, seed, load = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
low, high = int(sys.argv[4]), int(sys.argv[5])
"""
_SERVE_LOOP = r"""
rate = load / (kernel_s * (low + high) / 2)
t0 = time.monotonic() + 0.1
with open(path + ".serve.tmp", "w") as out:
    json.dump({"t0": t0, "rate": rate, "seed": seed, "low": low, "high": high, "kernel_s": kernel_s}, out)
os.replace(path + ".serve.tmp", path + ".serve")
print(f"serve: one product {kernel_s * 1000:.2f} ms, {rate:.1f} requests a second of {low}-{high} "
      f"products ({load:.0%} of the device alone)", file=sys.stderr)
n = 0
for offset, kernels in requests(seed, rate, low, high):
    arrival = t0 + offset
    ahead = arrival - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
    work(kernels)
    n += 1
    tick(n, time.monotonic(), arrival)
"""

# the GPU service: bf16 products of SIZE^2, synchronised once a request (CUDA's synchronisation spins: its
# CPU moves while a request is in hand, what the agent's preemption reads); one product timed alone first
SERVE = _COUNTER + _REQUESTS + _SERVE_ARGS + r"""
import torch
size = int(sys.argv[6])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
def work(kernels):
    for _ in range(kernels):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
work(3)
began = time.perf_counter()
work(20)
kernel_s = (time.perf_counter() - began) / 20
""" + _SERVE_LOOP

# the simulator's service: pinned to CPU, each product KERNEL_S of its own CPU time (a freeze or a neighbour
# on the CPU lengthens it, as they do a GPU request)
CPU_SERVE = _COUNTER + _REQUESTS + _SERVE_ARGS + r"""
cpu, kernel_s = int(sys.argv[6]), float(sys.argv[7])
os.sched_setaffinity(0, {cpu})
def work(kernels):
    start = time.thread_time()
    while time.thread_time() - start < kernels * kernel_s:
        pass
""" + _SERVE_LOOP

# PyTorch-style training: each iteration's products (ITERATION_MS of them, counted from one product timed
# alone) launched asynchronously, then one synchronisation (the loss read) and HOST_MS of host work (the
# optimizer's host side, the data loader); an iteration dated when the GPU finished it
TRAINER = _COUNTER + _ANCHOR + r"""
path, size, iteration_ms, host_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
began = time.perf_counter()
for _ in range(10):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
product_s = (time.perf_counter() - began) / 10
kernels = max(1, round(iteration_ms / 1000.0 / product_s))
print(f"trainer: one product {product_s * 1000:.2f} ms, {kernels} an iteration "
      f"(about {kernels * product_s * 1000:.0f} ms queued at once)", file=sys.stderr)
done_event = torch.cuda.Event(enable_timing=True)
ref, ref_t = anchor()
n = 0
while True:
    for _ in range(kernels):
        torch.matmul(a, b, out=c)
    done_event.record()
    done_event.synchronize()
    n += 1
    tick(n, ref_t + ref.elapsed_time(done_event) / 1000.0)
    host = time.thread_time()
    while time.thread_time() - host < host_ms / 1000.0:
        pass
    if time.monotonic() - ref_t > 20.0:
        ref, ref_t = anchor()
"""

GPU_KINDS = ("matmul", "deep")
DEEP_QUEUE_MS = 90.0  # the work a deep tenant keeps queued
SIM_KINDS = ("cpu", "cpu-deep")
SERVE_KERNEL_S = 0.0016  # the simulator's service: one product's CPU time (the H200's 8192^2 bf16 product)
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
    if kind in ("serve", "cpu-serve"):
        schedule = [str(options.get("seed", 29)), str(options.get("load", 0.2)), str(options.get("low", 2)),
                    str(options.get("high", 12))]
        if kind == "serve":
            return [python, "-c", SERVE, str(counter), *schedule, str(options.get("size", 8192))]
        assert cpu is not None, "simulator tenants are pinned to a CPU"
        return [python, "-c", CPU_SERVE, str(counter), *schedule, str(cpu),
                str(options.get("kernel_s", SERVE_KERNEL_S))]
    if kind == "trainer":
        # products of 8192^2 (1.6 ms each on an H200) for about 100 ms an iteration: a PyTorch training step
        return [python, "-c", TRAINER, str(counter), str(options.get("size", 8192)),
                str(options.get("iteration_ms", 100.0)), str(options.get("host_ms", 2.0))]
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


def read_serve(counter: Path) -> dict[str, Any] | None:
    """A service's schedule (``t0``, ``rate``, ``seed``, ``low``, ``high``, ``kernel_s``); None until it is
    written."""
    try:
        return dict(json.loads(counter.with_name(counter.name + ".serve").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def counter_path(directory: Path, name: str) -> Path:
    path = directory / f"{name}.count"
    for ext in ("", ".times", ".enqueued", ".serve"):
        old = path.with_name(path.name + ext)
        if old.exists():
            os.unlink(old)
    return path
