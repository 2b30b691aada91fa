"""progress.py: the job's steps and goodput from heartbeats, as the channel records them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from supervisor.decide import progress
from supervisor.decide.beats import Beat
from supervisor.decide.progress import Progress, observe


@dataclass(frozen=True)
class P:
    """One training process at one pass: its sender, rank, world size, inits, steps,
    redone (and commits)."""

    sender: str
    rank: int | None
    size: int
    steps: int
    redone: int = 0
    inits: int = 1
    commits: int = 0
    moving: bool = True  # its collectives complete (else: the last one 10 s ago)


def beat(p: P, now: float) -> Beat:
    return Beat(sender=p.sender, host=f"10.0.0.{p.sender}", pid=1, local_rank=0,
                first_seen=0.0, last_seen=now, progress_at=now if p.moving else now - 10,
                rank=p.rank, size=p.size, inits=p.inits, steps=p.steps, redone=p.redone,
                commits=p.commits)


def run(passes: Iterable[tuple[float, list[P]]], desired: int = 2,
        start: Progress | None = None) -> Progress:
    """Passes at (epoch second, processes); the monotonic clock is the epoch less 1e9."""
    q = start or Progress()
    for t, ps in passes:
        q = observe(q, [beat(p, t - 1e9) for p in ps], desired=desired, now=t - 1e9, wall=t)
    return q


T0 = 1.8e9


def steady(t0: float, t1: float, step0: int, rate: float = 2.0, *, size: int = 2,
           senders: tuple[str, ...] = ("1", "2"), dt: float = 0.5,
           redone: int = 0) -> list[tuple[float, list[P]]]:
    """Both processes stepping at `rate` from `step0`, passes every `dt`."""
    out, t = [], t0
    while t <= t1 + 1e-9:
        s = step0 + round((t - t0) * rate)
        out.append((t, [P(x, i, size, s, redone) for i, x in enumerate(senders)]))
        t += dt
    return out


def test_steady_training_is_all_goodput() -> None:
    q = run(steady(T0, T0 + 60, 0))
    assert q.step == 120 and q.redone == 0
    assert q.goodput() == (pytest.approx(1.0), pytest.approx(1.0))
    assert q.rate() == pytest.approx(2.0)
    assert q.training() and q.world == 2
    # the window opens at the first step seen to grow (the first pass only shows where it is)
    assert q.since == T0 + 0.5
    assert q.productive_ws == pytest.approx(2 * 59.5) and q.lost_ws == pytest.approx(0)


def test_a_pause_longer_than_three_steps_is_lost_time_and_a_short_one_is_not() -> None:
    # 30 s, then nothing for 10 s (the job regroups), then 20 s more at the same step rate
    before = steady(T0, T0 + 30, 0)
    stalled = [(T0 + 30 + k, [P("1", 0, 2, 60), P("2", 1, 2, 60)]) for k in range(1, 10)]
    after = steady(T0 + 40, T0 + 60, 61)
    q = run(before + stalled + after)
    assert q.step == 101
    assert q.training_s == pytest.approx(49.5)  # from the first step seen to grow
    assert q.goodput()[0] == pytest.approx(49.5 / 59.5)
    assert q.lost_ws == pytest.approx(2 * 10.0)
    # a beat that skipped 1 s (two heartbeats) is training still
    q = run(steady(T0, T0 + 10, 0, dt=1.0) + steady(T0 + 11, T0 + 20, 22, dt=0.5))
    assert q.goodput()[1] == pytest.approx(1.0)


def test_a_smaller_world_trains_but_not_at_full_size() -> None:
    q = run(steady(T0, T0 + 20, 0) + steady(T0 + 20.5, T0 + 40, 41, size=1, senders=("1",)))
    good, good_any = q.goodput()
    assert good_any == pytest.approx(1.0)
    assert good == pytest.approx(20.5 / 40, abs=0.02)
    assert q.world == 1
    assert q.lost_ws == pytest.approx(19.5, abs=0.6)  # one process of two, for 19.5 s


def test_steps_computed_again_after_a_rollback_count_once_and_their_time_as_lost() -> None:
    # at step 40 the world fails; the state goes back to the commit at step 30: both processes
    # report 10 redone, then compute 31..40 again
    first = steady(T0, T0 + 20, 0)
    rolled = [(T0 + 20.5, [P("1", 0, 2, 40, 10, 2), P("2", 1, 2, 40, 10, 2)])]
    again = [(T0 + 21 + k * 0.5, [P("1", 0, 2, 41 + k, 10, 2), P("2", 1, 2, 41 + k, 10, 2)])
             for k in range(40)]
    q = run(first + rolled + again)
    assert q.redone == 10
    # positions 31..40 again add nothing; 41..70 are new
    assert q.step == 40 + (80 - 10 - 40)
    # no new step from T0 + 20 (position 40) to T0 + 26 (41): the failure and the 10 steps
    # computed again, for 2 processes
    assert q.lost_ws == pytest.approx(6 * 2)
    assert q.training_s == pytest.approx(19.5 + 14.5)  # T0+0.5..20 and T0+26..40.5


def test_a_new_rank_0_continues_from_its_own_count_and_a_joining_one_adds_nothing() -> None:
    first = steady(T0, T0 + 10, 0, senders=("1", "2"))  # 20 steps
    # "1" dies; "2" becomes rank 0 of a world of 1 (a reset), then "3" joins as rank 1
    alone = [(T0 + 12 + k * 0.5, [P("2", 0, 1, 21 + k, inits=2)]) for k in range(10)]
    joined = [(T0 + 18 + k * 0.5, [P("2", 0, 2, 31 + k, inits=3), P("3", 1, 2, k, inits=1)])
              for k in range(10)]
    q = run(first + alone + joined)
    assert q.step == 40
    assert q.resets == 3  # "1" first, then "2" alone, then "2" in the world with "3"


def test_a_process_that_left_the_world_still_says_rank_0_and_is_not_the_one_counted() -> None:
    """Seen on real nodes: the old rank 0, announced to go, beats on with the rank of its
    last init (and more inits than anyone) while the new world's rank 0 trains."""
    first = steady(T0, T0 + 10, 0, senders=("1", "2"))  # 20 steps
    both = [(T0 + 10.5 + k * 0.5, [P("1", 0, 2, 20, inits=5, moving=False),
                                   P("2", 0, 1, 21 + k, inits=2)]) for k in range(20)]
    assert run(first + both).step == 40


