"""PURE: the job's training progress and goodput, from the hook's heartbeats.

Any script, no change to it: the hook counts in every training process its optimizer steps
(horovod.torch's DistributedOptimizer.step), its commits (State.commit) and the steps it computed
again (those since the last save, when a failed world rolls the state back), and its heartbeats
carry them (beats.Beat.steps/commits/redone). The job's progress is read from world rank 0,
whoever that is: every rank steps in lockstep, so each pass adds how far rank 0's position
(steps - redone; commits where the script has no DistributedOptimizer) went beyond the highest
position seen of that process. A new rank 0 that trained before as another rank continues from
its own count, so a failover loses nothing and counts nothing twice; steps computed again after
a rollback bring the position back to where it was and add nothing.

Training time is judged where each step's time is known: in the hook, at every step (its
heartbeats carry the seconds trained, Beat.trained_s). The pause from one new step (past every
position before) to the next was training when it is at most max(MIN_PAUSE_S, PAUSE_STEPS x the
step time), a longer one was not; steps computed again after a rollback make no new step, so
computing them is a pause like any other. Each pass adds what rank 0's count grew, at the world
size rank 0 reports. (An older hook does not count: then the pauses between two passes that saw
the step grow are judged here by the same rule, to about a pass at each end.) Goodput is, over
the wall time since the first step: the share spent training at the size asked for
(`goodput`), and training at all (`goodput_any`). Worker-seconds: productive ones are the
training time times the world size; lost ones are the rest of what was asked for (desired x the
wall time), so both only grow.

`history` keeps samples for `elastic-supervisor timeline`: (epoch s, world or None, step), one
at least every SAMPLE_S and at every change of the world or of training, HISTORY_MAX at most
(the older half thinned when full). Times are the supervisor's: monotonic for the beats, epoch
for what is stored. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.decide.beats import Beat, heartbeating

MIN_PAUSE_S = 1.5  # two heartbeat periods and a half: shorter pauses are the beats' resolution
PAUSE_STEPS = 3.0  # a pause of more than three step times is not training
FRESH_S = 2.0  # a beat older than this (monotonic) shows no training world
RATE_WINDOW_S = 10.0
SAMPLE_S = 5.0
HISTORY_MAX = 1000
EWMA = 0.2  # weight of the newest step time
SEEN_MAX = 256  # processes whose counts are kept (those heard last pass always are)


@dataclass(frozen=True)
class Progress:
    step: int = 0  # the job's training steps so far
    redone: int = 0  # steps computed again
    world: int | None = None  # processes in rank 0's world now (None: none)
    desired: int = 0  # processes asked for
    since: float | None = None  # epoch: the first step seen
    at: float | None = None  # epoch: this record
    grew_at: float | None = None  # epoch: the step last seen to grow
    training_s: float = 0.0
    full_s: float = 0.0
    productive_ws: float = 0.0
    lost_ws: float = 0.0
    step_s: float | None = None  # the step time (EWMA of the training intervals)
    resets: int = 0  # rank 0's worlds so far: a new rank 0 process or a new init of it
    counted: bool = False  # rank 0's hook counts its training time (Beat.trained_s)
    # per process (sender; SEEN_MAX at most), the highest position, redone count and training
    # seconds seen, and rank 0's sender and inits last pass: stored too, so that a supervisor
    # started again that adopts the run (sidecar mode) counts what its processes did meanwhile;
    # not stored: (epoch, step) of the last RATE_WINDOW_S
    seen: Mapping[str, tuple[int, int, float]] = field(default_factory=dict)
    lead: tuple[str, int] | None = None
    recent: tuple[tuple[float, int], ...] = ()
    history: tuple[tuple[float, int | None, int], ...] = ()

    def pause_limit(self) -> float:
        return max(MIN_PAUSE_S, PAUSE_STEPS * self.step_s) if self.step_s else MIN_PAUSE_S

    def training(self) -> bool:
        return (self.grew_at is not None and self.at is not None
                and self.at - self.grew_at <= self.pause_limit())

    def rate(self) -> float:
        """Steps per second over the last RATE_WINDOW_S (0.0 when not training)."""
        if not self.training() or len(self.recent) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.recent[0], self.recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def wall_s(self) -> float:
        return 0.0 if self.since is None or self.at is None else max(0.0, self.at - self.since)

    def goodput(self) -> tuple[float | None, float | None]:
        """(training at the size asked for, training at all) / wall time; None before a step."""
        wall = self.wall_s()
        if wall <= 0:
            return None, None
        return min(1.0, self.full_s / wall), min(1.0, self.training_s / wall)


def position(b: Beat) -> int | None:
    """A process's progress: steps less those computed again; its commits where it makes no
    optimizer step (None: an older hook)."""
    if b.steps is None:
        return None
    if b.steps > 0:
        return b.steps - (b.redone or 0)
    return b.commits or 0


def rank0(beats: Iterable[Beat], now: float) -> Beat | None:
    """World rank 0's process, from a fresh heartbeat. Two may say so while the world
    changes: one that left it (announced to go, its peer failed) still beats with the rank of
    its last init. The one whose collectives completed last is in the world that trains
    (counts of inits cannot tell: each process counts its own)."""
    live = [b for b in beats if b.rank == 0 and b.size is not None and b.steps is not None
            and heartbeating(b, now, FRESH_S, inclusive=True)]
    return max(live, key=lambda b: (b.progress_at or float("-inf"), b.last_seen),
               default=None)


def observe(p: Progress, beats: Iterable[Beat], *, desired: int, now: float,
            wall: float) -> Progress:
    """The progress after one pass: `beats` of this run of horovodrun (monotonic `now`),
    `desired` processes asked for, `wall` the epoch time."""
    beats = tuple(beats)
    lead = rank0(beats, now)
    seen = dict(p.seen)
    grew = redone = 0
    trained: float | None = None  # seconds rank 0 trained since the last pass (its hook's)
    for b in beats:
        pos = position(b)
        if pos is None:
            continue
        tr = b.trained_s or 0.0
        # a process not seen before counts from its start: its counts are its own (a new
        # process of a restarted run starts at 0; an adopted one trained for this job too)
        high, was_redone, was_tr = seen.get(b.sender, (0, 0, 0.0))
        if lead is not None and b.sender == lead.sender:
            grew, redone = max(0, pos - high), max(0, (b.redone or 0) - was_redone)
            trained = None if b.trained_s is None else max(0.0, tr - was_tr)
        seen[b.sender] = (max(high, pos), max(was_redone, b.redone or 0), max(was_tr, tr))
    seen = _bounded(seen, {b.sender for b in beats})
    world = lead.size if lead is not None else None
    resets = p.resets
    if lead is not None and p.lead != (lead.sender, lead.inits):
        resets += 1
    q = replace(p, seen=seen, lead=(lead.sender, lead.inits) if lead is not None else None,
                world=world, desired=desired, at=wall, resets=resets)
    if redone:
        q = replace(q, redone=q.redone + redone)
    if trained is not None or (q.counted and lead is None):
        # no world this pass (horovodrun restarting, rank 0 silent): all that was asked for
        # is lost
        q = _trained(q, trained or 0.0, wall - (p.at or wall), world or 0, desired)
    if grew:
        q = _grew(q, grew, wall, world or 0, desired, judge=trained is None)
    return _sampled(p, q, wall)


def _bounded(seen: dict[str, tuple[int, int, float]], live: set[str]
             ) -> dict[str, tuple[int, int, float]]:
    """`seen` with at most SEEN_MAX processes: those no heartbeat of this pass shows are kept
    (a supervisor started again hears its processes one by one, and a process forgotten would
    be counted again from its start), and the oldest of them go first once there are more."""
    extra = len(seen) - SEEN_MAX
    if extra <= 0:
        return seen
    gone = set([k for k in seen if k not in live][:extra])
    return {k: v for k, v in seen.items() if k not in gone}


def _trained(q: Progress, trained: float, dt: float, world: int, desired: int) -> Progress:
    """The hook's training seconds since the last pass, at `world` processes; what was asked
    for in the `dt` seconds since and not trained is lost."""
    if q.since is None:
        return q
    return replace(q, counted=True, training_s=q.training_s + trained,
                   full_s=q.full_s + (trained if world >= desired else 0.0),
                   productive_ws=q.productive_ws + trained * world,
                   lost_ws=q.lost_ws + max(0.0, desired * dt - trained * world))


def _grew(q: Progress, grew: int, wall: float, world: int, desired: int, *,
          judge: bool = True) -> Progress:
    """The step grew: the rate and the step time; with `judge` (an older hook, which does not
    count its training time), the pause since the last growth judged by the rule here."""
    step = q.step + grew
    recent = (*tuple(x for x in q.recent if wall - x[0] <= RATE_WINDOW_S), (wall, step))
    if q.grew_at is None:  # the first step seen: the goodput's window starts
        return replace(q, step=step, since=wall, grew_at=wall, recent=recent)
    gap = max(0.0, wall - q.grew_at)
    step_s = gap / grew if q.step_s is None else q.step_s
    limit = max(MIN_PAUSE_S, PAUSE_STEPS * step_s)
    if not judge:
        return replace(q, step=step, grew_at=wall, recent=recent if gap <= limit else
                       ((wall, step),), step_s=(1 - EWMA) * step_s + EWMA * gap / grew
                       if gap <= limit else step_s)
    if gap <= limit:
        return replace(
            q, step=step, grew_at=wall, recent=recent,
            step_s=(1 - EWMA) * step_s + EWMA * gap / grew,
            training_s=q.training_s + gap, full_s=q.full_s + (gap if world >= desired else 0),
            productive_ws=q.productive_ws + gap * world,
            lost_ws=q.lost_ws + gap * max(0, desired - world))
    return replace(q, step=step, grew_at=wall, recent=((wall, step),), step_s=step_s,
                   lost_ws=q.lost_ws + gap * desired)


def _sampled(p: Progress, q: Progress, wall: float) -> Progress:
    """`q` with a history sample at `wall` when one is due."""
    last = q.history[-1] if q.history else None
    due = (last is None or wall - last[0] >= SAMPLE_S or last[1] != q.world
           or p.training() != q.training())
    if not due or q.since is None:
        return q
    history = (*q.history, (round(wall, 2), q.world, q.step))
    if len(history) > HISTORY_MAX:
        half = len(history) // 2
        history = (*history[:half:2], *history[half:])
    return replace(q, history=history)


# -- the stored form (the state ConfigMap's "progress") ---------------------------------------

def to_dict(p: Progress) -> dict[str, Any]:
    good, good_any = p.goodput()
    return {
        "step": p.step, "redone": p.redone, "rate": round(p.rate(), 3), "world": p.world,
        "desired": p.desired, "training": p.training(), "since": p.since, "at": p.at,
        "grewAt": p.grew_at, "stepSeconds": None if p.step_s is None else round(p.step_s, 4),
        "resets": p.resets, "counted": p.counted,
        "wall_s": round(p.wall_s(), 2), "training_s": round(p.training_s, 2),
        "full_s": round(p.full_s, 2),
        "goodput": None if good is None else round(good, 4),
        "goodput_any": None if good_any is None else round(good_any, 4),
        "productive_ws": round(p.productive_ws, 2), "lost_ws": round(p.lost_ws, 2),
        "history": [list(h) for h in p.history],
        "seen": {k: [h, r, round(t, 3)] for k, (h, r, t) in p.seen.items()},
        "lead": None if p.lead is None else list(p.lead),
    }


def from_dict(d: Mapping[str, Any] | None) -> Progress:
    """The stored progress (a new one when there is none); raise ValueError naming the field
    that is damaged."""
    if not d:
        return Progress()
    if not isinstance(d, Mapping):
        raise ValueError(f"progress: expected a mapping, not {type(d).__name__}")
    try:
        history = tuple((float(t), None if w is None else int(w), int(s))
                        for t, w, s in d.get("history") or ())
        opt = _optional_float
        seen = {str(k): (int(h), int(r), float(t)) for k, (h, r, t) in
                (d.get("seen") or {}).items()}
        lead = d.get("lead")
        return Progress(
            seen=seen, lead=None if lead is None else (str(lead[0]), int(lead[1])),
            step=int(d.get("step", 0)), redone=int(d.get("redone", 0)),
            desired=int(d.get("desired", 0)), since=opt(d.get("since")), at=opt(d.get("at")),
            grew_at=opt(d.get("grewAt")), step_s=opt(d.get("stepSeconds")),
            resets=int(d.get("resets", 0)), counted=bool(d.get("counted", False)),
            training_s=float(d.get("training_s", 0.0)), full_s=float(d.get("full_s", 0.0)),
            productive_ws=float(d.get("productive_ws", 0.0)),
            lost_ws=float(d.get("lost_ws", 0.0)), history=history)
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ValueError(f"progress: {e}") from e


def _optional_float(v: Any) -> float | None:
    return None if v is None else float(v)
