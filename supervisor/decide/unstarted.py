"""PURE: the step of a pass about workers that never start (starts.py's rule): a worker bound
to a node that has not started within the bound fails as NotStarted when its node is at fault or
its status does not say, at most starts.LIMIT pods of a slot in a row."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from supervisor.decide import (
    failures,
    starts,
)
from supervisor.decide.classify import (
    Cause,
    Failure,
)
from supervisor.decide.plan import Note
from supervisor.model import EventSpec
from supervisor.workers import ANNOTATION_AHEAD_OF, pod_name

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    pass
from supervisor.decide.memory import Passing, Seen, Settings, current_slot


def fail_unstarted(p: Passing, s: Seen, st: Settings) -> list[failures.Failed]:
    """Step 4b: the worker pods bound to a node that have not started for the bound
    (starts.py). The node's fault, or one the pod's status does not say: a NotStarted failure
    of its slot's current pod (the policy replaces it, off that node, no budget used), at most
    starts.LIMIT pods of a slot in a row, then said once and left. The template's (it would
    fail the same anywhere), or a pod the supervisor does not own: said once, never replaced."""
    c, job, bound = p.c, st.plan.job, st.start_timeout_s
    if bound is None:
        return []
    since: dict[str, float] = {}
    said: dict[str, str] = {}
    row = dict(c.unstarted)
    failed = set(c.failed)
    found: list[failures.Failed] = []
    fl = c.fleet
    ix = s.facts(job)
    for i in list(row) if fl is not None else ():
        slot = fl.slots.get(i)
        if slot is None or slot.dropped is not None or slot.retiring_at is not None:
            continue
        f = ix.pods.get(pod_name(job, i, slot.incarnation))
        if f is not None and f.running and (f.slot, f.incarnation) == (i, slot.incarnation):
            del row[i]  # the slot's current pod does start: the row is over
    unstarted = []  # only the pods not Running are looked at; the few not started, in order
    for name in ix.not_running:
        pod = s.pods[name]
        if (x := starts.stuck(pod)) is not None and pod["metadata"].get("uid") not in failed:
            unstarted.append((name, pod, x))
    for name, pod, x in sorted(unstarted, key=lambda u: u[0]):
        uid = pod["metadata"].get("uid", "")
        since[uid] = c.unstarted_since.get(uid, s.now)
        waited = s.now - since[uid]
        at = current_slot(fl, pod, job)
        node = pod.get("spec", {}).get("nodeName")
        if fl is not None and at is None:
            # An older incarnation's pod is deleted as superseded (plan.py); one placed ahead
            # of a cordoned worker's move is given up at the bound (move_ahead deletes it).
            ahead_of = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_AHEAD_OF)
            if c.moving.get(ahead_of or "") == name and waited >= bound:
                failed.add(uid)
                del since[uid]
                p.todo.append(not_starting(name, node, x, waited, ahead_of=ahead_of))
            continue
        if fl is None or x.fault is starts.Fault.TEMPLATE:
            said[uid] = c.start_said.get(uid, "")
            if said[uid] != x.reason and waited >= min(bound, starts.SAY_AFTER_S):
                said[uid] = x.reason
                p.todo.append(not_starting(name, node, x, waited, owned=fl is not None))
            continue
        if waited < bound:
            continue
        assert at is not None
        n = row.get(at[0], 0)
        if n >= starts.LIMIT:
            if c.start_said.get(uid) != "limit":
                p.todo.append(never_starts(name, at[0], node, x, waited))
            said[uid] = "limit"
            continue
        row[at[0]] = n + 1
        failed.add(uid)
        del since[uid]
        whose = (f"the node's fault ({x.rule})" if x.fault is starts.Fault.NODE else
                 "its status does not say whose fault (the kubelet's Events on the pod do: "
                 "FailedMount, FailedCreatePodSandBox)")
        detail = (f"not started {waited:.0f}s after it was seen bound to node {node} "
                  f"({x.said()}); {whose}; pod {n + 1} of {starts.LIMIT} of this slot in a row "
                  "that never started")
        found.append(failures.Failed(Failure(Cause.NOT_STARTED, name, uid, node, detail=detail,
                                         node_fault=x.fault is starts.Fault.NODE), pod, s.now))
    if (since, row, said) != (c.unstarted_since, c.unstarted, c.start_said) or found:
        p.c = replace(c, unstarted_since=since, unstarted=row, failed=frozenset(failed),
                      start_said=said)
    return found


def not_starting(name: str, node: str | None, x: starts.Stuck, waited: float, *,
                  owned: bool = True, ahead_of: str | None = None) -> Note:
    """A worker that has not started, and is not replaced: said once per kubelet reason."""
    why = (f"placed ahead of the move of {ahead_of} (its node cordoned): given up, "
           f"{ahead_of} trains on where it is" if ahead_of is not None else
           "the pod's template is at fault (it would fail the same on any node): not "
           "replaced; the kubelet keeps trying, and the pod starts once what it names is "
           "there (fix the image, the Secret or the ConfigMap)" if owned else
           "the supervisor does not create workers (SUPERVISOR_WORKER_TEMPLATE is not set): "
           "not replaced")
    note = f"worker {name} on node {node} has not started after {waited:.0f}s: {x.said()}; {why}"
    return Note("warning", "worker.not_starting", {
        "pod": name, "node": node, "container": x.container, "reason": x.reason,
        "message": x.message, "fault": x.fault.value, "rule": x.rule,
        "waited_s": round(waited, 1)}, EventSpec("Warning", "WorkerNotStarting", "Report", note))


def never_starts(name: str, slot: int, node: str | None, x: starts.Stuck,
                  waited: float) -> Note:
    """The slot's pods never started starts.LIMIT times in a row: this one is left."""
    note = (f"worker {name} (slot {slot}) on node {node} has not started after {waited:.0f}s: "
            f"{x.said()}; {starts.LIMIT} pods of this slot in a row never started on other "
            "nodes already, so it is not the node: left as it is, not replaced (look at the "
            "pod's Events: kubectl describe pod)")
    return Note("warning", "worker.never_starts", {
        "pod": name, "slot": slot, "node": node, "container": x.container,
        "reason": x.reason, "message": x.message, "waited_s": round(waited, 1),
        "in_a_row": starts.LIMIT}, EventSpec("Warning", "WorkerNeverStarts", "Keep", note))
