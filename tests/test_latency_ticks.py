"""A request's end read at the first scheduler tick its CPU stood still through (``timeslice/ticks.py``).

The kernel charges a running task's CPU time to ``cpu.stat`` only at its ticks (and when it stops), and every
CPU ticks on one grid: a counter that did not move across a tick says nothing of the cgroup ran at it. The
grid and where to read around it (:class:`TickGrid`), the controller ending a hold on it, the agent's
:class:`KernelTicks` learning it from the coarse clock (fake clocks, then this kernel's with a spinning
process in a v2 cgroup), and the plant's gain from it beside a synchronous neighbour.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from latencyplant import run_beside

from gpuagent.enforce.actions.mounts import Hierarchies
from gpuagent.enforce.timeslice import LatencyController, Tenant
from gpuagent.enforce.timeslice.ticks import (
    READ_BEFORE_S,
    TICK_GUARD_S,
    TICK_MARGIN_S,
    KernelTicks,
    TickGrid,
    kernel_tick,
)

TICK = 0.004  # HZ=250


def test_the_grid_places_its_ticks_and_says_when_one_lies_between_two_readings() -> None:
    grid = TickGrid(TICK, 0.001)
    assert grid.last(0.0099) == pytest.approx(0.009) and grid.last(0.009) == pytest.approx(0.009)
    before, after = 0.009 - READ_BEFORE_S, 0.009 + TICK_MARGIN_S  # the readings around the tick at 9 ms
    assert grid.window(before, after) is True  # planned just after the tick: it counts
    assert grid.window(before, 0.009 + TICK_MARGIN_S / 2) is None  # too soon after it: maybe not charged yet
    assert grid.window(0.009 - TICK_GUARD_S / 2, after) is None  # the tick may have come before
    assert grid.window(after, 0.013 - READ_BEFORE_S) is False  # between two ticks, clear of both
    assert grid.window(after, 0.013 - TICK_GUARD_S / 2) is None  # the next tick may have come
    assert grid.window(0.0041, 0.0125) is True  # two


def test_while_fast_it_reads_just_before_each_tick_and_just_after_it() -> None:
    grid = TickGrid(TICK, 0.0)
    now, instants = 0.0101, []
    for _ in range(6):
        now += grid.delay(now, 0.002)
        instants.append(round(math.fmod(now, TICK), 6))
    assert instants == [round(TICK - READ_BEFORE_S, 6), TICK_MARGIN_S] * 3
    assert grid.delay(0.0, 0.02) == 0.02 or grid.tick < 2 * 0.02  # slow: the period itself
    assert TickGrid(0.001).delay(0.0, 0.002) == 0.002  # a tick under two periods: every window holds one


class Spinner:
    """A service's ``cpu.stat`` as the kernel keeps it: while it runs, charged at each tick of the grid, and
    when it stops."""

    def __init__(self, grid: TickGrid) -> None:
        self.grid = grid
        self.used = 0.0  # charged for the runs before this one
        self.since: float | None = None  # this run's start
        self.until: float | None = None  # and its end, once known

    def start(self, t: float) -> None:
        if self.since is not None and self.until is not None:
            self.used += self.until - self.since
        self.since, self.until = t, None

    def stop(self, t: float) -> None:
        self.until = t

    def counter(self, t: float) -> float:
        if self.since is None or t <= self.since:
            return self.used
        if self.until is not None and t >= self.until:
            return self.used + self.until - self.since
        return self.used + max(0.0, self.grid.last(t) - self.since)


def test_the_hold_lasts_while_the_service_spins_and_ends_at_the_first_tick_after_it_stops() -> None:
    """Where it last moved decides, unless its tasks have not been waiting for a CPU (PSI)."""
    grid = TickGrid(TICK, 0.0013)
    controller = LatencyController({"svc"})
    controller.update(0.0, [Tenant("svc", 0.1, 0.3), Tenant("t0", 0.6, 0.7)])
    spinner = Spinner(grid)
    now = last = 1.0
    controller.sense(now, {"svc": 0.0})

    def read() -> None:
        nonlocal now, last
        period = controller.period()
        now += grid.delay(now, period) if period < controller.idle_sense_s else period
        controller.sense(now, {"svc": spinner.counter(now)}, ticked=grid.window(last, now))
        last = now

    spinner.start(now + 0.005)
    while not controller.frozen():
        read()
    held = []
    while now < 1.5:  # half a second spinning: the counter stands still between ticks, never across one
        read()
        held.append(controller.frozen() == {"t0"})
    assert all(held) and len(held) > 200
    tick = grid.last(now)
    stopped = tick + TICK / 2 if tick + TICK / 2 > now else tick + 1.5 * TICK  # between two ticks
    spinner.stop(stopped)
    while controller.frozen():
        read()
    # the reading before the next tick saw it stop, the one just after that tick ends the hold
    assert now - stopped <= TICK / 2 + TICK_MARGIN_S + 1e-9
    spinner.start(now + 0.003)
    while not controller.frozen():
        read()
    for _ in range(5):
        read()
    stopped = grid.last(now) + TICK + 0.0001  # just after a tick: its last charge in a window with a tick
    spinner.stop(stopped)
    while controller.frozen():
        read()
    # it may have lost its CPU at that tick (charged there, waiting since): the still time ends it
    assert controller.still_s < now - stopped <= controller.still_s + TICK
    controller.waited("svc", 0.002)  # its tasks have not been waiting for a CPU: none lost it at a tick
    spinner.start(now + 0.003)
    while not controller.frozen():
        read()
    for _ in range(5):
        read()
    stopped = grid.last(now) + TICK + 0.0001
    spinner.stop(stopped)
    while controller.frozen():
        read()
    assert now - stopped <= TICK + TICK_MARGIN_S + 1e-9  # at the next tick
    controller.waited("svc", 0.3)  # a third of its time waiting: the still time again
    assert controller.sense(now + 0.001, {"svc": spinner.counter(now)}) is False


class FakeKernel:
    """The clocks of a kernel ticking every 4 ms from 0.1 ms, read by a spinning thread: each reading of the
    clock ``step`` later than the last; the coarse clock changes at each tick (its value on a grid of its
    own, ``lag`` behind)."""

    def __init__(self, step: float = 0.00002, lag: float = 0.003) -> None:
        self.t = 10.0
        self.step = step
        self.lag = lag
        self.grid = TickGrid(TICK, 0.0001)

    def clock(self) -> float:
        self.t += self.step
        return self.t

    def coarse(self) -> float:
        return self.grid.last(self.t) - self.lag


def test_a_calibration_places_the_grid_at_the_coarse_clocks_change_just_after_the_tick() -> None:
    kernel = FakeKernel()
    ticks = KernelTicks(TICK, clock=kernel.clock, coarse=kernel.coarse, skewed=False)
    assert ticks.due(kernel.t) and ticks.grid is None and ticks.state == "pending"
    assert ticks.calibrate() and ticks.state == "calibrated"
    grid = ticks.grid
    assert grid is not None
    true = kernel.grid.last(kernel.t)
    assert true <= grid.last(kernel.t) <= true + 2 * kernel.step  # never before the true tick
    assert not ticks.due(kernel.t + 1.0) and ticks.due(kernel.t + 61.0)  # once a minute
    kernel.t += 61.0
    kernel.step = 0.0002  # preempted now: the recalibration fails, the grid found stays
    assert not ticks.calibrate() and ticks.grid is grid
    assert not ticks.due(kernel.t + 1.0) and ticks.due(kernel.t + 2.5)  # not at every slow reading


def test_a_calibration_straddled_by_a_long_gap_is_not_kept_and_is_tried_again() -> None:
    kernel = FakeKernel(step=0.0002)  # the thread preempted: 0.2 ms between two readings
    ticks = KernelTicks(TICK, clock=kernel.clock, coarse=kernel.coarse, skewed=False)
    assert not ticks.calibrate() and ticks.grid is None
    assert not ticks.due(kernel.t + 1.5) and ticks.due(kernel.t + 2.0)  # 1 s, doubled after each failure
    assert not ticks.calibrate()
    assert not ticks.due(kernel.t + 3.5) and ticks.due(kernel.t + 4.0)


def test_once_calibrated_a_reading_says_whether_a_tick_surely_lies_since_the_last_one() -> None:
    kernel = FakeKernel(step=0.0)
    ticks = KernelTicks(TICK, clock=kernel.clock, coarse=kernel.coarse, skewed=False)

    def reading(at: float) -> bool | None:
        kernel.t = at
        ticks.begin()
        return ticks.end()

    assert reading(10.0003) is None and reading(10.0013) is None  # not calibrated: unknown
    ticks.grid = kernel.grid
    base = kernel.grid.last(10.04)
    reading(base - 0.002)
    assert reading(base - READ_BEFORE_S) is False  # between two ticks
    assert reading(base + TICK_MARGIN_S + 0.0002) is True  # just after one
    assert reading(base + TICK_MARGIN_S + 0.0005) is False
    assert reading(base + TICK - TICK_GUARD_S / 2) is None  # the next tick may have come
    assert reading(base + 3 * TICK) is True


def test_a_kernel_with_skewed_ticks_or_no_coarse_clock_says_unknown() -> None:
    kernel = FakeKernel()
    skewed = KernelTicks(TICK, clock=kernel.clock, coarse=kernel.coarse, skewed=True)
    assert not skewed.due(kernel.t) and skewed.state == "off"
    skewed.begin()
    skewed.begin()
    assert skewed.end() is None and skewed.grid is None

    def broken() -> float:
        raise OSError("no coarse clock")

    blind = KernelTicks(TICK, clock=kernel.clock, coarse=broken, skewed=False)
    assert not blind.calibrate() and not blind.due(kernel.t + 100.0)
    blind.begin()
    assert blind.end() is None and blind.grid is None


def test_reading_around_the_ticks_keeps_more_of_the_gpu_beside_a_synchronous_neighbour() -> None:
    """On the plant (docs/shares.md, the latency class): the same seeds, the end read at the first tick it
    stood still through against once it stood still 5 ms; the service's p99 alike."""
    for seed in (0, 1):
        ticks = run_beside("latency", "matmul", 1, 0.3, seed=seed, seconds=40, measured=30)
        still = run_beside("latency-still", "matmul", 1, 0.3, seed=seed, seconds=40, measured=30)
        assert ticks.kept > still.kept + 0.02, (seed, ticks.kept, still.kept)
        assert ticks.latency["p99"] <= still.latency["p99"] * 1.1, seed


