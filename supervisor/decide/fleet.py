"""PURE: the worker slots of a job whose workers the supervisor creates, and what they need.

A slot is a worker position 0..W-1. Each slot has a current incarnation: its pod is named
`<job>-w<slot>-<incarnation>` (workers.pod_name), so creating it twice is impossible and a
restarted supervisor finds what it created. A failure of the current incarnation goes through the
policy once: Restart moves the slot to the next incarnation (due after the backoff, avoiding the
failed node), Ignore / a refused restart / FailJob drop the slot. A failure of an older
incarnation, or of a dropped slot, was handled before (maybe by an earlier supervisor): stale.

`Fleet` (slots + the policy ledger) is what the supervisor persists; `fleet_to_dict` /
`fleet_from_dict` are its JSON codec (damaged state is an error, never silently reset).
Times are wall-clock epoch seconds (they outlive the process). No I/O.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.decide.classify import Cause, Failure
from supervisor.decide.policy import (
    Action,
    Decision,
    Ledger,
    Policy,
    decide,
    ledger_from_dict,
    ledger_to_dict,
)
from supervisor.model import JsonText
from supervisor.observe import Obj
from supervisor.workers import (
    ANNOTATION_AHEAD_OF,
    LABEL_INCARNATION,
    LABEL_JOB,
    LABEL_SLOT,
    pod_name,
    spell,
)

FLEET_VERSION = 1
SCALE_KEY = "scale.json"  # key of the scale request ConfigMap: {"workers": N}


def state_name(job: str) -> str:
    """The ConfigMap holding the job's slots and restart budgets (written by the supervisor)."""
    return f"{job}-supervisor-state"


def budget_name(job: str) -> str:
    """The PodDisruptionBudget of the job's workers (kept by the supervisor)."""
    return f"{job}-supervisor-workers"


def scale_name(job: str) -> str:
    """The ConfigMap holding the desired worker count (written by `elastic-supervisor scale`)."""
    return f"{job}-supervisor-scale"


def scale_request(raw: str | None) -> int:
    """The worker count a scale ConfigMap's SCALE_KEY (`{"workers": N}`) asks for; raise
    ValueError saying what it holds instead. Only a JSON integer counts: `true`, `"7"`, `2.9`
    and `1e400` (infinity to the JSON parser) are refused, never rounded; the range is the
    plan's to check."""
    try:
        doc = json.loads(raw or "")
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(doc, dict) or "workers" not in doc:
        raise ValueError('not a JSON object with "workers"')
    workers = doc["workers"]
    if type(workers) is not int:  # bool is an int to isinstance
        shown = json.dumps(workers)
        raise ValueError(f'"workers" is {shown[:40]}{"..." if len(shown) > 40 else ""}, '
                         "not an integer")
    return workers


@dataclass(frozen=True)
class Slot:
    incarnation: int = 1  # the incarnation that should exist now
    dropped: str | None = None  # why the slot gets no more pods; None: active
    due: float = 0.0  # its pod may not be created before this time (backoff)
    avoid_node: str | None = None  # the node its previous incarnation failed on
    added_at: float | None = None  # scale-out: when it was added, until its pod runs
    retiring_at: float | None = None  # scale-in: when it was asked to go
    # Its previous pod hung and is being deleted (the kubelet kills it): this one is created
    # once that pod is gone, or after this time kept off its node (`avoid_node`, required).
    hold_until: float | None = None


