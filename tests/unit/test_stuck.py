"""The `stuck` verdict (hang.stuck_ranks) from heartbeat sequences: every process's heartbeats,
one every 0.5 s as the hook sends them (elastic_supervisor_hook.worker.Beater.heartbeat),
folded through the channel's own record keeping (heartbeats.updated), then judged at the end.

Each process is a function of the time t (seconds since the job's start) that returns what its
heartbeat says then: the position of its main thread, its I/O bytes, its completed collectives
(in all and since the last init) and its current wait."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from supervisor.decide.beats import Beat
from supervisor.decide.hang import STUCK_FLOOR_S, HangSettings, Stuck, assess
from supervisor.heartbeats import updated

S = HangSettings(silence_s=3.0, stall_s=1800.0)
HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
LISTED = dict.fromkeys(HOSTS, 0.0)
STEP_S = 0.1  # a healthy step: a few collectives, then 0.1 s of compute
LINE = "train.py:88:40"  # the main thread's position inside its step (a C call: loss.item())
ALLREDUCE = "horovod/torch/mpi_ops.py:1148:20"  # inside synchronize: waiting in a collective
Behaviour = Callable[[float], dict[str, Any]]


def training(t: float, since: float = 0.0) -> dict[str, Any]:
    """A healthy process at time t: collectives complete every step, the position moves."""
    steps = int((t - since) / STEP_S)
    return {"done": 100 + 4 * steps, "dc": 4 * steps, "pos": f"train.py:{80 + steps % 9}:10",
            "io": 5000, "wait": None, "in": None}


def healthy(t: float) -> dict[str, Any]:
    return training(t)


def stops_at(t0: float, **still: Any) -> Behaviour:
    """Trains until t0, then its main thread stands still (at LINE unless `still` says)."""
    def at(t: float) -> dict[str, Any]:
        if t < t0:
            return training(t)
        return {**training(t0), "pos": LINE, **still}
    return at


def waits_from(t0: float, done_extra: int = 0) -> Behaviour:
    """Trains until t0, then waits in the next collective for good (its peer never comes);
    `done_extra`: collectives it completed beyond its peers before that."""
    def at(t: float) -> dict[str, Any]:
        if t < t0:
            return training(t)
        base = training(t0)
        return {**base, "done": base["done"] + done_extra, "dc": base["dc"] + done_extra,
                "pos": ALLREDUCE, "wait": round(t - t0, 3), "in": "c"}
    return at


def play(processes: dict[str, Behaviour], until: float, *, silent: dict[str, tuple[float, float]]
         | None = None) -> list[Beat]:
    """Each process's heartbeats from t=0 to `until` through heartbeats.updated; `silent`: host ->
    (from, to): no heartbeat arrives in that window (the GIL held, datagrams lost)."""
    beats: dict[str, Beat | None] = dict.fromkeys(processes)
    for i, (host, behaviour) in enumerate(processes.items()):
        t = i * 0.13  # the processes' heartbeats are not in step
        while t <= until:
            gap = (silent or {}).get(host)
            if gap is None or not gap[0] <= t < gap[1]:
                body = {"t": "hb", "s": host, "n": 1, "host": host, "pid": 100 + i, "lr": 0,
                        "rank": i, "size": len(processes), "inits": 1, **behaviour(t)}
                beats[host] = updated(beats[host], body, (host, 4000), t)
            t += 0.5
    return [b for b in beats.values() if b is not None]


def stuck(beats: list[Beat], now: float, settings: HangSettings = S,
          watched: dict[str, float] = LISTED) -> tuple[Stuck, ...]:
    verdict = assess(beats, watched, started_at=0.0, settings=settings, now=now)
    return verdict.stuck


def named(found: tuple[Stuck, ...]) -> list[tuple[str, int | None]]:
    return [(k.host, k.rank) for k in found]


STOP = 30.0  # when the fault strikes, after 30 s of training (60 step times of history)


@pytest.mark.parametrize(("processes", "until", "expected"), [
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                  HOSTS[2]: stops_at(STOP)}, STOP + 21, [(HOSTS[2], 2)],
                 id="a rank's main thread stops outside any collective, the others wait: stuck"),
    pytest.param({HOSTS[0]: stops_at(STOP), HOSTS[1]: waits_from(STOP + 0.05),
                  HOSTS[2]: waits_from(STOP + 0.08)}, STOP + 21, [(HOSTS[0], 0)],
                 id="the same for rank 0"),
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                  HOSTS[2]: stops_at(STOP)}, STOP + 19, [],
                 id="not before the threshold (20 s)"),
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05, done_extra=3),
                  HOSTS[1]: waits_from(STOP + 0.08, done_extra=3),
                  HOSTS[2]: waits_from(STOP)}, STOP + 21, [(HOSTS[2], 2)],
                 id="a main thread that never returned from a collective its peers completed: "
                    "stuck (Horovod's background thread finished it)"),
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                  HOSTS[2]: waits_from(STOP)}, STOP + 60, [],
                 id="everybody in the same collective (an NCCL hang everywhere): nobody to "
                    "name, the stall rule's"),
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                  HOSTS[2]: stops_at(STOP, pos="elastic_supervisor_hook/x.py:1:1")},
                 STOP + 21, [(HOSTS[2], 2)], id="wherever it stands"),
    pytest.param({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: healthy,
                  HOSTS[2]: stops_at(STOP)}, STOP + 21, [],
                 id="another process is still busy (not waiting): training is not blocked on it"),
    pytest.param({HOSTS[0]: stops_at(STOP), HOSTS[1]: stops_at(STOP),
                  HOSTS[2]: stops_at(STOP)}, STOP + 60, [],
                 id="nobody waits in a collective (all stopped): the stall rule's"),
])
def test_stuck_ranks_are_named(processes: dict[str, Behaviour], until: float,
                               expected: list[tuple[str, int]]) -> None:
    assert named(stuck(play(processes, until), until)) == expected


def test_the_event_text_says_where_the_main_thread_stands_and_what_the_others_do() -> None:
    found = stuck(play({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                        HOSTS[2]: stops_at(STOP)}, STOP + 25), STOP + 25)
    assert len(found) == 1
    k = found[0]
    assert k.pid == 102 and k.still_s == pytest.approx(25, abs=0.6) and k.waiting == 2
    assert k.threshold_s == STUCK_FLOOR_S
    assert k.detail.startswith("process 102 (rank 2): its main thread has not moved for 25s")
    assert "outside any collective, with no I/O, while 2 peer process(es) waited in a " \
           "collective (at least 2" in k.detail
    assert "stuck after 20s" in k.detail


def test_a_stuck_rank_names_its_frames_once_the_hook_sends_them() -> None:
    """The hook adds its main thread's innermost frames once its position did not change since
    the last heartbeat."""
    where = ["torch/_tensor.py:1020 item", "train.py:88 train", "train.py:120 <module>"]
    beats = play({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: waits_from(STOP + 0.08),
                  HOSTS[2]: stops_at(STOP, where=where)}, STOP + 21)
    (k,) = stuck(beats, STOP + 21)
    assert k.where == tuple(where)
    assert "(at torch/_tensor.py:1020 item; train.py:88 train; train.py:120 <module>)" in k.detail


@pytest.mark.parametrize(("rank0", "why"), [
    pytest.param(lambda t: {**training(STOP), "pos": "torch/serialization.py:650:8",
                            "io": 5000 + int((t - STOP) * 300e6)} if t >= STOP else training(t),
                 "a 90 s checkpoint: its position stays in the write, its I/O grows",
                 id="checkpoint"),
    pytest.param(lambda t: {**training(STOP), "pos": f"eval.py:{int(t * 7) % 50}:{int(t * 3)}"}
                 if t >= STOP else training(t),
                 "90 s of Python-only evaluation: its position moves", id="evaluation"),
])
def test_a_rank_that_works_while_the_others_wait_is_not_stuck(rank0: Behaviour,
                                                               why: str) -> None:
    beats = play({HOSTS[0]: rank0, HOSTS[1]: waits_from(STOP + 0.05),
                  HOSTS[2]: waits_from(STOP + 0.08)}, STOP + 90)
    assert stuck(beats, STOP + 90) == (), why


def test_a_slow_first_batch_is_not_stuck() -> None:
    """Rank 0 spends 12 s before its first batch (warm-up, a cold cache) while the others wait
    in the first allreduce: no history of step times yet, the floor (20 s) holds."""
    first = {HOSTS[0]: lambda t: {**training(0), "pos": LINE} if t < 12 else training(t, 12),
             HOSTS[1]: lambda t: {**waits_from(0)(t), "done": 1, "dc": 0} if t < 12
             else training(t, 12)}
    assert stuck(play(first, 11.9), 11.9) == ()
    assert stuck(play(first, 14), 14) == ()


def test_a_gc_pause_is_silence_not_stuck() -> None:
    """A 5 s garbage-collector pause holds the GIL: the heartbeat thread cannot run, so the
    process is silent (the Hung rule's, with its second signal), never stuck."""
    beats = play({HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: stops_at(STOP)}, STOP + 25,
                 silent={HOSTS[1]: (STOP + 20, STOP + 25.1)})
    assert stuck(beats, STOP + 25) == ()


def test_the_threshold_follows_the_step_time() -> None:
    """Steps of 10 s (one long GPU kernel each): auto gives 4 x the p99 step (40 s), so a main
    thread that stood 30 s in its kernel is not stuck; past 40 s it is."""
    def slow(t: float, since: float = 0.0) -> dict[str, Any]:
        steps = int((t - since) / 10)
        return {"done": 100 + 4 * steps, "dc": 4 * steps, "pos": LINE, "io": 5000,
                "wait": None, "in": None}

    def slow_waiting(t: float) -> dict[str, Any]:
        base = slow(min(t, 120.0))
        return base if t < 120.05 else {**base, "pos": ALLREDUCE, "wait": t - 120.05,
                                        "in": "c"}

    procs = {HOSTS[0]: lambda t: slow(min(t, 120.0)), HOSTS[1]: slow_waiting}
    assert stuck(play(procs, 150), 150) == ()
    (k,) = stuck(play(procs, 162), 162)
    assert k.threshold_s == pytest.approx(40, abs=1)


def after_a_reset(behaviour: Behaviour, at: float = 10.0, joiner_s: float = 8.0) -> Behaviour:
    """`behaviour` with a reset at `at` (an init), after which the new world's first collective
    waits `joiner_s` for a joiner still importing or tracing; it trains on after that."""
    def at_t(t: float) -> dict[str, Any]:
        if t < at:
            return behaviour(t)
        reset = behaviour(at)
        if t < at + joiner_s:
            return {**reset, "inits": 2, "done": reset["done"] + 1, "dc": 0, "pos": ALLREDUCE,
                    "wait": round(t - at, 3), "in": "c"}
        now = behaviour(t)
        return {**now, "inits": 2, "done": now["done"] + 1, "dc": now["dc"] - reset["dc"]}
    return at_t


def test_the_wait_for_a_joiner_after_a_reset_is_not_a_step_time() -> None:
    """The TensorFlow tour's shape (issue 38): after a reset the new world's first collective
    waits 8 s for a replacement still tracing its step. That interval has no init inside it,
    but it is no step time: counted, it made the threshold 32 s and the stuck verdict late."""
    procs = {HOSTS[0]: after_a_reset(waits_from(STOP + 0.05)),
             HOSTS[1]: after_a_reset(waits_from(STOP + 0.08)),
             HOSTS[2]: after_a_reset(stops_at(STOP))}
    (k,) = stuck(play(procs, STOP + 21), STOP + 21)
    assert (k.host, k.threshold_s) == (HOSTS[2], STUCK_FLOOR_S)


def test_a_fixed_threshold() -> None:
    procs = {HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: stops_at(STOP)}
    fixed = HangSettings(silence_s=3.0, stall_s=1800.0, stuck_s=8.0)
    assert named(stuck(play(procs, STOP + 9), STOP + 9, fixed)) == [(HOSTS[1], 1)]
    assert stuck(play(procs, STOP + 9), STOP + 9) == (), "auto: 20 s"


def test_an_older_hook_and_an_unwatched_host_are_never_named() -> None:
    def old(t: float) -> dict[str, Any]:
        return {k: v for k, v in stops_at(STOP)(t).items() if k not in ("pos", "io", "dc")}

    procs = {HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: old}
    assert stuck(play(procs, STOP + 30), STOP + 30) == ()
    procs = {HOSTS[0]: waits_from(STOP + 0.05), HOSTS[1]: stops_at(STOP)}
    assert stuck(play(procs, STOP + 30), STOP + 30, watched={HOSTS[0]: 0.0}) == (), \
        "a host being scaled in is not judged"


def test_a_recovery_pause_is_not_a_step_time() -> None:
    """A 15 s pause that spans a reset (an init: a fault, a worker joining) right before the
    fault must not raise the threshold to a minute (4 x 15 s): only intervals without an
    init between them count as steps."""
    def recovered(t: float) -> dict[str, Any]:
        if t < 30:
            return training(t)
        if t < 45:  # the survivors wait in the rendezvous of a reset
            return {**training(30), "pos": ALLREDUCE, "wait": t - 30, "in": "i"}
        return {**training(t, 15), "inits": 2}

    def then(after: Behaviour) -> Behaviour:
        return lambda t: recovered(t) if t < 60 else {**after(t), "inits": 2}

    procs = {HOSTS[0]: then(waits_from(60.05)), HOSTS[1]: then(stops_at(60))}
    (k,) = stuck(play(procs, 81), 81)
    assert k.host == HOSTS[1] and k.threshold_s == STUCK_FLOOR_S
