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

**A slow link** (the second case: a degraded NIC, a congested or throttled link) makes every
rank wait alike, and no one's own work is slower. The hook reads the kernel's smoothed
round-trip time of each of its process's connections to another machine that carried data in
the last seconds (`Beat.link_rtt`, the fastest per peer address). Every link has two ends, and
a link's time counts for both: each host's **fastest link** is the fastest any process said of
a link to or from it. A host whose every link is slow stands out; a host with one slow link (to
the slow one) has a fast one too, once there are three hosts (with two, both see the one link:
no verdict). A process can only lower a host's fastest link by what it says, never raise it: a
process that lies cannot get another named. Slow, held and named as above (the same `factor`
and `seconds`, over the other hosts' median and LINK_MIN_EXCESS_S more); moved when the world's
step now (the median rank's, inside and outside collectives) is at least LINK_SLOWER over its
fastest since the world formed (`Pace`: the link made the world slower) and n - k ranks at that
fastest step beat n at the step now. A link slow since before the world formed has no faster
step to compare: reported only. The moved-ranks rule does not apply: the slowness is the
machine's link, not the rank's work.
No I/O, no clock.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from supervisor.decide.beats import Beat, heartbeating, is_loopback, judged

# steps a process has timed since the last init before it is compared: a new world's first
# windows are short, and a healthy worker measured 2.02x three seconds after the first step with
# 8 (bench stragglers, 2026-11-30)
MIN_STEPS = 12
MIN_EXCESS_S = 0.005  # and at least this much slower per step (tiny steps are noise)
HOLD = 0.75  # once slow, slow while over 1 + HOLD x (factor - 1): 2.125 for a factor of 2.5
LINK_MIN_EXCESS_S = 0.005  # a slow link: at least this much slower a round trip
LINK_SLOWER = 0.1  # moved: the world's step is at least this much over its fastest
WORK, LINK = "work", "link"  # what is slow: the host's own work, or its links


@dataclass(frozen=True)
class Settings:
    factor: float = 2.5  # 0: off
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
    # LINK: out_s and median_s are round-trip times (its fastest link, the other hosts'
    # median), step_s the world's step now and best_s its fastest since the world formed
    kind: str = WORK
    step_s: float = 0.0
    best_s: float = 0.0

    @property
    def key(self) -> str:
        """Its key in the watch: the host (its work) or the host's links."""
        return self.host if self.kind == WORK else f"{self.host}/{LINK}"

    @property
    def factor(self) -> float:
        return self.out_s / self.median_s if self.median_s > 0 else float("inf")

    def rates(self) -> tuple[float, float]:
        """(steps x ranks per second with it, without it until a replacement joins)."""
        k = len(self.ranks)
        if self.kind == LINK:
            if self.best_s <= 0 or self.step_s < self.best_s * (1 + LINK_SLOWER):
                return self.size / max(1e-9, self.step_s), 0.0  # not shown to cost a step
            return self.size / self.step_s, (self.size - k) / self.best_s
        with_it = self.size / max(1e-9, self.out_s + self.comm_s)
        without = (self.size - k) / max(1e-9, self.median_s + self.comm_s)
        return with_it, without

    def pays(self) -> bool:
        """Whether the world trains faster without it (the rates' comparison above)."""
        with_it, without = self.rates()
        return without > with_it


@dataclass(frozen=True)
class Pace:
    """A world's fastest step so far: the yardstick of what a slow link costs."""

    world: frozenset[tuple[str, int]]  # (sender, inits) of each of its processes
    best_s: float  # the median rank's step (outside + inside collectives), its lowest


@dataclass(frozen=True)
class Watch:
    """What the straggler watch remembers (memory.Memory.slow)."""

    since: Mapping[str, float] = field(default_factory=dict)  # host -> slow since (monotonic)
    named: Mapping[str, Slow] = field(default_factory=dict)  # host -> said slow
    moved: tuple[float, ...] = ()  # when each move was decided (wall), within the window
    moving: Mapping[str, str] = field(default_factory=dict)  # pod -> why, to leave (leaving.py)
    kept: frozenset[str] = frozenset()  # keys said slow and not moved (said once)
    # the ranks of the hosts moved: a rank slow again on another host is slow for its own work
    # (rank 0's checkpoints, its logging), which a move cannot leave behind
    moved_ranks: frozenset[int] = frozenset()

    @property
    def worst(self) -> float:
        return 0.0 if self.widest is None else self.widest.factor

    @property
    def link_excess(self) -> float:
        """The most a host's fastest link was over the others' median so far (seconds)."""
        x = self.widest_link
        return 0.0 if x is None else x.out_s - x.median_s
    # the measure with the highest factor in a settled world so far (the margin below `factor`)
    widest: Slow | None = None
    widest_link: Slow | None = None  # the links' measure with the most excess so far
    pace: Pace | None = None  # the current world's fastest step


def settled(beats: Iterable[Beat], now: float, silence_s: float) -> list[Beat] | None:
    """The processes of a settled world (each of its ranks heartbeats, one size, each with at
    least MIN_STEPS steps timed since the last init), or None."""
    live = [b for b in beats if b.rank is not None and judged(b)
            and heartbeating(b, now, silence_s)]
    if not live or live[0].size is None:
        return None
    size = live[0].size
    if len(live) != size or any(b.size != size or b.step_out_s is None or b.step_n < MIN_STEPS
                                for b in live):
        return None
    return live


def step_of(live: list[Beat]) -> float:
    """The world's step: the median rank's seconds per step, outside and inside collectives."""
    return statistics.median((b.step_out_s or 0.0) + (b.step_wait_s or 0.0) for b in live)


def measure(beats: Iterable[Beat], now: float, silence_s: float,
            best_s: float = 0.0) -> dict[str, Slow] | None:
    """Each host's time outside collectives against the other hosts' median, and each host's
    fastest link against theirs (`LINK`, where the hook reads links), by `Slow.key` (`since`:
    now), or None when the world is not settled (`settled`) or has a single host. `best_s`: the
    world's fastest step so far (`Pace`)."""
    live = settled(beats, now, silence_s)
    return None if live is None else _measure(live, now, best_s)


def _measure(live: list[Beat], now: float, best_s: float) -> dict[str, Slow] | None:
    size = len(live)
    hosts: dict[str, list[Beat]] = {}
    for b in live:
        hosts.setdefault(b.host, []).append(b)
    if len(hosts) < 2:
        return None
    everyone = sorted(b.step_out_s for b in live)  # type: ignore[type-var]
    out = {}
    ranks = {host: tuple(sorted(b.rank for b in own if b.rank is not None))
             for host, own in hosts.items()}
    for host, own in hosts.items():
        slowest = max(own, key=lambda b: b.step_out_s)  # type: ignore[arg-type,return-value]
        mine = slowest.step_out_s
        assert mine is not None
        median = _median_without(everyone, [b.step_out_s for b in own])  # type: ignore[misc]
        out[host] = Slow(host, ranks[host], mine, median, slowest.step_wait_s or 0.0, size, now)
    fastest = fastest_links(live)
    if len(fastest) >= 3:
        step, times = step_of(live), sorted(fastest.values())
        for host, rtt in fastest.items():
            x = Slow(host, ranks[host], rtt, _median_without(times, [rtt]), 0.0, size, now,
                     LINK, step, min(best_s, step) if best_s > 0 else step)
            out[x.key] = x
    return out


def fastest_links(live: Iterable[Beat]) -> dict[str, float]:
    """host -> the fastest round trip any process said of a link to or from it (a link counts
    for both ends; an address is a host's when a process of it sent from it or had it as a
    local address)."""
    live = list(live)
    host_of: dict[str, str] = {}
    for b in live:
        for a in (b.source[0], *b.addrs):
            if a and not is_loopback(a):
                host_of.setdefault(a, b.host)
    fastest: dict[str, float] = {}
    for b in live:
        for ip, rtt in b.link_rtt:
            peer = host_of.get(ip)
            if peer is None or peer == b.host:
                continue
            for h in (b.host, peer):
                if rtt < fastest.get(h, float("inf")):
                    fastest[h] = rtt
    return fastest


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
    """Whether `x` is slow: `factor` times the others' median, and MIN_EXCESS_S (a link:
    LINK_MIN_EXCESS_S) more; once slow (`held`), HOLD of the way from 1 to `factor` and HOLD of
    the excess (a slowdown measured around the bar itself comes and goes with every few steps:
    without a band it would never last `seconds`; a narrowed link's fastest round trip measured
    4.5-6.3 ms, on and off, on real nodes)."""
    factor = 1 + (s.factor - 1) * HOLD if held else s.factor
    excess = LINK_MIN_EXCESS_S if x.kind == LINK else MIN_EXCESS_S
    return x.out_s >= factor * x.median_s and x.out_s - x.median_s >= excess * (
        HOLD if held else 1.0)


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
    live = settled(beats, now, silence_s)
    if live is None:
        return Change(w)
    world = frozenset((b.sender, b.inits) for b in live)
    step = step_of(live)
    best = step if w.pace is None or w.pace.world != world else min(w.pace.best_s, step)
    pace = Pace(world, best) if w.pace is None or (world, best) != (w.pace.world,
                                                                    w.pace.best_s) else w.pace
    m = _measure(live, now, best)
    if m is None:
        return Change(w if pace is w.pace else replace(w, pace=pace))
    since, named = dict(w.since), dict(w.named)
    new, over, gone, suspected, cleared = [], [], [], [], []
    for key in [k for k in named if k not in m]:
        gone.append(named.pop(key))
    for key in [k for k in since if k not in m]:
        del since[key]
    for key, now_x in sorted(m.items()):
        if not is_slow(now_x, s, held=key in since or key in named):
            was = since.pop(key, None)
            if key in named:
                over.append(replace(now_x, since=named.pop(key).since))
            elif was is not None:
                cleared.append(replace(now_x, since=was))
            continue
        if key not in since:
            suspected.append(now_x)
        x = replace(now_x, since=since.setdefault(key, now))
        if key in named:
            named[key] = x
        elif now - x.since >= s.seconds:
            named[key] = x
            new.append(x)
    widest = max((x for x in m.values() if x.kind == WORK and x.median_s > 0),
                 key=lambda x: x.factor, default=None)
    if widest is None or widest.factor <= w.worst:
        widest = w.widest
    widest_link = max((x for x in m.values() if x.kind == LINK),
                      key=lambda x: x.out_s - x.median_s, default=None)
    if widest_link is None or widest_link.out_s - widest_link.median_s <= w.link_excess:
        widest_link = w.widest_link
    kept = w.kept & set(named)
    out = replace(w, since=since, named=named, kept=frozenset(kept), widest=widest,
                  widest_link=widest_link, pace=pace)
    return Change(out if out != w else w, tuple(new), tuple(over), tuple(gone),
                  tuple(suspected), tuple(cleared))


def may_move(w: Watch, s: Settings, wall: float) -> bool:
    """Whether the move budget has room now (`moves` within `window_s`)."""
    return s.moves > 0 and sum(1 for t in w.moved if wall - t < s.window_s) < s.moves


def moved(w: Watch, x: Slow, pod: str, why: str, *, s: Settings, wall: float) -> Watch:
    """The watch after deciding to move `pod`, the slow host `x` (a move of the budget)."""
    return replace(w, moved=(*(t for t in w.moved if wall - t < s.window_s), wall),
                   moving={**w.moving, pod: why},
                   moved_ranks=w.moved_ranks | set(x.ranks) if x.kind == WORK else w.moved_ranks)


def describe(x: Slow) -> str:
    with_it, without = x.rates()
    if x.kind == LINK:
        return (f"its fastest link to another machine takes {x.out_s * 1000:.1f} ms a round "
                f"trip, the other machines' median {x.median_s * 1000:.2f} ms (the world of "
                f"{x.size} trains at {with_it:.1f} rank-steps/s, at "
                f"{x.size / max(1e-9, x.best_s):.1f} at "
                f"its fastest since it formed)")
    return (f"its time outside collectives {x.out_s * 1000:.1f} ms per step is "
            f"{x.factor:.1f}x the other ranks' median {x.median_s * 1000:.1f} ms (the world of "
            f"{x.size} trains at {with_it:.1f} rank-steps/s with it, {without:.1f} without it)")


def moves_to_dict(w: Watch) -> dict[str, list[float] | list[int]]:
    """The move budget as the state keeps it: when each move within the window was decided
    (wall), and the ranks moved (a supervisor that adopts the job, or a standby that takes
    over, keeps both: no more moves than the budget, no rank moved twice for its own work)."""
    return {"at": [round(t, 3) for t in w.moved], "ranks": sorted(w.moved_ranks)}


def moves_from_dict(raw: object) -> Watch:
    """The watch a supervisor starts with: the stored moves (`moves_to_dict`), nothing slow yet
    (what is measured now decides that); raise ValueError naming what is damaged."""
    if raw is None:
        return Watch()
    at = raw.get("at") if isinstance(raw, dict) else None
    ranks = raw.get("ranks") if isinstance(raw, dict) else None
    if not isinstance(at, list) or not all(
            isinstance(t, int | float) and not isinstance(t, bool) for t in at):
        raise ValueError(f"slowMoves.at: expected a list of times (epoch seconds), got {at!r}")
    if not isinstance(ranks, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ValueError(f"slowMoves.ranks: expected a list of ranks (integers >= 0), got "
                         f"{ranks!r}")
    return Watch(moved=tuple(float(t) for t in at), moved_ranks=frozenset(ranks))


def to_list(w: Watch, now: float) -> list[dict[str, object]]:
    """The hosts said slow, as the state keeps them for `status`."""
    return [{"host": x.host, "kind": x.kind, "ranks": list(x.ranks),
             "factor": round(x.factor, 2),
             "outMs": round(x.out_s * 1000, 1), "medianMs": round(x.median_s * 1000, 1),
             "forS": round(max(0.0, now - x.since), 1)} for x in w.named.values()]