def test_time_without_a_world_is_lost_when_the_hook_counts() -> None:
    """The hook's training seconds; then 10 s of passes without any heartbeat (horovodrun
    restarting): those are lost too, not only the pauses rank 0 counted."""
    def counted(t0: float, t1: float, step0: int,
                trained0: float) -> list[tuple[float, Beat]]:
        out = []
        for k in range(round((t1 - t0) / 0.5) + 1):
            t = t0 + k * 0.5
            b = replace(beat(P("1", 0, 2, step0 + k), t - 1e9), trained_s=trained0 + k * 0.5)
            out.append((t, b))
        return out

    q = Progress()
    for t, b in counted(T0, T0 + 20, 0, 0.0):
        q = observe(q, [b], desired=2, now=t - 1e9, wall=t)
    before = q.lost_ws
    for k in range(1, 21):  # no world for 10 s
        q = observe(q, [], desired=2, now=T0 + 20 + k * 0.5 - 1e9, wall=T0 + 20 + k * 0.5)
    assert q.lost_ws - before == pytest.approx(2 * 10.0)
    assert q.training_s == pytest.approx(19.5) and q.world is None  # from the first step seen


def test_a_script_without_distributed_optimizer_counts_commits() -> None:
    passes = [(T0 + k, [P("1", 0, 1, 0, commits=k)]) for k in range(10)]
    assert run(passes, desired=1).step == 9


def test_an_older_hook_shows_no_progress() -> None:
    b = Beat(sender="1", host="h", pid=1, local_rank=0, first_seen=0.0, last_seen=1.0,
             progress_at=1.0, rank=0, size=1)
    q = observe(Progress(), [b], desired=1, now=1.0, wall=T0)
    assert q.world is None and q.step == 0 and q.goodput() == (None, None)


def test_the_history_samples_changes_and_thins_when_full() -> None:
    q = run(steady(T0, T0 + 20, 0) + steady(T0 + 20.5, T0 + 30, 41, size=1, senders=("1",)))
    worlds = [w for _, w, _ in q.history]
    assert worlds[0] == 2 and worlds[-1] == 1 and 1 in worlds
    ts = [t for t, _, _ in q.history]
    assert all(b - a <= progress.SAMPLE_S + 0.5 for a, b in itertools.pairwise(ts))
    # full: the older half is thinned, the newest kept whole
    long = run(steady(T0, T0 + 6 * progress.SAMPLE_S * progress.HISTORY_MAX, 0, dt=5.0))
    assert len(long.history) <= progress.HISTORY_MAX
    assert long.history[-1][0] == pytest.approx(T0 + 6 * progress.SAMPLE_S
                                                 * progress.HISTORY_MAX, abs=5.0)
    assert long.history[0][0] == pytest.approx(T0, abs=10.0)


def test_the_stored_form_round_trips_and_damage_is_named() -> None:
    q = run(steady(T0, T0 + 20, 0))
    d = progress.to_dict(q)
    back = progress.from_dict(d)
    assert (back.step, back.since, back.training_s, back.history) == (
        q.step, q.since, q.training_s, q.history)
    assert d["goodput"] == pytest.approx(1.0) and d["rate"] == pytest.approx(2.0)
    assert progress.from_dict(None) == Progress()
    with pytest.raises(ValueError, match="progress"):
        progress.from_dict({"step": "many"})


