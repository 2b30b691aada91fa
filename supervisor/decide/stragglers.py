"""PURE: slow but alive ranks (stragglers): named, and moved when that pays (issue 42).

In an allreduce world every step waits for the slowest rank. The hook times every step of every
training process (worker.py's `Progress.time_step`): the seconds outside collectives (its own
work: compute, input) and inside them (waiting for its peers, and the transfer), the means of
its last steps since the last init (`Beat.step_out_s`, `step_wait_s`, `step_n`). A rank whose own
work is slow makes every other one wait: their time inside grows, their time outside does not.

**Slow**: in a settled world (every rank of it heartbeats, with MIN_STEPS steps timed since the
last init), a host whose slowest process spends at least `factor` times the median of the other
hosts' processes outside collectives, and MIN_EXCESS_S more, and from then on over 1 + HOLD x
(factor - 1) of it, continuously for `seconds`. A job-wide slowdown (every rank slower) moves the
median with it: not a straggler. The hook leaves the slowest tenth of its steps out of its means
(a GC, a checkpoint, a slow first batch: a pause of one step), and takes means, not medians (a
CPU quota makes a few steps in a row fast and the next one very slow, over and over). Said once
(WorkerSlow) and once more when it is over (WorkerNoLongerSlow).

**Moved only when that pays**: with it the world runs n ranks at its pace (its time outside
plus its own time inside: the transfer, as the last to arrive it waits for no one), without it
n - k ranks (k: its processes) at the median's pace (the median time outside, the same
transfer): moved when (n - k) / without > n / with, at most `moves` times per `window_s`, and
only when the supervisor owns the workers, and never for a rank that was slow on a host
moved before (the slowness follows the rank: its own work, which no move leaves behind). The
move is an announced disruption's (leaving.py):
its replacement is placed first, kept off its node, and it leaves gracefully once that runs;
with nowhere to go it trains on. Its node counts once toward quarantine (quarantine.Kind.SLOW).
No I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from supervisor.decide.beats import Beat, heartbeating, judged

# steps a process has timed since the last init before it is compared: a new world's first
# windows are short, and a healthy worker measured 2.02x three seconds after the first step with
# 8 (bench stragglers, 2026-11-30)
MIN_STEPS = 12
MIN_EXCESS_S = 0.005  # and at least this much slower per step (tiny steps are noise)
HOLD = 0.75  # once slow, slow while over 1 + HOLD x (factor - 1): 1.75 for a factor of 2


@dataclass(frozen=True)
class Settings:
    factor: float = 2.0  # 0: off
    seconds: float = 30.0
    moves: int = 2  # moves within window_s; 0: report only
    window_s: float = 3600.0


@dataclass(frozen=True)
class Slow:
    """A host slower than the others, as last measured."""

    host: str
    ranks: tuple[int, ...]  # its processes' ranks
    out_s: float  # its slowest process's time outside collectives per step
    median_s: float  # the other hosts' processes' median
    comm_s: float  # that process's time inside collectives per step
    size: int  # ranks in the world
    since: float  # monotonic: slow since

    @property
    def factor(self) -> float:
        return self.out_s / self.median_s if self.median_s > 0 else float("inf")

    def rates(self) -> tuple[float, float]:
        """(steps x ranks per second with it, without it until a replacement joins)."""
        with_it = self.size / max(1e-9, self.out_s + self.comm_s)
        without = (self.size - len(self.ranks)) / max(1e-9, self.median_s + self.comm_s)
        return with_it, without

    def pays(self) -> bool:
        """Whether the world trains faster without it (the rates' comparison above)."""
        with_it, without = self.rates()
        return without > with_it


@dataclass(frozen=True)
class Watch:
    """What the straggler watch remembers (memory.Memory.slow)."""

    since: Mapping[str, float] = field(default_factory=dict)  # host -> slow since (monotonic)
    named: Mapping[str, Slow] = field(default_factory=dict)  # host -> said slow
    moved: tuple[float, ...] = ()  # when each move was decided (wall), within the window
    moving: Mapping[str, str] = field(default_factory=dict)  # pod -> why, to leave (leaving.py)
    kept: frozenset[str] = frozenset()  # hosts said slow and not moved (said once)
    # the ranks of the hosts moved: a rank slow again on another host is slow for its own work
    # (rank 0's checkpoints, its logging), which a move cannot leave behind
    moved_ranks: frozenset[int] = frozenset()

    @property
    def worst(self) -> float:
        return 0.0 if self.widest is None else self.widest.factor
    # the measure with the highest factor in a settled world so far (the margin below `factor`)
    widest: Slow | None = None


def measure(beats: Iterable[Beat], now: float, silence_s: float) -> dict[str, Slow] | None:
    """Each host's time outside collectives against the other hosts' median (`since`: now),
    or None when the world is not settled: a process of it silent, of another size, or with
    fewer than MIN_STEPS steps timed since the last init, or a single host."""
    live = [b for b in beats if b.rank is not None and judged(b)
            and heartbeating(b, now, silence_s)]
    if not live or live[0].size is None:
        return None
    size = live[0].size
    if len(live) != size or any(b.size != size or b.step_out_s is None or b.step_n < MIN_STEPS
                                for b in live):
        return None
    hosts: dict[str, list[Beat]] = {}
    for b in live:
        hosts.setdefault(b.host, []).append(b)
    if len(hosts) < 2:
        return None
    everyone = sorted(b.step_out_s for b in live)  # type: ignore[type-var]
    out = {}
    for host, own in hosts.items():
        slowest = max(own, key=lambda b: b.step_out_s)  # type: ignore[arg-type,return-value]
        mine = slowest.step_out_s
        assert mine is not None
        median = _median_without(everyone, [b.step_out_s for b in own])  # type: ignore[misc]
        out[host] = Slow(host, tuple(sorted(b.rank for b in own if b.rank is not None)), mine,
                         median, slowest.step_wait_s or 0.0, size, now)
    return out


def _median_without(ordered: list[float], drop: list[float]) -> float:
    """The median of `ordered` (sorted) without one occurrence of each value of `drop`, in
    O(len(drop)) steps after a bisect each (a copy per host would make a pass O(hosts^2))."""
    taken: dict[float, int] = {}
    gone = []
    for v in sorted(drop):
        gone.append(bisect.bisect_left(ordered, v) + taken.get(v, 0))
        taken[v] = taken.get(v, 0) + 1
    gone.sort()

    def at(i: int) -> float:  # the i-th of what is left
        for p in gone:
            if p > i:
                break
            i += 1
        return ordered[i]

    n = len(ordered) - len(gone)
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def is_slow(x: Slow, s: Settings, *, held: bool = False) -> bool:
    """Whether `x` is slow: `factor` times the others' median; once slow (`held`), HOLD of the
    way from 1 to `factor` (a slowdown measured around the factor itself comes and goes with
    every few steps: without a band it would never last `seconds`)."""
    factor = 1 + (s.factor - 1) * HOLD if held else s.factor
    return x.out_s >= factor * x.median_s and x.out_s - x.median_s >= MIN_EXCESS_S


@dataclass(frozen=True)
class Change:
    watch: Watch
    named: tuple[Slow, ...] = ()  # said slow now
    over: tuple[Slow, ...] = ()  # measured no longer slow now
    gone: tuple[Slow, ...] = ()  # said slow, and gone from a settled world (moved, failed)
    suspected: tuple[Slow, ...] = ()  # slow from now on (named once it lasts `seconds`)
    cleared: tuple[Slow, ...] = ()  # slow since `since`, not named, measured not slow now


def watch(w: Watch, beats: Iterable[Beat], now: float, s: Settings,
          silence_s: float) -> Change:
    """The watch after this pass's heartbeats: hosts slow since when, named once slow for
    `seconds`, over once measured not slow, gone once a settled world lacks them. An unsettled
    world (a reset, a worker joining) changes nothing: no new evidence either way."""
    if s.factor <= 0:
        # off: nothing is slow or moving; the moves made and the margin stay what they were
        return Change(w) if not w.since and not w.named else Change(
            replace(w, since={}, named={}, moving={}, kept=frozenset()),
            over=tuple(w.named.values()))
    m = measure(beats, now, silence_s)
    if m is None:
        return Change(w)
    since, named = dict(w.since), dict(w.named)
    new, over, gone, suspected, cleared = [], [], [], [], []
    for host in [h for h in named if h not in m]:
        gone.append(named.pop(host))
    for host in [h for h in since if h not in m]:
        del since[host]
    for host, now_x in sorted(m.items()):
        if not is_slow(now_x, s, held=host in since or host in named):
            was = since.pop(host, None)
            if host in named:
                over.append(replace(now_x, since=named.pop(host).since))
            elif was is not None:
                cleared.append(replace(now_x, since=was))
            continue
        if host not in since:
            suspected.append(now_x)
        x = replace(now_x, since=since.setdefault(host, now))
        if host in named:
            named[host] = x
        elif now - x.since >= s.seconds:
            named[host] = x
            new.append(x)
    widest = max((x for x in m.values() if x.median_s > 0), key=lambda x: x.factor,
                 default=None)
    if widest is None or widest.factor <= w.worst:
        widest = w.widest
    kept = w.kept & set(named)
    out = replace(w, since=since, named=named, kept=frozenset(kept), widest=widest)
    return Change(out if out != w else w, tuple(new), tuple(over), tuple(gone),
                  tuple(suspected), tuple(cleared))


def may_move(w: Watch, s: Settings, wall: float) -> bool:
    """Whether the move budget has room now (`moves` within `window_s`)."""
    return s.moves > 0 and sum(1 for t in w.moved if wall - t < s.window_s) < s.moves


def moved(w: Watch, x: Slow, pod: str, why: str, *, s: Settings, wall: float) -> Watch:
    """The watch after deciding to move `pod`, the slow host `x` (a move of the budget)."""
    return replace(w, moved=(*(t for t in w.moved if wall - t < s.window_s), wall),
                   moving={**w.moving, pod: why}, moved_ranks=w.moved_ranks | set(x.ranks))


def describe(x: Slow) -> str:
    with_it, without = x.rates()
    return (f"its time outside collectives {x.out_s * 1000:.1f} ms per step is "
            f"{x.factor:.1f}x the other ranks' median {x.median_s * 1000:.1f} ms (the world of "
            f"{x.size} trains at {with_it:.1f} rank-steps/s with it, {without:.1f} without it)")


def to_list(w: Watch, now: float) -> list[dict[str, object]]:
    """The hosts said slow, as the state keeps them for `status`."""
    return [{"host": x.host, "ranks": list(x.ranks), "factor": round(x.factor, 2),
             "outMs": round(x.out_s * 1000, 1), "medianMs": round(x.median_s * 1000, 1),
             "forS": round(max(0.0, now - x.since), 1)} for x in w.named.values()]
