"""PURE: each failure or disruption as an incident, its phases timed from the supervisor's clock.

An incident opens with a decision of the pass (core.manage's notes): a worker failed
(`worker.failed`, one incident for the workers of one cause failed in one pass: a node's), hung
(`worker.hung`) or stuck (`worker.stuck`, cause Stall) before it is failed, announced to go
(`worker.leaving`, a graceful leave), a scale applied (`scale.applied`), horovodrun restarted
(script.RestartHorovodrun).
Its phases, each reached once, in epoch seconds:

  detected   the pass that decided it
  fenced     its hosts declared dead to the training processes (script.Fence)
  resumed    world rank 0 trained again in a world newer than the one at detection
  created    its replacement pod created (script.CreateWorker for its slot; a scale-out: a slot
             no other open incident waits for)
  scheduled  the replacement has a node
  started    the replacement's pod runs
  joined     a training process on the replacement's host has a rank
  full       back to full size: resumed, every replacement joined, and the world as large as
             asked for (failures of several incidents overlap: they end together)

`redone` (steps computed again) and `lost_ws` (worker-seconds lost) are what progress.py
counted between detection and the end. At most KEEP incidents are kept, the newest. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.decide.fleet import slot_of
from supervisor.decide.hostlist import HostMode, host_of
from supervisor.decide.plan import Note
from supervisor.decide.progress import Progress
from supervisor.decide.script import RestartHorovodrun
from supervisor.observe import Obj

PHASES = ("detected", "fenced", "resumed", "created", "scheduled", "started", "joined", "full")
KEEP = 50


@dataclass(frozen=True)
class Incident:
    id: int
    cause: str
    kind: str  # "failure" | "leave" | "scale" | "restart"
    pods: tuple[str, ...]
    slots: tuple[int, ...]
    phases: Mapping[str, float]
    hosts: tuple[str, ...] = ()
    replacements: tuple[str, ...] = ()
    resets_at: int = 0  # progress.resets at detection
    redone_at: int = 0
    lost_at: float = 0.0
    redone: int = 0
    lost_ws: float = 0.0
    open: bool = True

    def label(self) -> str:
        """"ExitCode w1": the cause and the workers (their slots), for a chart or a line."""
        where = " ".join(f"w{s}" for s in self.slots)
        return f"{self.cause} {where}".strip()


@dataclass(frozen=True)
class Book:
    incidents: tuple[Incident, ...] = ()
    next_id: int = 1


@dataclass(frozen=True)
class PodSeen:
    """What an incident reads of a worker pod."""

    slot: int | None
    host: str | None
    scheduled: bool
    started: bool


@dataclass(frozen=True)
class Opened:
    """A decision that opens an incident (from core.manage's notes)."""

    cause: str
    kind: str
    pods: tuple[str, ...] = ()
    slots: tuple[int, ...] = ()  # where the decision names them (a pod may be gone already)


@dataclass(frozen=True)
class Tick:
    """One pass, as the incidents read it."""

    wall: float
    opened: tuple[Opened, ...] = ()
    fenced: frozenset[str] = frozenset()  # hosts fenced in this pass
    created: tuple[tuple[int, str], ...] = ()  # (slot, pod) created in this pass
    pods: Mapping[str, PodSeen] = field(default_factory=dict)
    joined: frozenset[str] = frozenset()  # hosts with a training process that has a rank
    progress: Progress = field(default_factory=Progress)


def pod_seen(pod: Obj, mode: HostMode, job: str) -> PodSeen:
    found = slot_of(pod, job)
    status = pod.get("status") or {}
    running = status.get("phase") == "Running" and any(
        "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or ())
    return PodSeen(None if found is None else found[0], host_of(pod, mode),
                   bool((pod.get("spec") or {}).get("nodeName")), running)


def opened_by(event: str, fields: Mapping[str, Any]) -> Opened | None:
    """The incident a decision (a note's event and fields) opens, if any."""
    pod = fields.get("pod")
    pods = (str(pod),) if pod else ()
    if event == "worker.failed":
        slot = fields.get("slot")
        return Opened(str(fields.get("cause")), "failure", pods,
                      (slot,) if isinstance(slot, int) else ())
    if event == "worker.hung":
        return Opened("Hung", "failure", pods)
    if event == "worker.stuck":
        return Opened("Stall", "failure", pods)
    if event == "worker.leaving":
        return Opened(str(fields.get("why")), "leave", pods)
    if event == "scale.applied":
        out = int(fields.get("workers_to", 0)) > int(fields.get("workers_from", 0))
        return Opened("ScaleOut" if out else "ScaleIn", "scale")
    return None


def opened_in(todo: Iterable[object]) -> tuple[Opened, ...]:
    """The incidents a pass's script (memory.Pass.todo) opens, in its order."""
    out = []
    for x in todo:
        if isinstance(x, Note):
            o = opened_by(x.event, x.fields)
            if o is not None:
                out.append(o)
        elif isinstance(x, RestartHorovodrun):
            out.append(Opened(x.reason, "restart"))
    return tuple(out)


def advance(book: Book, t: Tick) -> tuple[Book, list[tuple[Incident, str]]]:
    """The book after one pass, and the (incident, phase) reached in it (for the metrics)."""
    reached: list[tuple[Incident, str]] = []
    items = list(book.incidents)
    next_id = book.next_id
    for o in _merged(t.opened, items):
        slots = tuple(sorted({*o.slots, *(s for p in o.pods if (seen := t.pods.get(p))
                                          is not None and (s := seen.slot) is not None)}))
        hosts = tuple(sorted({h for p in o.pods if (seen := t.pods.get(p)) is not None
                              and (h := seen.host)}))
        inc = Incident(next_id, o.cause, o.kind, o.pods, slots, {"detected": t.wall},
                       hosts=hosts, resets_at=t.progress.resets, redone_at=t.progress.redone,
                       lost_at=t.progress.lost_ws)
        next_id += 1
        items.append(inc)
        reached.append((inc, "detected"))
    claimed: set[int] = set()
    for i, inc in enumerate(items):
        if not inc.open:
            continue
        new, phases = _phases(inc, t, claimed)
        items[i] = new
        reached += [(new, ph) for ph in phases]
    if any(ph == "full" for _, ph in reached):  # back to full size: every open one ends
        for i, inc in enumerate(items):
            if inc.open:
                items[i] = _closed(inc, t)
                if "full" not in inc.phases:
                    reached.append((items[i], "full"))
    items = [_counted(x, t.progress) if x.open else x for x in items]
    return Book(tuple(items[-KEEP:]), next_id), reached


def _merged(opened: Iterable[Opened], items: list[Incident]) -> list[Opened]:
    """The pass's decisions as incidents: the failures of one cause together, none for a pod
    that an open incident already has (a hung worker then failed)."""
    taken = {p for x in items if x.open for p in x.pods}
    out: list[Opened] = []
    for o in opened:
        pods = tuple(p for p in o.pods if p not in taken)
        if o.pods and not pods:
            continue
        taken |= set(pods)
        same = next((i for i, x in enumerate(out)
                     if (x.cause, x.kind) == (o.cause, o.kind) and x.pods and pods), None)
        if same is None:
            out.append(replace(o, pods=pods))
        else:
            out[same] = replace(out[same], pods=out[same].pods + pods,
                                slots=out[same].slots + o.slots)
    return out


def _phases(inc: Incident, t: Tick, claimed: set[int]) -> tuple[Incident, list[str]]:
    ph, new = dict(inc.phases), []
    if inc.hosts and "fenced" not in ph and t.fenced & set(inc.hosts):
        ph["fenced"] = t.wall
        new.append("fenced")
    reps = list(inc.replacements)
    for slot, pod in t.created:
        if slot in claimed or pod in reps:
            continue
        if slot in inc.slots or (inc.kind == "scale" and inc.cause == "ScaleOut"):
            reps.append(pod)
            claimed.add(slot)
    p = t.progress
    if ("resumed" not in ph and p.resets > inc.resets_at and p.grew_at == t.wall
            and p.grew_at > ph["detected"]):
        ph["resumed"] = t.wall
        new.append("resumed")
    if reps and "created" not in ph:
        ph["created"] = t.wall
        new.append("created")
    seen = [t.pods.get(r) for r in reps]
    for phase, done in (("scheduled", lambda s: s.scheduled), ("started", lambda s: s.started),
                        ("joined", lambda s: s.host is not None and s.host in t.joined)):
        if reps and phase not in ph and all(s is not None and done(s) for s in seen):
            ph[phase] = t.wall
            new.append(phase)
    full = ("resumed" in ph and p.world is not None and p.world == p.desired
            and (not reps or "joined" in ph))
    if full:
        ph["full"] = t.wall
        new.append("full")
    return replace(inc, phases=ph, replacements=tuple(reps)), new


def _closed(inc: Incident, t: Tick) -> Incident:
    ph = dict(inc.phases)
    ph.setdefault("full", t.wall)
    return replace(_counted(inc, t.progress), phases=ph, open=False)


def _counted(inc: Incident, p: Progress) -> Incident:
    return replace(inc, redone=max(0, p.redone - inc.redone_at),
                   lost_ws=round(max(0.0, p.lost_ws - inc.lost_at), 2))


def last(book: Book) -> Incident | None:
    return book.incidents[-1] if book.incidents else None


# -- the stored form (the state ConfigMap's "incidents") --------------------------------------

def to_list(book: Book) -> list[dict[str, Any]]:
    return [{"id": x.id, "cause": x.cause, "kind": x.kind, "pods": list(x.pods),
             "slots": list(x.slots), "label": x.label(),
             "phases": {k: round(v, 3) for k, v in x.phases.items()},
             "replacements": list(x.replacements), "redone": x.redone, "lost_ws": x.lost_ws,
             "open": x.open} for x in book.incidents]


def from_list(raw: Any) -> Book:
    """The stored incidents (an open one is closed: a new supervisor cannot follow it);
    raise ValueError naming what is damaged."""
    if not raw:
        return Book()
    try:
        items = tuple(Incident(
            int(d["id"]), str(d["cause"]), str(d["kind"]), tuple(map(str, d.get("pods", ()))),
            tuple(int(s) for s in d.get("slots", ())),
            {str(k): float(v) for k, v in d["phases"].items() if k in PHASES},
            replacements=tuple(map(str, d.get("replacements", ()))),
            redone=int(d.get("redone", 0)), lost_ws=float(d.get("lost_ws", 0.0)), open=False)
            for d in raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"incidents: {e!r}") from e
    return Book(items, max((x.id for x in items), default=0) + 1)


def phase_seconds(inc: Incident) -> dict[str, float]:
    """Seconds from detection to each phase reached."""
    t0 = inc.phases["detected"]
    return {ph: round(inc.phases[ph] - t0, 3) for ph in PHASES if ph in inc.phases}
