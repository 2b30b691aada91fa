"""PURE: the step of a pass about announced disruptions (disruption.notice): a worker evicted,
deleted with a grace, its node cordoned, tainted or going bad leaves gracefully; under a cordon
alone, and for a straggler to move (slowranks.py), its replacement is placed ahead first (Move),
and with nowhere to go it trains on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from supervisor.decide import (
    admission,
    disruption,
    fleet,
    hostlist,
    plan,
)
from supervisor.decide.classify import (
    training_container,
)
from supervisor.decide.plan import Note
from supervisor.decide.script import DeletePod
from supervisor.model import EventSpec
from supervisor.observe import pod_problem
from supervisor.workers import pod_name

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    pass
from supervisor.decide.memory import (
    CreateWorker,
    Passing,
    Seen,
    Settings,
    nodes_kept_off,
    suspect_nodes,
)


def announced(p: Passing, s: Seen, st: Settings, suspects: set[str]) -> None:
    """Step 7b: the workers announced to go leave gracefully (see disruption.py); one whose
    node is only cordoned once its replacement runs (move_ahead)."""
    fl = p.c.fleet
    if fl is None or not st.classify.graceful_leave:
        return
    moving: dict[str, str] = {}
    staying: set[str] = set()
    kept_off = nodes_kept_off(p.c, s, st, suspects)
    leaving, failed = dict(p.c.leaving), set(p.c.failed)
    mode = st.plan.host_mode
    # Horovod needs a member of the last world to stay (it broadcasts the state from one):
    # the driver's last assignment (the hook), else the hosts published.
    driver = s.driver
    world = (set(driver.world) if driver is not None and driver.world_seq
             else set(s.listed_hosts))
    gone = {h for name in leaving if (q := s.pods.get(name)) is not None
            and (h := hostlist.host_of(q, mode))}
    waits = set()
    slow = p.c.slow.moving
    for i in _maybe_announced(fl, s, st, slow):
        slot = fl.slots[i]
        name = pod_name(st.plan.job, i, slot.incarnation)
        pod = s.pods.get(name)
        if pod is None or (uid := pod["metadata"].get("uid", "")) in failed:
            continue
        node = pod.get("spec", {}).get("nodeName") or None
        n = disruption.notice(pod, s.nodes.get(node or ""), training_container(pod, st.classify),
                              st.disruption)
        if n is None and name in slow:  # a straggler to move (slowranks.py)
            n = disruption.Notice(disruption.Why.SLOW, slow[name])
        ahead = pod_name(st.plan.job, i, slot.incarnation + 1)
        if n is None:
            cancel_move(p, s, name, ahead)
            continue
        move = Move(i, slot.incarnation + 1, name, node, ahead, n.detail, n.why)
        # kept off its node: a straggler's replacement would be slow there too
        off = kept_off | {node} if n.why is disruption.Why.SLOW and node else kept_off
        if n.why in AHEAD and not move_ahead(
                p, s, move, kept_off=off, moving=moving, staying=staying):
            continue  # it trains on until its replacement runs
        host = hostlist.host_of(pod, mode)
        if host in world and not world - gone - {host}:
            waits.add(name)  # the last member of the world: once another joined
            if name not in p.c.leave_waits:
                p.todo.append(Note("info", "worker.leave_waits", {
                    "pod": name, "why": n.why.value,
                    "note": "the last worker of Horovod's world that stays: it leaves once "
                            "another one joined"}))
            continue
        gone.add(host or "")
        fl = fleet.leave(fl, i, s.wall, node)
        failed.add(uid)
        leaving[name] = plan.Leaving(i, uid, node, s.wall, n.why.value)
        new = pod_name(st.plan.job, i, slot.incarnation + 1)
        by = (f"its replacement {new} runs already" if n.why in AHEAD
              else f"replaced by {new} now")
        note = (f"worker {name} on {node} is announced to go ({n.why.value}: {n.detail}): out "
                f"of the discovery file, Horovod lets it go at its next commit; {by}")
        p.todo.append(Note("info", "worker.leaving", {
            "pod": name, "node": node, "why": n.why.value, "detail": n.detail,
            "replacement": new}, EventSpec("Normal", "WorkerLeaving", "Leave", note)))
    if fl is not p.c.fleet:
        p.c = replace(p.c, fleet=fl, leaving=leaving, failed=p.c.failed | failed)
    if waits != p.c.leave_waits:
        p.c = replace(p.c, leave_waits=frozenset(waits))
    if moving != p.c.moving or staying != p.c.staying:
        p.c = replace(p.c, moving=moving, staying=frozenset(staying))


def _maybe_announced(fl: fleet.Fleet, s: Seen, st: Settings,
                     slow: Mapping[str, str]) -> list[int]:
    """The active slots, in order, whose pod may be announced to go or has a replacement
    placed ahead (`announced` looks at these only; disruption.notice is None, and
    cancel_move has nothing to do, for every other): a pod deleting or with a DisruptionTarget,
    a pod on a node that is going, a pod of a slot that is not its current one, a straggler
    to move (`slow`)."""
    ix = s.facts(st.plan.job)
    names = set(ix.noticed) | ix.others(fl.current(st.plan.job)) | {
        n for n in slow if n in ix.pods}
    for node in ix.going(s.nodes, st.disruption):
        names |= ix.on_node.get(node, set())
    slots = {f.slot for name in names if (f := ix.pods[name]).slot is not None}
    return [i for i in sorted(slots) if (x := fl.slots.get(i)) is not None
            and x.dropped is None and x.retiring_at is None]


# Announced to go, but not evicted: the worker leaves once its replacement, placed ahead, runs.
AHEAD = frozenset({disruption.Why.CORDONED, disruption.Why.SLOW})


@dataclass(frozen=True)
class Move:
    """A worker on a cordoned node, or a straggler (slot, pod, node), and its replacement
    placed ahead (the slot's next incarnation)."""

    slot: int
    incarnation: int  # the replacement's
    pod: str
    node: str | None
    ahead: str
    detail: str
    why: disruption.Why = disruption.Why.CORDONED

    def nothing_evicts(self) -> str:
        """Why the worker stays until its replacement runs."""
        return ("a cordon evicts nothing" if self.why is disruption.Why.CORDONED
                else "a straggler still trains")


def move_ahead(p: Passing, s: Seen, m: Move, *, kept_off: set[str], moving: dict[str, str],
                staying: set[str]) -> bool:
    """A cordon alone evicts nothing, and a straggler still trains: the worker leaves once its
    replacement, the slot's next incarnation placed ahead of the move (kept off the nodes that
    are going, and a straggler's node), runs; with nowhere to go that replacement stays
    Pending, the job keeps its size, and it moves when a node is there. A replacement that
    fails before it runs is deleted and the worker stays while the cordon (or the slowness)
    lasts (no loop). Return whether the worker leaves now."""
    c = p.c
    q = s.pods.get(m.ahead)
    uid = q["metadata"].get("uid", "") if q is not None else ""
    if q is not None and uid not in c.failed and pod_problem(q, s.nodes) is None:
        return True
    if m.pod in c.staying or (q is not None and (
            uid in c.failed or q.get("status", {}).get("phase") in ("Succeeded", "Failed"))):
        staying.add(m.pod)
        if m.pod in c.staying:
            return False
        # Once, as it happens: a failed (or never started: fail_unstarted) replacement goes.
        if q is not None and not q["metadata"].get("deletionTimestamp"):
            p.c = replace(p.c, failed=p.c.failed | {uid})
            p.todo.append(DeletePod(m.ahead, uid, None))
        note = (f"worker {m.pod} on {m.node} ({m.detail}): its replacement {m.ahead} "
                "failed or never started: deleted; the worker trains on where it is while the "
                f"{'cordon' if m.why is disruption.Why.CORDONED else 'slowness'} lasts "
                f"({m.nothing_evicts()})")
        p.todo.append(Note("warning", "worker.stays", {
            "pod": m.pod, "node": m.node, "replacement": m.ahead}, EventSpec(
            "Warning", "WorkerStays", "Keep", note)))
        return False
    moving[m.pod] = m.ahead
    if m.pod not in c.moving:
        note = (f"worker {m.pod} on {m.node} is announced to go ({m.detail}): "
                f"{m.nothing_evicts()}, so {m.ahead} is placed first and the worker leaves once "
                "it runs; until then it trains on (with nowhere to go, the job keeps its size)")
        p.todo.append(Note("info", "worker.moving", {
            "pod": m.pod, "node": m.node, "replacement": m.ahead}, EventSpec(
            "Normal", "WorkerMoving", "Move", note)))
    if (q is None and m.ahead not in c.expected
            and m.ahead not in admission.waiting(c.blocked, s.now)):
        x = fleet.Create(m.slot, m.incarnation, m.ahead, m.node)
        p.todo.append(CreateWorker(x, tuple(sorted(kept_off)), suspect_nodes(c, s.now),
                                   ahead_of=m.pod))
        p.c = replace(p.c, expected={**p.c.expected, m.ahead: s.now})
    return False


def cancel_move(p: Passing, s: Seen, name: str, ahead: str) -> None:
    """The cordon is over before the move: the replacement placed ahead goes (ours)."""
    q = s.pods.get(ahead)
    if q is None or q["metadata"].get("deletionTimestamp") or (
            uid := q["metadata"].get("uid", "")) in p.c.failed:
        return
    p.c = replace(p.c, failed=p.c.failed | {uid})
    p.todo.append(DeletePod(ahead, uid, None))
    note = (f"worker {name} is no longer announced to go (its node's cordon is over, or it "
            f"is no longer slow): {ahead}, placed ahead of its move, deleted")
    p.todo.append(Note("info", "worker.move_cancelled", {"pod": name, "replacement": ahead},
                       EventSpec("Normal", "WorkerMoveCancelled", "Move", note)))
