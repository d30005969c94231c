"""gpuagent.enforce.memory: the GPU memory ladder (warn, SIGTERM or eviction, SIGKILL) on a fake clock."""

from __future__ import annotations

import pytest

from gpuagent.enforce.memory import LadderSettings, MemoryLadder, Step, pod_key
from gpuagent.snapshot.enforcement import MemoryState

GI = 2**30
LIMIT = 8 * GI
OVER = 9 * GI
UNDER = 7 * GI


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def ladder(**settings: object) -> tuple[MemoryLadder, Clock]:
    clock = Clock()
    return MemoryLadder(LadderSettings(**settings), clock=clock), clock  # type: ignore[arg-type]


def kinds(steps: list[Step]) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.kind, s.pids) for s in steps]


def stage(m: MemoryLadder, key: str = "ml/train") -> str:
    [state] = [s for s in m.states() if pod_key(s.pod, s.namespace) == key]
    return state.stage


def next_step(m: MemoryLadder, key: str = "ml/train") -> tuple[str | None, float | None]:
    [state] = [s for s in m.states() if pod_key(s.pod, s.namespace) == key]
    return state.next_step, state.next_step_at_unix


def train(used: int, pids: tuple[int, ...] = (11, 12), limit: int | None = LIMIT, namespace: str | None = "ml"):
    return ("train", namespace, limit, used, pids)


def test_full_ladder_warn_term_kill_with_timings() -> None:
    m, clock = ladder(term_after=10, kill_grace=30)
    assert m.update([train(UNDER)]) == [] and stage(m) == "ok"

    clock.advance(1)
    steps = m.update([train(OVER)])
    assert steps == [Step("warn", "ml/train", (11, 12), steps[0].reason)]
    assert "9.0 GiB over its limit 8.0 GiB" in steps[0].reason
    assert m.states() == (MemoryState(pod="train", namespace="ml", limit_bytes=LIMIT, used_bytes=OVER,
                                      stage="warned", over_since_unix=1001.0, next_step="term",
                                      next_step_at_unix=1011.0),)

    for _ in range(9):  # 9 s over: not yet
        clock.advance(1)
        assert m.update([train(OVER)]) == [] and stage(m) == "warned"

    clock.advance(1)  # 10 s over
    steps = m.update([train(OVER)])
    assert kinds(steps) == [("term", (11, 12))] and "SIGTERM" in steps[0].reason and "for 10s" in steps[0].reason
    assert "SIGKILL 30s later if still on the GPU" in steps[0].reason
    assert stage(m) == "terminating" and next_step(m) == ("kill", 1041.0)

    clock.advance(29.5)
    assert m.update([train(OVER)]) == [] and stage(m) == "terminating"

    clock.advance(0.5)  # 30 s after SIGTERM
    steps = m.update([train(OVER)])
    assert kinds(steps) == [("kill", (11, 12))] and "SIGKILL" in steps[0].reason and "30s after" in steps[0].reason
    assert stage(m) == "killed"

    clock.advance(5)  # still listed (the driver is slow to let go): nothing more to do
    assert m.update([train(OVER)]) == [] and stage(m) == "killed" and next_step(m) == (None, None)
    assert m.states()[0].over_since_unix == 1001.0


def test_a_process_that_exits_on_sigterm_is_not_killed() -> None:
    m, clock = ladder(term_after=0, kill_grace=30)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12)), ("term", (11, 12))]
    clock.advance(10)
    assert m.update([train(OVER, pids=(12,))]) == []  # 11 exited
    clock.advance(20)
    assert kinds(m.update([train(OVER, pids=(12,))])) == [("kill", (12,))]


def test_a_process_that_appears_after_sigterm_gets_its_own_sigterm_and_grace() -> None:
    m, clock = ladder(term_after=5, kill_grace=30)
    m.update([train(OVER, pids=(11,))])
    clock.advance(5)
    assert kinds(m.update([train(OVER, pids=(11,))])) == [("term", (11,))]
    clock.advance(10)
    assert kinds(m.update([train(OVER, pids=(11, 13))])) == [("term", (13,))]
    assert stage(m) == "terminating"
    clock.advance(20)
    assert kinds(m.update([train(OVER, pids=(11, 13))])) == [("kill", (11,))]
    clock.advance(10)
    assert kinds(m.update([train(OVER, pids=(11, 13))])) == [("kill", (13,))]
    assert stage(m) == "killed"


def test_a_pid_that_exits_and_comes_back_is_a_new_process() -> None:
    m, clock = ladder(term_after=0, kill_grace=30)
    m.update([train(OVER, pids=(11,))])
    clock.advance(10)
    assert m.update([train(OVER, pids=())]) == []
    clock.advance(1)
    assert kinds(m.update([train(OVER, pids=(11,))])) == [("term", (11,))]  # TERM first, not KILL


