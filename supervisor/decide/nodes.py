"""PURE: the steps of a pass about down nodes: the disruption brake (nodes down together past
the threshold are held back), the settling hold after an API outage (a node the returning
control plane marks down while its workers heartbeat) and the quarantine of a node with node
evidence (quarantine.py's rule)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from supervisor.decide import (
    disruption,
    failures,
    fleet,
    hostlist,
    plan,
    quarantine,
)
from supervisor.decide.beats import Beat, talking
from supervisor.decide.classify import (
    Cause,
    held_nodes,
)
from supervisor.decide.hang import Verdict
from supervisor.decide.hostlist import HostMode
from supervisor.decide.plan import Note
from supervisor.model import EventSpec
from supervisor.observe import Obj

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    pass
from supervisor.decide.memory import Passing, Seen, Settings, current_slot


def brake(p: Passing, s: Seen, st: Settings, down: set[str]) -> None:
    """Step 3: hold back the loss of nodes that went down together (classify.held_nodes).
    Nodes released while still down get a fresh grace: they come back one by one."""
    c = p.c
    braked: frozenset[str] = frozenset()
    job_nodes: set[str] = set()
    if down and st.disruption_threshold is not None:
        job_nodes = {node for pod in s.pods.values()
                     if (node := pod.get("spec", {}).get("nodeName"))
                     and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")}
        braked = held_nodes(job_nodes, frozenset(s.nodes), down, st.disruption_threshold)
    if braked == c.braked:
        return
    node_down = {n: (s.now if n in c.braked - braked else t) for n, t in c.node_down.items()}
    if braked:
        cluster_down = len(down & set(s.nodes))
        note = (f"{len(braked)} of the {len(job_nodes)} nodes of the job's workers "
                f"({cluster_down} of the cluster's {len(s.nodes)} nodes) are down together "
                f"({', '.join(sorted(braked))}): their workers are held, "
                f"not failed or force-deleted, until fewer are down "
                f"(SUPERVISOR_NODE_DISRUPTION_THRESHOLD={st.disruption_threshold:g})")
        p.todo.append(Note("warning", "node.disruption", {"nodes": sorted(braked),
                                                          "note": note},
                           EventSpec("Warning", "NodeDisruption", "Hold", note)))
    else:
        note = (f"fewer of the job's nodes are down now ({', '.join(sorted(c.braked))} "
                "held before): node loss is handled again")
        p.todo.append(Note("info", "node.disruption_over", {"nodes": sorted(c.braked)},
                           EventSpec("Normal", "NodeDisruptionOver", "Resume", note)))
    p.c = replace(c, braked=braked, node_down=node_down)


# After an outage of the API server (or of the supervisor's link to it) the node controller may
# mark nodes NotReady whose kubelets could not renew their Leases through it, and they turn
# Ready again at their next status update: no node was lost. For this long after its own watch
# came back, the supervisor holds a down node whose workers' training processes all heartbeat.
OUTAGE_SETTLE_S = 60.0


OUTAGE_MIN_S = 5.0  # a watch broken this long is an outage (a routine reconnect is shorter)


def settling_nodes(down: set[str], pods: Mapping[str, Obj], beats: tuple[Beat, ...], *,
                   mode: HostMode, silence_s: float, now: float,
                   api_back_at: float | None) -> frozenset[str]:
    """PURE: the down nodes to hold (see OUTAGE_SETTLE_S): every live worker on them has a
    training process that heartbeats now, within OUTAGE_SETTLE_S of the API's return."""
    if api_back_at is None or now - api_back_at > OUTAGE_SETTLE_S or not down:
        return frozenset()
    heard = talking(beats, now, silence_s)
    on: dict[str, list[str | None]] = {}
    for pod in pods.values():
        node = pod.get("spec", {}).get("nodeName")
        if node in down and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            on.setdefault(node, []).append(hostlist.host_of(pod, mode))
    return frozenset(n for n, hosts in on.items() if all(h in heard for h in hosts))


def settle(p: Passing, s: Seen, st: Settings, down: set[str]) -> None:
    """Step 3b: hold nodes that went down with the API server (settling_nodes), said once."""
    c = p.c
    settling = settling_nodes(down, s.pods, s.beats, mode=st.plan.host_mode,
                              silence_s=st.hang.silence_s, now=s.now,
                              api_back_at=s.api_back_at) if s.hooked else frozenset()
    if settling == c.settling:
        return
    if new := settling - c.settling:
        note = (f"node(s) {', '.join(sorted(new))} went down within {OUTAGE_SETTLE_S:g}s of "
                "the API server's return while every worker on them heartbeats: held, not "
                "replaced, while they do (their kubelets report again at their next update)")
        p.todo.append(Note("warning", "node.settling", {"nodes": sorted(new), "note": note},
                           EventSpec("Warning", "NodeSettling", "Hold", note)))
    if gone := c.settling - settling:
        p.todo.append(Note("info", "node.settled", {
            "nodes": sorted(gone), "still_down": sorted(gone & down)}))
    p.c = replace(c, settling=settling)