def test_a_supervisor_started_again_counts_what_the_adopted_run_did_meanwhile() -> None:
    """Sidecar mode: the supervisor dies, horovodrun runs on, the next one adopts it (the same
    processes, senders) and reads the stored progress, saved up to 10 s before the death. The
    steps since that save and through the gap are counted when the processes are seen again;
    found on real nodes, where the count was 186 steps short without the per-process marks,
    and 60 short when the supervisor died before its first save (a process never seen counted
    from its first beat, not from its start)."""
    saved = run(steady(T0, T0 + 20, 0))  # step 40, the last save
    restored = progress.from_dict(progress.to_dict(saved))
    assert restored.seen == saved.seen and restored.lead == saved.lead
    # 8 s after the save the supervisor died; its successor sees the processes at T0 + 35
    q = run(steady(T0 + 35, T0 + 45, 70), start=restored)
    assert q.step == 90 and q.redone == 0 and q.resets == saved.resets
    # killed before its first save (the sidecar tour's supervisor, 9 s into training): the
    # processes' counts are since their start, all of them the job's
    early = run(steady(T0 + 35, T0 + 45, 70))
    assert early.step == 90


@pytest.mark.parametrize("first", [[], ["2"], ["1"]], ids=["no beat", "rank 1's", "rank 0's"])
def test_an_adopting_supervisor_counts_nothing_twice_before_it_hears_every_process(
        first: list[str]) -> None:
    """The successor's channel starts empty: its first passes see no heartbeat, or some
    processes' only. Found on real nodes (the sidecar tour, a probe of `status` after the
    adoption): 135 steps counted twice, once before the supervisor died and again from rank 0's
    start, as a process it had seen was forgotten in a pass that did not hear it."""
    saved = run(steady(T0, T0 + 20, 0))  # step 40, the last save
    restored = progress.from_dict(progress.to_dict(saved))
    heard = [(T0 + 34.5, [P(x, int(x) - 1, 2, 69) for x in first])]
    q = run([*heard, *steady(T0 + 35, T0 + 45, 70)], start=restored)
    assert q.step == 90 and q.redone == 0


def test_processes_gone_for_good_are_forgotten_once_many_were_seen() -> None:
    """The marks of processes no heartbeat shows any more are kept (a pass may not hear a live
    one), up to SEEN_MAX of them: a job replacing workers for months stores no more."""
    q = run(steady(T0, T0 + 2, 0))
    for n in range(progress.SEEN_MAX + 50):
        q = run([(T0 + 3 + n, [P(str(100 + n), 0, 1, 5)])], start=q)
    assert len(q.seen) == progress.SEEN_MAX
    assert str(100 + progress.SEEN_MAX + 49) in q.seen and "1" not in q.seen


def test_the_tool_and_rank_0s_printed_steps_agree_on_the_goodput() -> None:
    """The same training seen two ways: rank 0's step lines (what the demo's bench reads) and
    the hook's counts in heartbeats every 0.5 s, read by passes 0.3 to 2.5 s apart (what the
    supervisor reads): goodput within 1 % of each other. The hook is the real one (its
    Progress, fed the steps at their times); a rollback to the last save, 3 steps computed
    again, and pauses of 2.5 to 9 s."""
    from localcluster.demo import goodput_from_steps
    from supervisor.hook.elastic_supervisor_hook.worker import Progress as Hook

    rng = random.Random(7)
    clock = [T0]
    hook = Hook(clock=lambda: clock[0])
    step = hook.counted(lambda: None)
    pauses = {60: 4.0, 120: 9.0, 200: 2.5}  # at position -> seconds without a step (faults)
    small = range(130, 170)  # positions trained with one process of two
    printed: list[dict[str, Any]] = []
    beats: list[tuple[float, P, float]] = []  # (time, process, seconds trained)
    t, next_beat = T0, T0 + 0.5
    while hook.steps - hook.redone < 300:
        pos = hook.steps - hook.redone
        t += pauses.get(pos, 0.0) + rng.uniform(0.15, 0.25)
        if pos == 238 and hook.redone == 0:
            hook.rolled_back()  # a peer failed: back to the save at 235
        while next_beat < t:
            beats.append((next_beat, P("1", 0, 1 if pos in small else 2, hook.steps,
                                       hook.redone), hook.trained_s))
            next_beat += 0.5 + rng.uniform(-0.05, 0.05)
        clock[0] = t
        step()
        pos = hook.steps - hook.redone
        if pos % 5 == 0:
            hook.saved()
        printed.append({"time": t, "step": pos, "size": 1 if pos in small else 2})
    q, k, now = Progress(), 0, T0
    while now < t:
        now += rng.uniform(0.3, 2.5)
        while k + 1 < len(beats) and beats[k + 1][0] <= now:
            k += 1
        bt, b, trained = beats[k]
        seen = replace(beat(b, bt - 1e9), trained_s=trained)
        q = observe(q, [seen], desired=2, now=now - 1e9, wall=now)
    assert q.since is not None and q.at is not None and q.redone == 3
    full, trained = goodput_from_steps(printed, [], q.since, q.at)
    good, good_any = q.goodput()
    assert good is not None and good_any is not None
    assert 0.5 < good < 0.95 and good_any < 1
    assert abs(good - full) <= 0.01 and abs(good_any - trained) <= 0.01, (
        good, full, good_any, trained)
