"""Slow but alive ranks (issue 42): the hook times each step outside and inside collectives,
the supervisor names a host whose own work is slower than the others' (stragglers.py), and
moves it when the world trains faster without it (slowranks.py, leaving.py's move ahead)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from supervisor.datagrams import defect
from supervisor.decide import fleet, on, quarantine, stragglers
from supervisor.decide.beats import Beat
from supervisor.decide.core import manage
from supervisor.decide.plan import Note
from supervisor.decide.script import CreateWorker
from supervisor.heartbeats import updated
from supervisor.hook.elastic_supervisor_hook.worker import (
    LINK_ACTIVE_MS,
    LINK_READINGS,
    MAX_LINKS,
    STEP_SKIP,
    Connection,
    LinkTimes,
    Progress,
    peer_links,
    peer_rtts,
    tcp_rtt,
)
from supervisor.operate import render, status
from supervisor.workers import pod_name
from tests.unit import shapes
from tests.unit.test_core import (
    JOB,
    KEPT,
    LEAVING,
    LISTED,
    NODES,
    NOW,
    OWNERS,
    PODS,
    WALL,
    beat,
    ip,
    script,
    seen,
    worker,
)

SLOW = stragglers.Settings(factor=2.0, seconds=30.0, moves=2, window_s=3600.0)
W0, W0B = pod_name(JOB, 0, 1), pod_name(JOB, 0, 2)
THREE_NODES = {**NODES, "node-2": shapes.node("node-2")}


def timed(slot: int, out_s: float, *, size: int = 2, wait_s: float = 0.004, n: int = 31,
          **kw: Any) -> Beat:
    """Worker `slot`'s process as its heartbeat shows it: rank `slot` of `size`, its step's
    mean time outside collectives `out_s` and inside `wait_s` over `n` steps."""
    return beat(slot, rank=slot, size=size, step_out_s=out_s, step_wait_s=wait_s, step_n=n,
                **kw)


def at(beats: Any, now: float) -> tuple[Beat, ...]:
    """`beats` as heard half a second before `now`."""
    return tuple(replace(b, last_seen=now - 0.5) for b in beats)


# -- the hook: each step's time outside and inside collectives ---------------------------------

def test_the_hook_splits_each_step_into_its_own_work_and_its_wait_for_the_peers() -> None:
    """Steps of 30 ms of compute, then 10 ms (then 70 ms) in the gradients' collective; two
    overlapping collectives (TensorFlow's executor) count once; the first STEP_SKIP steps of a
    new world are not timed; an init starts afresh."""
    now = [100.0]
    p = Progress(clock=lambda: now[0])

    def step(compute: float, waits: float) -> None:
        now[0] += compute
        a, b = object(), object()
        p.begin(a, "c")
        p.begin(b, "c")  # a second collective in flight at once: one wait
        now[0] += waits / 2
        p.end(b, "c")
        now[0] += waits / 2
        p.end(a, "c")
        p.step()

    for _ in range(STEP_SKIP + 1):
        step(0.030, 0.010)
    assert p.step_times() is None, "the first step has no start, the next ones are skipped"
    for _ in range(10):
        step(0.030, 0.010)
    out, wait, n = p.step_times()  # type: ignore[misc]
    assert (out, wait, n) == (pytest.approx(0.030), pytest.approx(0.010), 10)
    for _ in range(31):
        step(0.030, 0.070)  # a peer got slow: this one waits longer, its own work the same
    out, wait, n = p.step_times()  # type: ignore[misc]
    assert (out, wait, n) == (pytest.approx(0.030), pytest.approx(0.070), 31)
    token = object()
    p.begin(token, "i")
    now[0] += 5.0
    p.end(token, "i")
    assert p.step_times() is None, "a new world is timed afresh"


def test_a_cpu_quota_that_stalls_every_fourth_step_weighs_on_the_mean() -> None:
    """Under a CFS quota a process runs a few steps at full speed, then waits out the rest of
    the period: the mean per step shows the slowdown, a median would not."""
    now = [0.0]
    p = Progress(clock=lambda: now[0])
    for i in range(STEP_SKIP + 1 + 40):
        now[0] += 0.079 if i % 4 == 3 else 0.009
        p.step()
    out, _, n = p.step_times()  # type: ignore[misc]
    # the slowest tenth (3 of 31) left out: 5 of the 8 slow steps count
    assert n == 31 and out == pytest.approx((23 * 0.009 + 5 * 0.079) / 28, rel=0.05)
    assert out > 2 * 0.009


def test_one_long_pause_in_the_window_is_left_out() -> None:
    """A 12 s checkpoint (or evaluation, or GC) among 30 steps of 0.2 s: not a slow worker."""
    now = [0.0]
    p = Progress(clock=lambda: now[0])
    for i in range(STEP_SKIP + 1 + 31):
        now[0] += 12.0 if i == 20 else 0.2
        p.step()
    out, _, _ = p.step_times()  # type: ignore[misc]
    assert out == pytest.approx(0.2)


def test_a_new_worlds_one_slow_start_is_left_out_of_a_short_window() -> None:
    """12 steps since the init, the first of them 10x (bench stragglers, 2026-11-30: a healthy
    worker measured 2.02x three seconds after its first step, with 8 steps and none left out)."""
    now = [0.0]
    p = Progress(clock=lambda: now[0])
    for i in range(STEP_SKIP + 1 + stragglers.MIN_STEPS):
        now[0] += 0.5 if i == STEP_SKIP + 1 else 0.05
        p.step()
    out, _, n = p.step_times()  # type: ignore[misc]
    assert (n, out) == (stragglers.MIN_STEPS, pytest.approx(0.05))


def test_a_wait_forgotten_with_a_failed_graph_is_not_counted_as_a_wait() -> None:
    now = [0.0]
    p = Progress(clock=lambda: now[0])
    lost = object()
    p.begin(lost, "c")
    p.forget(lambda t: t is lost)
    assert p.colls == 0
    for _ in range(STEP_SKIP + 3):
        now[0] += 0.05
        p.step()
    out, wait, _ = p.step_times()  # type: ignore[misc]
    assert (out, wait) == (pytest.approx(0.05), 0.0)


def test_the_heartbeat_carries_the_step_times_and_the_supervisor_reads_them() -> None:
    body = {"t": "hb", "s": "abc", "n": 1, "run": "1", "host": "10.0.0.1", "pid": 7, "lr": 0,
            "rank": 1, "size": 3, "so": 0.125, "sw": 0.004, "sn": 31}
    b = updated(None, body, ("10.0.0.1", 5000), 10.0)
    assert b is not None and (b.step_out_s, b.step_wait_s, b.step_n) == (0.125, 0.004, 31)
    older = updated(None, {k: v for k, v in body.items() if k not in ("so", "sw", "sn")},
                    ("10.0.0.1", 5000), 10.0)
    assert older is not None and (older.step_out_s, older.step_n) == (None, 0)


# -- the measure --------------------------------------------------------------------------------

def test_a_host_is_measured_against_the_median_of_the_others() -> None:
    beats = [timed(0, 0.030, size=4), timed(1, 0.032, size=4), timed(2, 0.031, size=4),
             timed(3, 0.095, size=4)]
    m = stragglers.measure(beats, NOW, 3.0)
    assert m is not None
    slow = m["10.1.0.13"]
    assert (slow.out_s, slow.median_s, slow.ranks, slow.size) == (0.095, 0.031, (3,), 4)
    assert stragglers.is_slow(slow, SLOW)
    assert not any(stragglers.is_slow(x, SLOW) for h, x in m.items() if h != "10.1.0.13")


def test_a_job_wide_slowdown_is_no_straggler() -> None:
    beats = [timed(i, 0.090 + i * 0.002, size=3) for i in range(3)]
    m = stragglers.measure(beats, NOW, 3.0)
    assert m is not None and not any(stragglers.is_slow(x, SLOW) for x in m.values())


def test_tiny_steps_are_noise_below_the_least_excess() -> None:
    beats = [timed(0, 0.001, size=2), timed(1, 0.004, size=2)]  # 4x, but 3 ms
    m = stragglers.measure(beats, NOW, 3.0)
    assert m is not None and not stragglers.is_slow(m["10.1.0.11"], SLOW)


@pytest.mark.parametrize(("why", "beats"), [
    ("a process has not timed enough steps since the last init (a new world)",
     [timed(0, 0.03), timed(1, 0.09, n=stragglers.MIN_STEPS - 1)]),
    ("a process of the world is silent", [timed(0, 0.03), timed(1, 0.09, last_seen=NOW - 5)]),
    ("a rank is missing", [timed(0, 0.03, size=3), timed(1, 0.09, size=3)]),
    ("the sizes differ (a reset under way)", [timed(0, 0.03, size=2), timed(1, 0.09, size=3)]),
    ("an older hook times nothing", [timed(0, 0.03), beat(1, rank=1, size=2)]),
    ("one host only", [timed(0, 0.03, size=1)]),
])
def test_an_unsettled_world_is_not_measured(why: str, beats: list[Beat]) -> None:
    assert stragglers.measure(beats, NOW, 3.0) is None, why


def test_a_host_of_two_processes_is_judged_by_its_slowest_against_the_other_hosts() -> None:
    two = [beat(0, rank=0, size=4, step_out_s=0.03, step_wait_s=0.004, step_n=31),
           replace(beat(0, rank=1, size=4, step_out_s=0.09, step_wait_s=0.004, step_n=31),
                   sender="s0b", local_rank=1)]
    others = [replace(timed(1, 0.030, size=4), rank=2),
              replace(timed(1, 0.031, size=4), rank=3, sender="s1b", local_rank=1)]
    m = stragglers.measure([*two, *others], NOW, 3.0)
    assert m is not None
    x = m["10.1.0.10"]
    assert (x.out_s, x.median_s, x.ranks) == (0.09, pytest.approx(0.0305), (0, 1))


@pytest.mark.parametrize(("size", "factor", "pays"), [
    (2, 1.5, False),  # 2 ranks at 1/1.5 of the pace against 1 rank at full pace
    (2, 3.0, True),
    (3, 1.4, False),
    (3, 1.6, True),
    (8, 1.2, True),
])
def test_a_move_pays_when_the_world_without_it_trains_faster(size: int, factor: float,
                                                           pays: bool) -> None:
    x = stragglers.Slow("h", (0,), 0.100 * factor, 0.100, 0.0, size, NOW)
    assert x.pays() is pays


# -- the watch over time --------------------------------------------------------------------------

def test_a_host_slow_for_the_seconds_is_named_once_and_over_once_back() -> None:
    slow = (timed(0, 0.09), timed(1, 0.03))
    w = stragglers.Watch()
    ch = stragglers.watch(w, at(slow, NOW), NOW, SLOW, 3.0)
    assert ch.named == () and ch.watch.since == {"10.1.0.10": NOW}
    ch = stragglers.watch(ch.watch, at(slow, NOW + 29.9), NOW + 29.9, SLOW, 3.0)
    assert ch.named == ()
    ch = stragglers.watch(ch.watch, at(slow, NOW + 30), NOW + 30, SLOW, 3.0)
    assert [x.host for x in ch.named] == ["10.1.0.10"] and ch.named[0].since == NOW
    ch = stragglers.watch(ch.watch, at(slow, NOW + 31), NOW + 31, SLOW, 3.0)
    assert ch.named == () and "10.1.0.10" in ch.watch.named, "said once"
    assert ch.watch.worst == pytest.approx(3.0)
    # A reset: the world unsettled changes nothing either way.
    reset = at((timed(0, 0.09, n=2), timed(1, 0.03)), NOW + 32)
    assert stragglers.watch(ch.watch, reset, NOW + 32, SLOW, 3.0).watch == ch.watch
    pace = at((timed(0, 0.031), timed(1, 0.03)), NOW + 40)
    back = stragglers.watch(ch.watch, pace, NOW + 40, SLOW, 3.0)
    assert [x.host for x in back.over] == ["10.1.0.10"] and back.watch.named == {}


def test_a_slowness_that_does_not_last_the_seconds_is_never_named() -> None:
    w = stragglers.Watch()
    cleared = []
    for t, out in ((0, 0.09), (20, 0.09), (25, 0.03), (40, 0.09), (65, 0.09)):
        beats = at((timed(0, out), timed(1, 0.03)), NOW + t)
        ch = stragglers.watch(w, beats, NOW + t, SLOW, 3.0)
        assert ch.named == (), t
        assert [x.host for x in ch.suspected] == (["10.1.0.10"] if t in (0, 40) else []), t
        cleared += [(t, x.since) for x in ch.cleared]
        w = ch.watch
    assert w.since == {"10.1.0.10": NOW + 40}
    assert cleared == [(25, NOW)], "the suspicion that did not last, said"


def test_once_slow_a_host_stays_slow_within_the_band_below_the_factor() -> None:
    """A slowdown measured around the factor comes and goes with every few steps: once over
    2.0 it stays slow down to 1.75 (HOLD), and only below that is it cleared."""
    w = stragglers.Watch()
    for t, out in ((0, 0.0605), (10, 0.057), (20, 0.053), (30, 0.0595)):
        ch = stragglers.watch(w, at((timed(0, out), timed(1, 0.03)), NOW + t), NOW + t, SLOW,
                              3.0)
        w = ch.watch
    assert [x.host for x in ch.named] == ["10.1.0.10"], "1.9x, 1.77x: within the band"
    fresh = stragglers.watch(stragglers.Watch(), at((timed(0, 0.057), timed(1, 0.03)), NOW),
                             NOW, SLOW, 3.0)
    assert fresh.watch.since == {}, "1.9x is not slow to begin with"
    below = stragglers.watch(w, at((timed(0, 0.052), timed(1, 0.03)), NOW + 40), NOW + 40,
                             SLOW, 3.0)
    assert [x.host for x in below.over] == ["10.1.0.10"], "1.73x: below the band"


def test_a_named_host_gone_from_a_settled_world_is_gone_not_over() -> None:
    w = stragglers.Watch(named={"10.1.0.10": stragglers.Slow(
        "10.1.0.10", (0,), 0.09, 0.03, 0.0, 2, NOW - 40)})
    three = (replace(timed(1, 0.03), rank=0), replace(timed(2, 0.03), rank=1))
    ch = stragglers.watch(w, at(three, NOW), NOW, SLOW, 3.0)
    assert [x.host for x in ch.gone] == ["10.1.0.10"] and ch.over == () and not ch.watch.named


def test_the_watch_off_forgets_what_it_named() -> None:
    w = stragglers.Watch(named={"h": stragglers.Slow("h", (0,), 0.09, 0.03, 0.0, 2, NOW)},
                         moved=(WALL,), moved_ranks=frozenset({1}), moving={"p": "slow"})
    beats = at((timed(0, 0.09), timed(1, 0.03)), NOW)
    ch = stragglers.watch(w, beats, NOW, replace(SLOW, factor=0.0), 3.0)
    assert ch.watch.named == {} and [x.host for x in ch.over] == ["h"]
    assert ch.watch.moving == {}, "no move goes on while the watch is off"
    assert (ch.watch.moved, ch.watch.moved_ranks) == ((WALL,), {1}), "the moves made stay"


def test_the_move_budget_holds_moves_within_the_window() -> None:
    s = replace(SLOW, moves=2, window_s=100.0)
    x = stragglers.Slow("h", (1,), 0.09, 0.03, 0.0, 3, NOW)
    w = stragglers.moved(stragglers.Watch(), x, "a", "slow", s=s, wall=WALL)
    assert stragglers.may_move(w, s, WALL + 1)
    w = stragglers.moved(w, x, "b", "slow", s=s, wall=WALL + 1)
    assert not stragglers.may_move(w, s, WALL + 99)
    assert stragglers.may_move(w, s, WALL + 100.5), "the first move left the window"
    assert not stragglers.may_move(stragglers.Watch(), replace(s, moves=0), WALL)


def test_the_move_budget_outlives_the_supervisor_through_the_state() -> None:
    """A supervisor killed after two moves (or a standby that takes over) starts from the state
    with both moves in the window and the rank moved: no third move, no rank moved again."""
    s = replace(SLOW, moves=2, window_s=100.0)
    x = stragglers.Slow("h", (1,), 0.09, 0.03, 0.0, 3, NOW)
    w = stragglers.moved(stragglers.moved(stragglers.Watch(), x, "a", "slow", s=s, wall=WALL),
                         x, "b", "slow", s=s, wall=WALL + 1)
    stored = json.loads(json.dumps({"slowMoves": stragglers.moves_to_dict(w)}))
    back = on.initial(None, stored).slow
    assert (back.moved, back.moved_ranks) == (w.moved, w.moved_ranks)
    assert not stragglers.may_move(back, s, WALL + 50)
    assert stragglers.may_move(back, s, WALL + 101.5)
    assert back.named == {} and back.moving == {}, "what is slow now is measured again"
    assert on.initial(None, {}).slow == stragglers.Watch(), "a state from before: no moves"


# -- the pass: named, moved ahead, gone; reported only ------------------------------------------

MOVING = replace(LEAVING, slow=SLOW)
SLOW_BEATS = (timed(0, 0.090), timed(1, 0.030))


def passes(c: Any, st: Any, beats: Any = SLOW_BEATS, pods: Any = None, **kw: Any) -> list[Any]:
    """Passes at NOW and NOW + 30 (the host slow since NOW is named then); the last one."""
    first = manage(c, seen(pods, beats=at(beats, NOW), nodes=THREE_NODES, **kw), st)
    assert script(first) == [("say", "stragglers.widest"), ("say", "worker.slow_suspected")], (
        "the margin and the evidence, in the log")
    return manage(first.core, seen(pods, beats=at(beats, NOW + 30), nodes=THREE_NODES,
                                   now=NOW + 30, **kw), st)


def test_a_slow_worker_is_said_and_its_replacement_placed_ahead_off_its_node() -> None:
    p = passes(KEPT, MOVING)
    assert script(p) == [("say", "worker.slow"), ("say", "worker.moving"), ("create", W0B)]
    said = p.todo[0]
    assert isinstance(said, Note) and said.k8s is not None and said.k8s.reason == "WorkerSlow"
    assert said.k8s.type == "Warning" and "3.0x" in said.k8s.note and W0 in said.k8s.note
    assert said.fields["node"] == "node-0" and said.fields["ranks"] == [0]
    create = p.todo[2]
    assert isinstance(create, CreateWorker) and create.ahead_of == W0
    assert "node-0" in create.lost_nodes, "kept off its node: it would be slow there too"
    assert p.core.slow.moving.keys() == {W0} and p.core.moving == {W0: W0B}
    assert p.core.fleet == KEPT.fleet, "it trains on until its replacement runs"
    # The replacement runs: the straggler leaves gracefully; its node counts once.
    ahead = worker(0, 2, node="node-2")
    ahead["status"]["podIP"] = "10.1.0.99"
    pods = {**PODS, W0B: ahead}
    out = manage(replace(p.core, expected={}), seen(pods, beats=at(SLOW_BEATS, NOW + 40),
                                                    nodes=THREE_NODES, now=NOW + 40), MOVING)
    assert script(out) == [("say", "worker.leaving"), ("save",), ("budget", 2)]
    assert out.core.leaving[W0].why == "Straggler"
    assert out.core.fleet is not None and out.core.fleet.slots[0].incarnation == 2
    later = manage(out.core, seen(pods, beats=at(SLOW_BEATS, NOW + 41), nodes=THREE_NODES,
                                  now=NOW + 41), MOVING)
    assert later.core.quarantine.failed == {"node-0": (WALL,)}
    assert later.core.slow.moving == {}, "moved: its slot is at the next incarnation"


def test_a_straggler_back_to_pace_before_its_replacement_runs_keeps_its_place() -> None:
    p = passes(KEPT, MOVING)
    pending = worker(0, 2)
    pending["spec"].pop("nodeName")
    pending["status"] = {"phase": "Pending"}
    back = (timed(0, 0.031), timed(1, 0.030))
    out = manage(replace(p.core, expected={}), seen(
        {**PODS, W0B: pending}, beats=at(back, NOW + 35), nodes=THREE_NODES, now=NOW + 35),
        MOVING)
    assert script(out) == [("say", "worker.slow_over"), ("delete", W0B, None),
                           ("say", "worker.move_cancelled")]
    assert out.core.slow.moving == {} and out.core.fleet == KEPT.fleet


def test_report_only_says_it_once_and_moves_nothing() -> None:
    p = passes(KEPT, replace(MOVING, slow=replace(SLOW, moves=0)))
    assert script(p) == [("say", "worker.slow"), ("say", "worker.slow_kept")]
    assert "SLOW_MOVES is 0" in p.todo[1].fields["reason"]  # type: ignore[union-attr]
    again = manage(p.core, seen(beats=at(SLOW_BEATS, NOW + 31), nodes=THREE_NODES, now=NOW + 31),
                   replace(MOVING, slow=replace(SLOW, moves=0)))
    assert script(again) == []


def test_a_straggler_the_world_is_faster_with_is_not_moved() -> None:
    """Two ranks, one 1.6x slow: one rank alone at full pace is slower than two at 1/1.6."""
    st = replace(MOVING, slow=replace(SLOW, factor=1.5))
    p = passes(KEPT, st, beats=(timed(0, 0.048), timed(1, 0.030)))
    assert script(p) == [("say", "worker.slow"), ("say", "worker.slow_kept")]
    assert "faster with it" in p.todo[1].fields["reason"]  # type: ignore[union-attr]


def test_a_rank_slow_again_on_another_host_after_a_move_is_not_moved_again() -> None:
    """Rank 0 slow on the host moved, then slow on the next one: its own work (its
    checkpoints, its logging) follows it; moving again would only spend the budget."""
    before = stragglers.Watch(moved_ranks=frozenset({0}), moved=(WALL - 600,))
    p = passes(replace(KEPT, slow=before), MOVING)
    assert script(p) == [("say", "worker.slow"), ("say", "worker.slow_kept")]
    assert "follows the rank" in p.todo[1].fields["reason"]  # type: ignore[union-attr]


def test_without_the_workers_to_own_a_straggler_is_only_said() -> None:
    p = passes(replace(KEPT, fleet=None, saved=None), MOVING)
    assert script(p) == [("say", "worker.slow"), ("say", "worker.slow_kept")]


def test_status_shows_the_slow_workers() -> None:
    w = stragglers.Watch(named={"10.1.0.10": stragglers.Slow(
        "10.1.0.10", (0,), 0.09, 0.03, 0.004, 2, NOW - 45)})
    s = status(JOB, "default", pods=PODS.values(),
               state={"slow": stragglers.to_list(w, NOW)}, scale=None, events=())
    assert s["slow"] == [{"host": "10.1.0.10", "kind": "work", "ranks": [0], "factor": 3.0,
                          "outMs": 90.0, "medianMs": 30.0, "forS": 45.0}]
    assert "SLOW WORKERS" in render(s) and "3.0x" in render(s)


def test_quarantine_counts_a_straggler_moved_off_a_node() -> None:
    ch = quarantine.step(quarantine.Quarantine(), [
        quarantine.Sign(quarantine.Kind.SLOW, "node-0", "u1", 0),
        quarantine.Sign(quarantine.Kind.SLOW, "node-0", "u2", 1)], WALL, quarantine.Settings(),
        usable=["node-0", "node-1"], placed={"node-1": 2}, need=2)
    assert ch.started == (("node-0", 2),)


# -- a slow link (the second case) ---------------------------------------------------------------

def test_the_hook_reads_only_links_to_other_machines() -> None:
    """Gloo's pairs to other pods count; loopback, the pod's own address (its other
    processes), the supervisor's and the rendezvous' endpoints, and what is not established do
    not."""
    conns = [Connection(5, ("10.1.0.10", 4000), ("10.1.0.11", 5000), "ESTABLISHED"),
             Connection(6, ("10.1.0.10", 4001), ("10.1.0.10", 5001), "ESTABLISHED"),
             Connection(7, ("127.0.0.1", 4002), ("127.0.0.1", 5002), "ESTABLISHED"),
             Connection(8, ("10.1.0.10", 4003), ("10.1.0.2", 7000), "ESTABLISHED"),
             Connection(9, ("10.1.0.10", 4004), ("10.1.0.12", 5000), "TIME_WAIT"),
             Connection(10, ("::ffff:10.1.0.10", 4005), ("::ffff:10.1.0.12", 5003),
                        "ESTABLISHED")]
    assert peer_links(conns, [("10.1.0.2", 7000)]) == {5: "10.1.0.11", 10: "10.1.0.12"}


def test_the_hook_sends_the_mean_of_the_fastest_active_link_per_peer() -> None:
    """An idle link keeps the round trip of its last transfer: only those that sent data within
    LINK_ACTIVE_MS count; per address the fastest; a heartbeat carries the means of the last
    LINK_READINGS readings per address, the MAX_LINKS fastest."""
    samples = [("10.1.0.11", 60_000, 10), ("10.1.0.11", 150, 20),
               ("10.1.0.12", 90, LINK_ACTIVE_MS + 1), ("10.1.0.12", 52_000, 5),
               ("10.1.0.13", 0, 5)]  # no sample yet
    assert peer_rtts(samples) == {"10.1.0.11": 150, "10.1.0.12": 52_000}
    times = LinkTimes()
    times.add({"10.1.0.11": 13_000})
    for _ in range(LINK_READINGS - 1):  # a narrowed link, short between two transfers
        times.add({"10.1.0.11": 1_000, "10.1.0.12": 200})
    assert times.means() == {"10.1.0.12": 0.2, "10.1.0.11": pytest.approx(2.5)}
    times.add({"10.1.0.11": 1_000})
    assert times.means()["10.1.0.11"] == 1.0, "the oldest reading is gone"
    for _ in range(LINK_READINGS):  # no link any more (a world of one): nothing stale is sent
        times.add({})
    assert times.means() == {}
    many = LinkTimes()
    many.add({f"10.2.0.{i}": 1000 + i for i in range(MAX_LINKS + 5)})
    assert list(many.means()) == [f"10.2.0.{i}" for i in range(MAX_LINKS)]


def test_the_hook_reads_the_kernels_round_trip_of_a_real_connection() -> None:
    """A TCP connection over loopback that just sent data: its smoothed round trip (the
    kernel's tcp_info) and how long since it sent; not for another remote, nor once closed."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        for _ in range(20):
            client.sendall(b"x" * 1000)
            peer.recv(4096)
        read = tcp_rtt(client.fileno(), "127.0.0.1")
        assert read is not None
        rtt_us, idle_ms = read
        assert 0 < rtt_us < 1_000_000 and idle_ms < 5_000
        assert tcp_rtt(client.fileno(), "10.9.9.9") is None, "its fd reused by another link"
        fd = client.fileno()
        client.close()
        assert tcp_rtt(fd, "127.0.0.1") is None
    finally:
        for s in (client, peer, server):
            s.close()


def test_the_heartbeat_carries_the_links_and_the_supervisor_reads_them() -> None:
    body = {"t": "hb", "s": "abc", "n": 1, "run": "1", "host": "10.0.0.1", "pid": 7, "lr": 0,
            "rt": {"10.0.0.3": 52.5, "10.0.0.2": 0.12}}
    assert defect(body) is None
    b = updated(None, body, ("10.0.0.1", 5000), 10.0)
    assert b is not None and b.link_rtt == (("10.0.0.2", pytest.approx(0.00012)),
                                            ("10.0.0.3", pytest.approx(0.0525)))
    for bad in ([["10.0.0.2", 1.0]], {"10.0.0.2": -1}, {"10.0.0.2": "1"},
                {f"10.0.{i // 250}.{i % 250}": 1.0 for i in range(65)}):
        d = defect({**body, "rt": bad})
        assert d is not None and d.field == "rt" and "milliseconds" in d.line, bad


def ring(slow: int | None, *, hosts: int = 3, rtt: float = 0.0002, extra: float = 0.060,
         step: float = 0.04, inits: int = 1) -> list[Beat]:
    """`hosts` one-process hosts in a ring, each sending to the next (Gloo's ring: one link
    each carries its data); host `slow`'s link adds `extra` to every round trip through it."""
    out = []
    for i in range(hosts):
        nxt = (i + 1) % hosts
        t = rtt + (extra if slow in (i, nxt) else 0.0)
        out.append(timed(i, step / 2, size=hosts, wait_s=step / 2, inits=inits,
                         source=(ip(i), 40000), link_rtt=((ip(nxt), t),)))
    return out


def test_a_host_whose_every_link_is_slow_is_told_from_its_neighbours() -> None:
    """In a ring of three each host measures one link, to the next; the slow host's two links
    (the one it sends on, the one its neighbour sends to it on) are slow, the third is fast:
    only the slow host has no fast link."""
    m = stragglers.measure(ring(1), NOW, 3.0)
    assert m is not None
    links = {x.host: x for x in m.values() if x.kind == stragglers.LINK}
    assert {h: round(x.out_s, 4) for h, x in links.items()} == {
        ip(0): 0.0002, ip(1): 0.0602, ip(2): 0.0002}
    assert [x.host for x in links.values() if stragglers.is_slow(x, SLOW)] == [ip(1)]
    assert links[ip(1)].key == f"{ip(1)}/link" and links[ip(1)].key in m
    assert not any(stragglers.is_slow(x, SLOW) for x in m.values()
                   if x.kind == stragglers.WORK), "nobody's own work is slower"


@pytest.mark.parametrize(("why", "beats"), [
    ("two hosts see the one link between them alike", ring(1, hosts=2)),
    ("every link a little slower (a busy network) is not one host's",
     ring(None, rtt=0.004)),
    ("a slow link of a millisecond or two is noise", ring(1, extra=0.002)),
])
def test_no_link_verdict_without_a_host_to_tell_apart(why: str, beats: list[Beat]) -> None:
    m = stragglers.measure(beats, NOW, 3.0)
    assert m is not None and not any(
        stragglers.is_slow(x, SLOW) for x in m.values() if x.kind == stragglers.LINK), why


def test_a_process_that_lies_about_a_link_cannot_get_its_peer_named() -> None:
    """A link counts for both ends, and a host's measure is its fastest: a forged slow round
    trip to a healthy peer only adds a slow link to a host that has a fast one."""
    beats = ring(None)
    liar = beats[0]
    beats[0] = replace(liar, link_rtt=(*liar.link_rtt, (ip(2), 5.0)))
    m = stragglers.measure(beats, NOW, 3.0)
    assert m is not None and not any(stragglers.is_slow(x, SLOW) for x in m.values())


def test_an_address_is_a_hosts_by_its_heartbeats_source_or_its_local_addresses() -> None:
    beats = ring(1)
    # host 2 sends from another address, but has its pod IP as a local address
    beats[2] = replace(beats[2], source=("10.9.0.1", 1), addrs=("127.0.0.1", ip(2)))
    assert stragglers.fastest_links(beats) == {ip(0): 0.0002, ip(1): pytest.approx(0.0602),
                                               ip(2): 0.0002}


@pytest.mark.parametrize(("size", "step", "best", "pays"), [
    (3, 0.090, 0.040, True),   # 3 ranks at 90 ms against 2 at 40 ms
    (3, 0.055, 0.040, False),  # 2 at 40 ms are slower than 3 at 55 ms
    (3, 0.090, 0.090, False),  # slow since the world formed: nothing to compare
    (16, 0.043, 0.040, False),  # 7.5 % slower: under LINK_SLOWER
    (16, 0.046, 0.040, True),
])
def test_a_link_move_pays_when_the_world_was_faster_before(size: int, step: float,
                                                           best: float, pays: bool) -> None:
    x = stragglers.Slow("h", (0,), 0.06, 0.0002, 0.0, size, NOW, stragglers.LINK, step, best)
    assert x.pays() is pays


def test_the_pace_is_the_worlds_fastest_step_and_a_new_world_starts_again() -> None:
    w = stragglers.Watch()
    for t, step in ((0, 0.045), (5, 0.040), (10, 0.120)):
        w = stragglers.watch(w, at(ring(None, step=step), NOW + t), NOW + t, SLOW, 3.0).watch
    assert w.pace is not None and w.pace.best_s == pytest.approx(0.040)
    reset = ring(None, step=0.120, inits=2)
    w = stragglers.watch(w, at(reset, NOW + 20), NOW + 20, SLOW, 3.0).watch
    assert w.pace is not None and w.pace.best_s == pytest.approx(0.120)


THREE = fleet.initial(3)
W1, W2 = pod_name(JOB, 1, 1), pod_name(JOB, 2, 1)
PODS3 = {**PODS, W2: worker(2)}
LISTED3 = {**LISTED, ip(2): W2}
KEPT3 = replace(KEPT, fleet=THREE, saved=THREE)


def seen3(beats: Any, t: float) -> Any:
    return seen(PODS3, beats=at(beats, NOW + t), nodes=THREE_NODES, now=NOW + t,
                listed_hosts=LISTED3, first_owner={**OWNERS, ip(2): "uid-" + W2},
                published="".join(f"{h}:1\n" for h in LISTED3))


def test_a_slow_link_is_said_and_its_worker_moved_when_the_world_was_faster() -> None:
    """Three workers at 40 ms a step; worker 1's link turns slow (60 ms more a round trip) and
    the world's step goes to 120 ms: said after the seconds as a slow link, and moved ahead
    off its node (no moved-ranks rule: the slowness is its machine's link)."""
    c = replace(KEPT3, slow=stragglers.Watch(moved_ranks=frozenset({1}), moved=(WALL - 600,)))
    p = manage(c, seen3(ring(None), -10), MOVING)
    assert p.core.slow.pace is not None and p.core.slow.pace.best_s == pytest.approx(0.04)
    p = manage(p.core, seen3(ring(1, step=0.12), 0), MOVING)
    assert ("say", "worker.slow_suspected") in script(p)
    assert ("say", "stragglers.widest_link") in script(p), "the margin, in the log"
    p = manage(p.core, seen3(ring(1, step=0.12), 30), MOVING)
    assert script(p)[:2] == [("say", "worker.slow"), ("say", "worker.moving")], script(p)
    said = p.todo[0]
    assert isinstance(said, Note) and said.k8s is not None and said.k8s.reason == "WorkerSlow"
    assert said.fields["kind"] == "link" and W1 in said.k8s.note and "round trip" in said.k8s.note
    create = p.todo[2]
    assert isinstance(create, CreateWorker) and create.ahead_of == W1
    assert "node-1" in create.lost_nodes
    assert p.core.slow.moved_ranks == {1}, "a link's move does not mark the rank"


def test_a_link_slow_since_the_world_formed_is_only_said() -> None:
    p = manage(KEPT3, seen3(ring(1, step=0.12), 0), MOVING)
    p = manage(p.core, seen3(ring(1, step=0.12), 30), MOVING)
    assert script(p) == [("say", "worker.slow"), ("say", "worker.slow_kept")]
    assert "fastest since it formed" in p.todo[1].fields["reason"]  # type: ignore[union-attr]


def test_a_slow_link_is_held_within_the_band_below_the_least_excess() -> None:
    """A narrowed link's fastest round trip comes and goes around the bar (4.5-6.3 ms measured
    on real nodes at 8 Mbit/s): once over 5 ms more it stays slow down to 3.75 ms more."""
    w = stragglers.Watch()
    for t, extra in ((0, 0.0062), (10, 0.0042), (20, 0.0040), (30, 0.0045)):
        ch = stragglers.watch(w, at(ring(1, extra=extra), NOW + t), NOW + t, SLOW, 3.0)
        w = ch.watch
    assert [x.key for x in ch.named] == [f"{ip(1)}/link"], "held within the band"
    fresh = stragglers.watch(stragglers.Watch(), at(ring(1, extra=0.0042), NOW), NOW, SLOW, 3.0)
    assert fresh.watch.since == {}, "4.2 ms more is not slow to begin with"
    below = stragglers.watch(w, at(ring(1, extra=0.0035), NOW + 40), NOW + 40, SLOW, 3.0)
    assert [x.key for x in below.over] == [f"{ip(1)}/link"], "3.5 ms more: below the band"


def test_steps_said_to_take_no_time_are_described_without_dividing_by_zero() -> None:
    """A heartbeat may say 0 s outside and inside (an odd or forged one): the link is still
    measured and said, never a crash of the pass."""
    w = stragglers.Watch()
    for t in (0, 30):
        ch = stragglers.watch(w, at(ring(1, step=0.0), NOW + t), NOW + t, SLOW, 3.0)
        w = ch.watch
    assert [x.key for x in ch.named] == [f"{ip(1)}/link"]
    assert "rank-steps/s" in stragglers.describe(ch.named[0]) and not ch.named[0].pays()