def quarantine_signs(found: list[failures.Failed], leaving: Mapping[str, plan.Leaving],
                     stuck: frozenset[str], job: str, *,
                     after_outage: bool = False) -> list[quarantine.Sign]:
    """What the quarantine reads of this pass's failures and of the workers leaving for a
    node-problem condition or for being slow (quarantine.py says what counts); `stuck`: pods
    failed because their main thread stood still (Hung too, but the script's). `after_outage`:
    within OUTAGE_SETTLE_S of the API server's return, a node lost is the node controller
    catching up with Leases it could not see renewed (it marks such nodes NotReady for a moment: the
    soak's seed 12, es-node-1 NotReady 10 s after a 3-minute outage, both its workers failed):
    not the node's own evidence. Its workers are replaced all the same; a node really gone
    stays NotReady, where the scheduler puts nothing anyway."""
    kinds = {Cause.NODE_NOT_READY: quarantine.Kind.LOST, Cause.HUNG: quarantine.Kind.HUNG,
             Cause.EXIT_CODE: quarantine.Kind.EXIT}
    out = []
    for x in found:
        f = x.failure
        kind = (quarantine.Kind.NOT_STARTED if f.cause is Cause.NOT_STARTED and f.node_fault
                else kinds.get(f.cause))
        if kind is None or not f.node or f.pod in stuck or (
                kind is quarantine.Kind.LOST and after_outage):
            continue
        slot = fleet.slot_of(x.pod, job)
        out.append(quarantine.Sign(kind, f.node, f.uid, None if slot is None else slot[0],
                                   f.exit_code))
    node_kinds = {disruption.Why.BAD_NODE.value: quarantine.Kind.CONDITION,
                  disruption.Why.SLOW.value: quarantine.Kind.SLOW}
    out += [quarantine.Sign(node_kinds[w.why], w.node, w.uid, w.slot)
            for w in leaving.values() if w.node and w.why in node_kinds]
    return out


def quarantine_nodes(p: Passing, s: Seen, st: Settings, found: list[failures.Failed], *,
                verdict: Verdict | None, suspects: set[str]) -> None:
    """Step 7c: a node where the job's workers keep failing for the node's own reasons gets no
    new worker of the job for a while, unless the nodes left cannot hold the job
    (quarantine.py); its end is said too."""
    ix = s.facts(st.plan.job)
    placed = ix.placed
    # The nodes the job's workers run (or ran) on: where the scheduler can put them (the
    # template's selectors and affinities), which the supervisor cannot judge by itself.
    usable = [name for name, n in ix.nodes.items()
              if (name in placed or name in p.c.quarantine.held) and n.problem is None
              and not n.cordoned]
    fl = p.c.fleet
    need = max(len(fl.active()) if fl is not None else ix.live, p.c.scale_request or 0)
    stuck = frozenset(s.listed_hosts.get(k.host, "") for k in verdict.stuck) if verdict else (
        frozenset())
    signs = quarantine_signs(found, p.c.leaving, stuck, st.plan.job, after_outage=(
        s.api_back_at is not None and s.now - s.api_back_at <= OUTAGE_SETTLE_S))
    alike = {name: n.allocatable for name, n in ix.nodes.items()}
    # a current worker the scheduler has found no node for, for a while
    starved = any(s.wall - t >= quarantine.STARVED_S and not ix.pods[name].terminal
                  and current_slot(fl, s.pods[name], st.plan.job)
                  for name, t in ix.unschedulable.items())
    ch = quarantine.step(p.c.quarantine, signs, s.wall, st.quarantine, usable=usable,
                         placed=placed, need=need, down=suspects, alike=alike, starved=starved,
                         present=ix.uids)
    q = st.quarantine

    def short(left: int, needed: int) -> str:
        return (f"the nodes left were seen to hold {left} of the {needed} workers the job needs"
                if left < needed else f"a worker of the job has found no node for "
                                      f"{quarantine.STARVED_S:g}s")

    for node, left, needed in ch.spared:
        p.todo.append(Note("info", "node.quarantine_spared", {
            "node": node, "can_hold": left, "need": needed, "reason": short(left, needed)}))
    if ch.q is p.c.quarantine:
        return
    for node, left, needed in ch.lifted:
        note = f"node {node}: quarantine lifted early: {short(left, needed)}"
        p.todo.append(Note("warning", "node.quarantine_lifted", {
            "node": node, "can_hold": left, "need": needed, "reason": short(left, needed)},
            EventSpec("Warning", "NodeQuarantineLifted", "Quarantine", note)))
    for node, n in ch.started:
        note = (f"node {node}: {n} failures of the job's workers there pointed at the node "
                f"within {q.window_s:g}s: no new worker of the job goes there for {q.ttl_s:g}s")
        p.todo.append(Note("warning", "node.quarantined", {"node": node, "failures": n,
                                                           "for_s": q.ttl_s},
                           EventSpec("Warning", "NodeQuarantined", "Quarantine", note)))
    for node in ch.ended:
        p.todo.append(Note("info", "node.released", {"node": node}, EventSpec(
            "Normal", "NodeReleased", "Quarantine",
            f"node {node}: quarantine over, new workers of the job may go there again")))
    p.c = replace(p.c, quarantine=ch.q)
