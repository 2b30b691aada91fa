"""PURE: what the decisions read of each worker pod and node, parsed once per change, and the
sets a pass would otherwise build by walking every pod (issue 41's scale: at 10,000 workers a
pass that walked the pods in each of its steps took ~240 ms with nothing changed).

The index is a function of the view alone: `build(pods, nodes, job)` makes it from scratch, and
`put`/`drop` keep one up to date as the view changes (the watches adapter calls them after each
change it applies; tests/unit/test_podindex.py holds the two equal over random sequences of
real shapes). Each fact is what the rule that reads it read off the object before:
`fleet.slot_of`, a deletionTimestamp, `unschedulable_since`, `observe.node_problem`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from supervisor.decide import disruption
from supervisor.decide.classify import TERMINAL_PHASES
from supervisor.decide.fleet import slot_of
from supervisor.observe import Obj, condition, marked_not_ready, node_problem


def unschedulable_since(pod: Obj) -> float | None:
    """PURE: since when (epoch seconds; +inf when its condition has no readable time) the
    scheduler finds no node for the pod, or None when it is not unschedulable."""
    if pod.get("spec", {}).get("nodeName"):
        return None
    for c in pod.get("status", {}).get("conditions") or ():
        if (c.get("type") == "PodScheduled" and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"):
            try:
                return datetime.fromisoformat(c.get("lastTransitionTime") or "").timestamp()
            except ValueError:
                return math.inf
    return None


def unschedulable(pod: Obj) -> bool:
    """PURE: the scheduler found no node for the pod (PodScheduled False, Unschedulable)."""
    return unschedulable_since(pod) is not None


@dataclass(frozen=True)
class PodFacts:
    name: str
    uid: str
    slot: int | None  # fleet.slot_of: None for a pod that is not one of the job's workers
    incarnation: int
    node: str | None  # spec.nodeName
    terminal: bool  # phase Succeeded or Failed
    deleting: bool  # a deletionTimestamp
    unschedulable_since: float | None
    marked: bool  # observe.marked_not_ready: not Ready, marked from outside
    # what the pod's host string and address are made of (hostlist.host_of, .addresses)
    addressing: tuple[str | None, ...]
    running: bool  # phase Running
    # deleting, or a DisruptionTarget condition: the pod itself may be announced to go
    # (disruption.pod_notice is None for every other pod)
    noticed: bool


@dataclass(frozen=True)
class NodeFacts:
    problem: str | None  # observe.node_problem
    cordoned: bool  # spec.unschedulable
    allocatable: tuple[tuple[str, object], ...]  # sorted (resource, amount)
    tainted: bool  # any taint
    holds: frozenset[str]  # the types of its conditions that hold (status True)

    def may_go(self, bad_conditions: frozenset[str]) -> bool:
        """Whether disruption.node_notice can be anything but None for this node: it is up and
        cordoned, tainted, or one of `bad_conditions` holds."""
        return self.problem is None and (self.cordoned or self.tainted
                                         or not self.holds.isdisjoint(bad_conditions))


def pod_facts(pod: Obj, job: str) -> PodFacts:
    meta, spec = pod["metadata"], pod.get("spec", {})
    at = slot_of(pod, job)
    phase, deleting = pod.get("status", {}).get("phase"), bool(meta.get("deletionTimestamp"))
    return PodFacts(meta["name"], meta.get("uid", ""), None if at is None else at[0],
                    0 if at is None else at[1], spec.get("nodeName") or None,
                    phase in TERMINAL_PHASES, deleting, unschedulable_since(pod),
                    marked_not_ready(pod), (
                        pod.get("status", {}).get("podIP"), spec.get("hostname"),
                        spec.get("subdomain"), meta.get("namespace")),
                    phase == "Running", deleting or _disrupted(pod))


def _disrupted(pod: Obj) -> bool:
    target = condition(pod, "DisruptionTarget")
    return target is not None and target.get("status") == "True"


def node_facts(node: Obj) -> NodeFacts:
    spec, status = node.get("spec", {}), node.get("status", {})
    return NodeFacts(node_problem(node), bool(spec.get("unschedulable")),
                     tuple(sorted((status.get("allocatable") or {}).items())),
                     bool(spec.get("taints")), frozenset(
                         c.get("type") for c in status.get("conditions") or ()
                         if c.get("status") == "True"))


@dataclass
class PodIndex:
    """The facts of the view's pods and nodes and their aggregates. Mutable: written only by
    `put`, `drop`, `put_node` and `drop_node` (the watches adapter, on the loop's thread), read
    by a pass on the same thread (`others` keeps its last answer in `_others`)."""

    job: str
    pods: dict[str, PodFacts] = field(default_factory=dict)
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    by_slot: dict[int, set[str]] = field(default_factory=dict)  # the job's pods of each slot
    unschedulable: dict[str, float] = field(default_factory=dict)  # pod -> since
    placed: dict[str, int] = field(default_factory=dict)  # node -> pods there not terminal
    on_node: dict[str, set[str]] = field(default_factory=dict)  # node -> every pod there
    marked: set[str] = field(default_factory=set)  # pods marked not Ready from outside
    not_running: set[str] = field(default_factory=set)  # pods whose phase is not Running
    noticed: set[str] = field(default_factory=set)  # pods deleting or with a DisruptionTarget
    live: int = 0  # pods not terminal
    # Counts the changes of the pods' addressing (a pod added or gone with an IP, an IP
    # changed): equal counts mean the workers' addresses are the same (channel.bind_hosts).
    readdressed: int = field(default=0, compare=False)
    uids: set[str] = field(default_factory=set)
    version: int = field(default=0, compare=False)  # counts the pods' changes
    _others: tuple[Mapping[str, int], int, frozenset[str]] | None = field(
        default=None, compare=False, repr=False)
    # the pods put or dropped since `_others` was worked out (kept only while there is one)
    _touched: set[str] = field(default_factory=set, compare=False, repr=False)

    def put(self, pod: Obj) -> None:
        """The view holds `pod` now (added or changed)."""
        f = pod_facts(pod, self.job)
        if _addressed(self._drop(f.name)) != _addressed(f):
            self.readdressed += 1
        self.version += 1
        self.pods[f.name] = f
        self.uids.add(f.uid)
        if f.slot is not None:
            self.by_slot.setdefault(f.slot, set()).add(f.name)
        if f.unschedulable_since is not None:
            self.unschedulable[f.name] = f.unschedulable_since
        if f.node:
            self.on_node.setdefault(f.node, set()).add(f.name)
        if f.marked:
            self.marked.add(f.name)
        if not f.running:
            self.not_running.add(f.name)
        if f.noticed:
            self.noticed.add(f.name)
        if not f.terminal:
            self.live += 1
            if f.node:
                self.placed[f.node] = self.placed.get(f.node, 0) + 1

    def drop(self, name: str) -> None:
        """The view no longer holds the pod `name`."""
        f = self._drop(name)
        if f is not None:
            self.version += 1
        if _addressed(f) is not None:
            self.readdressed += 1

    def _drop(self, name: str) -> PodFacts | None:
        if self._others is not None:
            self._touched.add(name)
            if len(self._touched) > max(64, len(self.pods) // 8):
                self._others = None  # (many changed: the next answer is worked out anew)
                self._touched.clear()
        f = self.pods.pop(name, None)
        if f is None:
            return None
        self.uids.discard(f.uid)
        if f.slot is not None:
            names = self.by_slot[f.slot]
            names.discard(name)
            if not names:
                del self.by_slot[f.slot]
        self.unschedulable.pop(name, None)
        if f.node:
            there = self.on_node[f.node]
            there.discard(name)
            if not there:
                del self.on_node[f.node]
        self.marked.discard(name)
        self.not_running.discard(name)
        self.noticed.discard(name)
        if not f.terminal:
            self.live -= 1
            if f.node:
                left = self.placed[f.node] - 1
                if left:
                    self.placed[f.node] = left
                else:
                    del self.placed[f.node]
        return f

    def put_node(self, node: Obj) -> None:
        self.nodes[node["metadata"]["name"]] = node_facts(node)

    def drop_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    def others(self, current: Mapping[str, int]) -> frozenset[str]:
        """The pods that are not an active slot's current one (`current`: Fleet.current's):
        worked out once per change of the pods and of the fleet (a pass asks in two steps;
        `current` is held, so a new one is never taken for it)."""
        known = self._others
        if known is not None and known[0] is current and known[1] == self.version:
            return known[2]
        if known is not None and known[0] is current:  # only the pods touched since
            out = set(known[2])
            for name in self._touched:
                if name in self.pods and name not in current:
                    out.add(name)
                else:
                    out.discard(name)
            others = frozenset(out)
        else:
            others = frozenset(self.pods.keys() - current.keys())
        self._others = (current, self.version, others)
        self._touched.clear()
        return others

    def going(self, nodes: Mapping[str, Obj], s: disruption.Settings) -> frozenset[str]:
        """disruption.going_nodes of `nodes` (the view's, which this index holds), asked only of
        the nodes that may be going (NodeFacts.may_go)."""
        return disruption.going_nodes((nodes[name] for name, f in self.nodes.items()
                                       if f.may_go(s.bad_conditions)), s)

    def of_slot(self, slot: int) -> Iterator[PodFacts]:
        return (self.pods[n] for n in self.by_slot.get(slot, ()))


def _addressed(f: PodFacts | None) -> tuple[str | None, ...] | None:
    """What a pod gives the workers' addresses: nothing without an IP."""
    return f.addressing if f is not None and f.addressing[0] else None


def build(pods: Mapping[str, Obj], nodes: Mapping[str, Obj], job: str) -> PodIndex:
    """The index of a view, from scratch."""
    ix = PodIndex(job)
    for pod in pods.values():
        ix.put(pod)
    for node in nodes.values():
        ix.put_node(node)
    return ix