@dataclass(frozen=True)
class Fleet:
    slots: Mapping[int, Slot] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)

    # A fleet is never changed (a change is a new object), so what a pass asks of it several
    # times (at 10,000 workers, each answer walks every slot) is worked out once per fleet.
    def _once(self, key: str, work: Callable[[], Any]) -> Any:
        known = self.__dict__.get(key)
        if known is None:
            known = work()
            object.__setattr__(self, key, known)
        return known

    def active(self) -> list[int]:
        """Slots that should have a pod (not dropped, not being scaled in)."""
        return list(self._once("_active", lambda: tuple(sorted(
            i for i, s in self.slots.items() if _is_active(s)))))

    def with_slot(self, i: int, slot: Slot | None, ledger: Ledger | None = None) -> Fleet:
        """This fleet with slot `i` as `slot` (None: removed), and `ledger` if given. What was
        worked out of this fleet (`_once`) comes along, changed for the one slot: a failure
        changes one slot of 10,000, and working each answer out again walked them all, for
        every fleet of a failure's passes."""
        slots = dict(self.slots)
        old = slots.pop(i, None)
        if slot is not None:
            slots[i] = slot
        new = Fleet(slots=slots, ledger=self.ledger if ledger is None else ledger)
        known = self.__dict__
        for key, holds in (("_active", _is_active), ("_changing", _is_changing),
                           ("_retiring", _is_retiring)):
            if (ordered := known.get(key)) is not None:
                object.__setattr__(new, key, _with(ordered, i, holds(old), holds(slot)))
        if (deadlines := known.get("_deadlines")) is not None:
            object.__setattr__(new, "_deadlines", _with_deadlines(deadlines, old, slot))
        if (named := known.get("_current")) is not None:
            carried = {}
            for job, was in named.items():
                names = dict(was)
                if old is not None and _is_active(old):
                    del names[spell(job, i, old.incarnation)]
                if slot is not None and _is_active(slot):
                    names[spell(job, i, slot.incarnation)] = i
                carried[job] = names
            object.__setattr__(new, "_current", carried)
        return new

    def current(self, job: str) -> Mapping[str, int]:
        """The name of each active slot's current pod -> its slot."""
        named: dict[str, dict[str, int]] = self._once("_current", dict)
        if job not in named:
            named[job] = {spell(job, i, self.slots[i].incarnation): i for i in self.active()}
        return named[job]

    def changing(self) -> list[int]:
        """Slots being scaled out (added, their pod not Running yet) or in (retiring)."""
        return list(self._once("_changing", lambda: tuple(sorted(
            i for i, s in self.slots.items() if _is_changing(s)))))

    def retiring(self) -> list[int]:
        return list(self._once("_retiring", lambda: tuple(sorted(
            i for i, s in self.slots.items() if _is_retiring(s)))))


def _is_active(s: Slot | None) -> bool:
    return s is not None and s.dropped is None and s.retiring_at is None


def _is_changing(s: Slot | None) -> bool:
    return s is not None and (s.added_at is not None or s.retiring_at is not None)


def _is_retiring(s: Slot | None) -> bool:
    return s is not None and s.retiring_at is not None


def _with(ordered: tuple[int, ...], i: int, was: bool, now: bool) -> tuple[int, ...]:
    """The sorted slots `ordered` with `i` in (`now`) or out, `was` saying where it was."""
    if was == now:
        return ordered
    at = bisect.bisect_left(ordered, i)
    return (*ordered[:at], i, *ordered[at:]) if now else (*ordered[:at], *ordered[at + 1:])


def initial(workers: int) -> Fleet:
    """The fleet of a new job: slots 0..workers-1, first incarnation, due at once."""
    return Fleet(slots={i: Slot() for i in range(workers)})


HUNG_HOLD_S = 10.0  # a hung pod's replacement waits this long for it to be gone (see `wanted`)


def workers_for(np: int, slots_per_worker: int) -> int:
    """Worker pods needed for `np` Horovod slots."""
    return math.ceil(np / slots_per_worker)


def slot_of(pod: Obj, job: str) -> tuple[int, int] | None:
    """Return (slot, incarnation) of a pod the supervisor created for `job`, else None."""
    labels = pod.get("metadata", {}).get("labels") or {}
    if labels.get(LABEL_JOB) != job:
        return None
    try:
        slot, inc = int(labels[LABEL_SLOT]), int(labels[LABEL_INCARNATION])
    except (KeyError, ValueError):
        return None
    return (slot, inc) if slot >= 0 and inc >= 1 else None


def adopt(fleet: Fleet, pods: Iterable[Obj], job: str) -> Fleet:
    """Return the fleet after seeing existing pods: a slot whose pod shows a newer incarnation
    than stored (state written by a supervisor that crashed before saving) moves up to it,
    unless that pod was placed ahead of a move of the slot's pod, which is still there
    (ANNOTATION_AHEAD_OF: the move has not happened); a slot the state does not know comes
    back only from a pod that is not being deleted."""
    slots = dict(fleet.slots)
    pods = list(pods)
    present = {p["metadata"]["name"] for p in pods
               if not p.get("metadata", {}).get("deletionTimestamp")}
    for pod in pods:
        found = slot_of(pod, job)
        if found is None:
            continue
        i, inc = found
        current = slots.get(i)
        if current is None and pod.get("metadata", {}).get("deletionTimestamp"):
            continue  # a slot removed by a scale-in whose pod is still going: not revived
        ahead_of = (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_AHEAD_OF)
        if (current is not None and ahead_of in present
                and ahead_of == pod_name(job, i, current.incarnation)):
            continue
        if current is None or inc > current.incarnation:
            slots[i] = Slot(incarnation=inc, dropped=current.dropped if current else None)
    return replace(fleet, slots=slots) if slots != fleet.slots else fleet