# --- this kernel --------------------------------------------------------------------------------------------

_SPIN = """
import os, sys
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
while True:
    pass
"""


@pytest.fixture
def v2_cgroup() -> Iterator[str]:
    mount = Hierarchies("/sys/fs/cgroup").mountpoints.get("v2")
    if mount is None or not os.access(mount, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here (root, a v2 mount)")
    directory = os.path.join(mount, f"gpuagent-test-ticks-{os.getpid()}")
    os.makedirs(directory)
    yield directory
    for _ in range(200):
        try:
            os.rmdir(directory)
            return
        except OSError:
            time.sleep(0.01)


def _windows(cgroup: str, seconds: float) -> tuple[int, int]:
    """Reading the cgroup's ``cpu.stat`` around the ticks for ``seconds`` as the agent does while a hold
    is on: the windows a tick surely lies in, and those of them the counter moved through."""
    ticks = KernelTicks()
    for _ in range(50):
        if ticks.calibrate():
            break
        time.sleep(0.01)
    grid = ticks.grid
    assert grid is not None, "no calibration in 50 tries"
    fd = os.open(os.path.join(cgroup, "cpu.stat"), os.O_RDONLY)
    try:
        last, ticked, moved = None, 0, 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = ticks.begin()
            used = int(os.pread(fd, 4096, 0).split()[1])
            if ticks.end():
                ticked += 1
                moved += used != last
            last = used
            time.sleep(max(0.0, now + grid.delay(now, 0.002) - time.monotonic()))
    finally:
        os.close(fd)
    return ticked, moved


@pytest.mark.integration
@pytest.mark.serial  # the spinner must have a CPU: beside the parallel pass's workers it starves them
@pytest.mark.skipif(kernel_tick() > 0.005, reason="this kernel ticks slower than HZ=250")
def test_on_this_kernel_a_spinning_cgroup_moves_across_every_tick_and_a_frozen_one_across_none(
        v2_cgroup: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SPIN, os.path.join(v2_cgroup, "cgroup.procs")])
    try:
        for _ in range(200):
            if Path(v2_cgroup, "cgroup.procs").read_text().strip():
                break
            time.sleep(0.01)
        time.sleep(0.1)
        ticked, moved = _windows(v2_cgroup, 0.5)
        # nearly all of them on a quiet machine (11 of 14,727 still on the VM of docs/shares.md); a spinner
        # that lost its CPU at a tick is charged nothing there
        assert ticked >= 20 and moved >= 0.8 * ticked, (ticked, moved)
        Path(v2_cgroup, "cgroup.freeze").write_text("1")
        time.sleep(0.05)
        ticked, moved = _windows(v2_cgroup, 0.3)
        assert ticked >= 5 and moved == 0, (ticked, moved)
    finally:
        proc.kill()
        proc.wait()