def test_a_pod_that_recovers_resets_its_ladder() -> None:
    m, clock = ladder(term_after=10, kill_grace=30)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12))]
    clock.advance(8)
    assert m.update([train(OVER)]) == []
    clock.advance(1)
    assert m.update([train(UNDER)]) == [] and stage(m) == "ok"
    assert m.states()[0].over_since_unix is None
    clock.advance(1)
    assert m.update([train(UNDER)]) == []  # not re-warned while under
    clock.advance(1)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12))]  # a new episode, warned again
    clock.advance(9)
    assert m.update([train(OVER)]) == []  # its clock restarted: 9 s, not 19
    clock.advance(1)
    assert kinds(m.update([train(OVER)])) == [("term", (11, 12))]


def test_a_terminating_pod_that_drops_under_is_not_killed() -> None:
    m, clock = ladder(term_after=0, kill_grace=30)
    m.update([train(OVER)])
    clock.advance(5)
    assert m.update([train(UNDER, pids=(12,))]) == [] and stage(m) == "ok"
    clock.advance(60)
    assert m.update([train(UNDER, pids=(12,))]) == []


def test_the_warning_is_given_once_per_episode() -> None:
    m, clock = ladder(action="warn")
    steps = []
    for _ in range(100):
        steps += m.update([train(OVER)])
        clock.advance(1)
    assert kinds(steps) == [("warn", (11, 12))] and stage(m) == "warned"


def test_evict_mode() -> None:
    m, clock = ladder(action="evict", term_after=10, kill_grace=30)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12))]
    clock.advance(10)
    steps = m.update([train(OVER)])
    assert kinds(steps) == [("evict", (11, 12))] and "evicting" in steps[0].reason
    assert stage(m) == "evicted" and next_step(m) == ("evict", 1040.0)  # again, should it stay over
    clock.advance(29)
    assert m.update([train(OVER)]) == []  # the kubelet is stopping it
    clock.advance(1)
    steps = m.update([train(OVER)])  # still over: the eviction may have been refused (a PodDisruptionBudget)
    assert kinds(steps) == [("evict", (11, 12))] and "evicting again" in steps[0].reason
    assert stage(m) == "evicted"
    clock.advance(1)
    assert m.update([train(UNDER, pids=())]) == [] and stage(m) == "ok"


def test_evict_mode_falls_back_to_signals_off_kubernetes() -> None:
    m, clock = ladder(action="evict", term_after=10, kill_grace=30)
    key = "ollama.service"
    m.update([("ollama.service", None, LIMIT, OVER, (7,))])
    clock.advance(10)
    steps = m.update([("ollama.service", None, LIMIT, OVER, (7,))])
    assert [(s.kind, s.pod_key, s.pids) for s in steps] == [("term", key, (7,))]
    assert "cannot be evicted" in steps[0].reason and stage(m, key) == "terminating"
    clock.advance(30)
    steps = m.update([("ollama.service", None, LIMIT, OVER, (7,))])
    assert kinds(steps) == [("kill", (7,))] and "cannot be evicted" in steps[0].reason
    assert stage(m, key) == "killed"


def test_no_limit_no_ladder() -> None:
    m, clock = ladder(term_after=0, kill_grace=0)
    for _ in range(5):
        assert m.update([train(100 * GI, limit=None)]) == []
        clock.advance(100)
    assert m.states() == (MemoryState(pod="train", namespace="ml", limit_bytes=None, used_bytes=100 * GI,
                                      stage="ok"),)


def test_a_limit_removed_mid_episode_ends_it() -> None:
    m, clock = ladder(term_after=10)
    m.update([train(OVER)])
    clock.advance(5)
    assert m.update([train(OVER, limit=None)]) == [] and stage(m) == "ok"
    clock.advance(5)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12))]  # back with a limit: a new episode


def test_tolerance() -> None:
    m, _ = ladder(term_after=0, tolerance_bytes=GI)
    assert m.update([train(LIMIT + GI)]) == [] and stage(m) == "ok"  # at limit + tolerance: not over
    assert kinds(m.update([train(LIMIT + GI + 1)])) == [("warn", (11, 12)), ("term", (11, 12))]
    m, _ = ladder()
    assert m.update([train(LIMIT)]) == []  # at the limit exactly: not over
    assert kinds(m.update([train(LIMIT + 1)])) == [("warn", (11, 12))]


def test_several_pods_are_independent() -> None:
    m, clock = ladder(term_after=10, kill_grace=30)

    def pods(a_used: int, b_used: int) -> list:
        return [("a", "ml", LIMIT, a_used, (1,)), ("b", "ml", 2 * GI, b_used, (2,)), ("c", "web", None, GI, (3,))]

    assert [(s.kind, s.pod_key) for s in m.update(pods(OVER, GI))] == [("warn", "ml/a")]
    clock.advance(5)
    assert [(s.kind, s.pod_key) for s in m.update(pods(OVER, 3 * GI))] == [("warn", "ml/b")]
    clock.advance(5)
    assert [(s.kind, s.pod_key) for s in m.update(pods(OVER, 3 * GI))] == [("term", "ml/a")]
    clock.advance(5)
    assert [(s.kind, s.pod_key) for s in m.update(pods(UNDER, 3 * GI))] == [("term", "ml/b")]
    assert [(s.pod, s.stage) for s in m.states()] == [("a", "ok"), ("b", "terminating"), ("c", "ok")]
    clock.advance(30)
    assert [(s.kind, s.pod_key) for s in m.update(pods(UNDER, 3 * GI))] == [("kill", "ml/b")]