def scale_to(fleet: Fleet, workers: int, now: float) -> Fleet:
    """Return the fleet with `workers` active slots: scale-out revives dropped slots first
    (a new incarnation) and then adds new ones; scale-in retires the highest active slots."""
    slots = dict(fleet.slots)
    active = fleet.active()
    if workers > len(active):
        need = workers - len(active)
        for i in sorted(slots):
            s = slots[i]
            if need and s.dropped is not None and s.retiring_at is None:
                slots[i] = Slot(incarnation=s.incarnation + 1, due=now, added_at=now)
                need -= 1
        nxt = max(slots, default=-1) + 1
        for i in range(nxt, nxt + need):
            slots[i] = Slot(due=now, added_at=now)
    elif workers < len(active):
        for i in active[workers:]:
            slots[i] = replace(slots[i], retiring_at=now, added_at=None)
    return replace(fleet, slots=slots) if slots != fleet.slots else fleet


def leave(fleet: Fleet, slot: int, now: float, node: str | None) -> Fleet:
    """Return the fleet with `slot` at its next incarnation, due at once and away from `node`
    (preferred), no budget used: its pod was announced to go and leaves gracefully."""
    s = fleet.slots[slot]
    return fleet.with_slot(slot, Slot(incarnation=s.incarnation + 1, due=now, avoid_node=node))


def retire_done(fleet: Fleet, slot: int) -> Fleet:
    """Return the fleet without `slot` (its pod is deleted: the scale-in is complete)."""
    return fleet.with_slot(slot, None)


def on_failure(fleet: Fleet, failure: Failure, found: tuple[int, int] | None, policy: Policy,
               now: float, *, unmanaged_reason: str) -> tuple[Fleet, Decision | None]:
    """Return the fleet after `failure` and the decision; None when it is stale.

    `found` is the failed pod's (slot, incarnation), None if the supervisor did not create it:
    then the decision is taken but a Restart cannot be carried out (`unmanaged_reason`).
    """
    if found is None:
        d = decide(policy, failure, failure.pod, Ledger(), now)
        if d.action is Action.RESTART:
            return fleet, Decision(Action.IGNORE, d.rule, refused=unmanaged_reason,
                                   ledger=fleet.ledger)
        return fleet, replace(d, ledger=fleet.ledger)
    i, inc = found
    slot = fleet.slots.get(i)
    # (a later incarnation than the slot's is a replacement placed ahead of a move that has
    # not happened: core deletes it, the slot's own pod trains on)
    if (slot is None or inc != slot.incarnation or slot.dropped is not None
            or slot.retiring_at is not None):
        return fleet, None
    d = decide(policy, failure, str(i), fleet.ledger, now)
    if d.action is Action.RESTART:
        hold = now + HUNG_HOLD_S if failure.cause is Cause.HUNG and failure.node else None
        new = Slot(incarnation=inc + 1, due=now + d.delay_s, avoid_node=failure.node,
                   hold_until=hold)
    else:
        why = d.refused or (f"{d.action.value} by {d.rule}")
        new = replace(slot, dropped=why)
    return fleet.with_slot(i, new, d.ledger), d


def renew(fleet: Fleet, slot: int, incarnation: int, now: float) -> Fleet:
    """Return the fleet with `slot`'s pod `incarnation` to be replaced at once by the next one,
    no budget used: the pod never worked (its IP was another worker's, which Horovod
    blacklisted for good). Unchanged if that incarnation is no longer the slot's current one."""
    s = fleet.slots.get(slot)
    if s is None or s.incarnation != incarnation or s.dropped is not None \
            or s.retiring_at is not None:
        return fleet
    return fleet.with_slot(slot, replace(s, incarnation=incarnation + 1, due=now))


def current_pods(fleet: Fleet, job: str) -> frozenset[str]:
    """Names of the pods the active slots should have now."""
    return frozenset(fleet.current(job))


@dataclass(frozen=True)
class Create:
    slot: int
    incarnation: int
    name: str
    avoid_node: str | None
    away: bool = False  # `avoid_node` is required, not preferred: the old pod is still there


def wanted(fleet: Fleet, job: str, existing: Mapping[str, Any] | set[str],
           now: float) -> list[Create]:
    """Return the pods to create now: active slots whose current pod does not exist yet and
    whose backoff has passed. `existing`: names of pods seen or being created. A slot whose
    previous pod hung waits until that pod is gone (its kubelet killed it), at most until
    `hold_until`; then its pod is created kept off that node."""
    out = []
    current = fleet.current(job)
    for i in sorted(current[name] for name in current.keys() - existing):
        slot = fleet.slots[i]
        if slot.due > now:
            continue
        name = pod_name(job, i, slot.incarnation)  # (checked here: a DNS label)
        held = (slot.hold_until is not None
                and pod_name(job, i, slot.incarnation - 1) in existing)
        if held and now < (slot.hold_until or 0.0):
            continue
        out.append(Create(i, slot.incarnation, name, slot.avoid_node, away=held))
    return out


def next_due(fleet: Fleet, now: float) -> float | None:
    """Return the earliest future backoff or hold deadline of an active slot, or None. The
    loop asks on every pass: the deadlines are sorted once per fleet (or carried over by
    Fleet.with_slot), each ask is a bisect (at 10,000 slots a walk of them all was 4 % of the
    loop)."""
    times = fleet._once("_deadlines", lambda: _deadlines(fleet.slots.values()))[0]
    i = bisect.bisect_right(times, now)
    return times[i] if i < len(times) else None


def _deadlines(slots: Iterable[Slot]) -> tuple[tuple[float, ...], dict[float, int]]:
    """The deadlines of `slots` sorted, each once, and how many slots have each."""
    counts: dict[float, int] = {}
    for s in slots:
        for t in _deadlines_of(s):
            counts[t] = counts.get(t, 0) + 1
    return tuple(sorted(counts)), counts


def _deadlines_of(s: Slot | None) -> tuple[float, ...]:
    if s is None or s.dropped is not None:
        return ()
    return tuple(t for t in (s.due, s.hold_until or 0.0) if t > 0)


def _with_deadlines(known: tuple[tuple[float, ...], dict[float, int]], old: Slot | None,
                    new: Slot | None) -> tuple[tuple[float, ...], dict[float, int]]:
    """`_deadlines` with one slot changed from `old` to `new`."""
    gone, added = _deadlines_of(old), _deadlines_of(new)
    if gone == added:
        return known
    times, counts = list(known[0]), dict(known[1])
    for t in gone:
        counts[t] -= 1
        if not counts[t]:
            del counts[t]
            del times[bisect.bisect_left(times, t)]
    for t in added:
        counts[t] = counts.get(t, 0) + 1
        if counts[t] == 1:
            bisect.insort(times, t)
    return tuple(times), counts


# ---- persistence --------------------------------------------------------------------------------

def released(fleet: Fleet) -> Fleet:
    """The fleet after a cleanup deleted its workers: every active slot at its next
    incarnation, so a later supervisor sees those pods as older incarnations (never charged)
    and creates new ones at once."""
    return replace(fleet, slots={
        i: replace(s, incarnation=s.incarnation + 1, avoid_node=None, due=0.0,
                   hold_until=None)
        if s.dropped is None and s.retiring_at is None else s
        for i, s in fleet.slots.items()})


def fleet_to_dict(fleet: Fleet) -> dict[str, Any]:
    """The fleet as stored, as a mapping (what `fleet_from_dict` reads back). A slot's entry is
    made once per Slot object (a slot that changed is a new one) and shared by every state that
    holds it: read it, never change it. The state saved before each create is `stored`."""
    return {"version": FLEET_VERSION,
            "slots": {str(i): _slot_entry(s) for i, s in sorted(fleet.slots.items())},
            "ledger": ledger_to_dict(fleet.ledger)}