def test_a_pod_that_left_is_forgotten() -> None:
    m, clock = ladder(term_after=10)
    m.update([train(OVER)])
    clock.advance(20)
    assert m.update([]) == [] and m.states() == ()
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12))]  # back: a new pod, a new episode


def test_same_name_in_two_namespaces_are_two_pods() -> None:
    m, _ = ladder()
    steps = m.update([train(OVER, namespace="a"), train(OVER, namespace="b")])
    assert [s.pod_key for s in steps] == ["a/train", "b/train"]
    with pytest.raises(ValueError, match="twice"):
        m.update([train(OVER), train(UNDER)])


def test_over_without_pids_is_warned_but_nothing_is_signalled() -> None:
    m, clock = ladder(term_after=0)
    assert kinds(m.update([train(OVER, pids=())])) == [("warn", ())]
    clock.advance(100)
    assert m.update([train(OVER, pids=())]) == [] and stage(m) == "warned"


def test_the_ladder_never_signals(monkeypatch) -> None:
    import os

    from gpuagent.enforce import memory

    def refuse(*args: object) -> None:
        raise AssertionError("the ladder must not signal")

    monkeypatch.setattr(os, "kill", refuse)
    m, _ = ladder(term_after=0, kill_grace=0)
    assert kinds(m.update([train(OVER)])) == [("warn", (11, 12)), ("term", (11, 12)), ("kill", (11, 12))]
    assert not {"os", "signal", "subprocess"} & set(vars(memory))  # only enforce/actions/ acts


@pytest.mark.parametrize("bad", [dict(action="freeze"), dict(term_after=-1), dict(kill_grace=float("nan")),
                                 dict(tolerance_bytes=-1)])
def test_settings_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError):
        LadderSettings(**bad)


def test_a_state_that_holds_is_the_same_object_from_update_to_update() -> None:
    """An "ok" pod whose figures did not move keeps last update's MemoryState (consumers key on it); any
    change gives a new one equal to what a first update would say."""
    m, _ = ladder()
    m.update([("train", "ml", LIMIT, UNDER, (1,)), ("infer", "ml", None, OVER, (2,))])
    first = {s.pod: s for s in m.states()}
    m.update([("train", "ml", LIMIT, UNDER, (1,)), ("infer", "ml", None, OVER, (2,))])
    again = {s.pod: s for s in m.states()}
    assert again["train"] is first["train"] and again["infer"] is first["infer"]
    for changed in (("train", "ml", LIMIT, UNDER - 1, (1,)), ("train", "ml", 2 * LIMIT, UNDER, (1,)),
                    ("train", "other", LIMIT, UNDER, (1,))):
        m.update([changed])
        fresh, _ = ladder()
        fresh.update([changed])
        assert m.states() == fresh.states() and m.states()[0] is not first["train"]


def test_the_next_step_follows_a_late_process_and_ends_with_the_last_kill() -> None:
    """A PID that appears after the SIGTERM gets its own at once, and the next kill is the first one due."""
    m, clock = ladder(term_after=10, kill_grace=30)
    m.update([train(OVER, pids=(11,))])
    assert next_step(m) == ("term", 1010.0)
    clock.advance(10)
    m.update([train(OVER, pids=(11,))])
    assert next_step(m) == ("kill", 1040.0)
    clock.advance(20)
    assert kinds(m.update([train(OVER, pids=(11, 12))])) == [("term", (12,))]
    assert next_step(m) == ("kill", 1040.0)  # 11's comes first
    clock.advance(10)
    assert kinds(m.update([train(OVER, pids=(11, 12))])) == [("kill", (11,))]
    assert next_step(m) == ("kill", 1060.0)  # then 12's
    clock.advance(20)
    assert kinds(m.update([train(OVER, pids=(11, 12))])) == [("kill", (12,))]
    assert next_step(m) == (None, None)


def test_warn_only_has_no_next_step() -> None:
    m, _ = ladder(action="warn")
    m.update([train(OVER)])
    assert stage(m) == "warned" and next_step(m) == (None, None)


def test_reasons_say_whole_seconds_on_a_real_clock() -> None:
    """A poll lands a few milliseconds late: the log said "for 10.0554s"; it says "for 10s"."""
    m, clock = ladder(term_after=10, kill_grace=30)
    m.update([train(OVER)])
    clock.advance(10.0554)
    [step] = m.update([train(OVER)])
    assert step.kind == "term" and "for 10s: SIGTERM" in step.reason, step.reason