def stored(fleet: Fleet) -> dict[str, Any]:
    """`fleet_to_dict` with its slots as the JSON text `stored_slots` keeps: what the state
    saved before each create holds (at 10,000 slots making the slots' mapping for each save
    was 12 % of the loop, and encoding it again ~12 ms of the save)."""
    return {"version": FLEET_VERSION, "slots": stored_slots(fleet),
            "ledger": ledger_to_dict(fleet.ledger)}


def stored_slots(fleet: Fleet) -> JsonText:
    """The slots of `fleet_to_dict` as JSON text (model.JsonText: as json.dumps writes them
    with sorted keys), joined from a text kept per Slot object, once per fleet."""
    def made() -> JsonText:
        slots = fleet.slots
        keys = sorted(map(str, slots))  # (JSON's sorted keys: as strings)
        return JsonText("{" + ", ".join(
            f'"{k}": {_slot_text(slots[int(k)])}' for k in keys) + "}")
    text: JsonText = fleet._once("_stored_text", made)
    return text


def _slot_text(s: Slot) -> str:
    known: str | None = s.__dict__.get("_text")
    if known is None:
        known = json.dumps(_slot_entry(s), sort_keys=True)
        object.__setattr__(s, "_text", known)
    return known


def _slot_entry(s: Slot) -> dict[str, Any]:
    known: dict[str, Any] | None = s.__dict__.get("_entry")
    if known is None:
        known = _make_entry(s)
        object.__setattr__(s, "_entry", known)
    return known


def _make_entry(s: Slot) -> dict[str, Any]:
    entry: dict[str, Any] = {"incarnation": s.incarnation}
    if s.dropped is not None:
        entry["dropped"] = s.dropped
    if s.due:
        entry["due"] = s.due
    if s.avoid_node:
        entry["avoidNode"] = s.avoid_node
    if s.added_at is not None:
        entry["addedAt"] = s.added_at
    if s.retiring_at is not None:
        entry["retiringAt"] = s.retiring_at
    if s.hold_until is not None:
        entry["holdUntil"] = s.hold_until
    return entry


def fleet_from_dict(data: Any) -> Fleet:
    """Return the stored fleet; raise ValueError saying what is wrong."""
    if not isinstance(data, dict) or data.get("version") != FLEET_VERSION:
        raise ValueError(f"expected a mapping with version {FLEET_VERSION}")
    raw = data.get("slots")
    if not isinstance(raw, dict):
        raise ValueError("slots: expected a mapping of slot number to slot")
    slots = {}
    for key, s in raw.items():
        where = f"slots.{key}"
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(s, dict):
            raise ValueError(f"{where}: expected a slot number mapped to a slot")
        inc, due = s.get("incarnation"), s.get("due", 0.0)
        dropped, avoid = s.get("dropped"), s.get("avoidNode")
        added, retiring = s.get("addedAt"), s.get("retiringAt")
        hold = s.get("holdUntil")
        for field_name, t in (("addedAt", added), ("retiringAt", retiring),
                              ("holdUntil", hold)):
            if t is not None and (not isinstance(t, int | float) or isinstance(t, bool)):
                raise ValueError(f"{where}.{field_name}: expected a time")
        if not isinstance(inc, int) or isinstance(inc, bool) or inc < 1:
            raise ValueError(f"{where}.incarnation: expected an integer >= 1")
        if not isinstance(due, int | float) or isinstance(due, bool):
            raise ValueError(f"{where}.due: expected a time")
        if not isinstance(dropped, str | None) or not isinstance(avoid, str | None):
            raise ValueError(f"{where}: dropped and avoidNode must be strings")
        slots[int(key)] = Slot(incarnation=inc, dropped=dropped, due=float(due),
                               avoid_node=avoid,
                               added_at=None if added is None else float(added),
                               retiring_at=None if retiring is None else float(retiring),
                               hold_until=None if hold is None else float(hold))
    try:
        ledger = ledger_from_dict(data.get("ledger"))
    except ValueError as e:
        raise ValueError(f"ledger: {e}") from None
    return Fleet(slots=slots, ledger=ledger)


def limits(min_np: int, max_np: int, slots_per_worker: int) -> tuple[int, int]:
    """The [min, max] worker counts a scale request may ask for."""
    return math.ceil(min_np / slots_per_worker), max(1, max_np // slots_per_worker)
