"""The pod index (decide/podindex.py): its facts read off real shapes as the rules read them,
and the index the watches keep up to date change by change equal to one built from scratch
over random sequences of the changes a watch shows (a pod placed, unschedulable, failed,
deleted gracefully, renamed to another job's, marked not Ready, gone; a node cordoned,
NotReady, gone)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from supervisor.decide import disruption, podindex
from supervisor.decide.podindex import PodIndex
from supervisor.workers import LABEL_INCARNATION, LABEL_JOB, LABEL_ROLE, LABEL_SLOT, pod_name
from tests.unit import shapes

JOB = "job1"
SCHEDULED_AT = "2026-11-30T09:00:00Z"


def worker(slot: int, inc: int = 1, node: str | None = "node-a", job: str = JOB) -> dict[str, Any]:
    p = shapes.pod(pod_name(job, slot, inc), node=node or "")
    p["metadata"]["labels"] = {LABEL_JOB: job, LABEL_ROLE: "worker", LABEL_SLOT: str(slot),
                               LABEL_INCARNATION: str(inc)}
    if node is None:  # the scheduler's word on a pod it found no node for
        p["spec"].pop("nodeName")
        p["status"] = {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": SCHEDULED_AT,
            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity"}]}
    return p


def test_facts_are_what_the_rules_read_off_the_object() -> None:
    running = podindex.pod_facts(worker(3, 2, node="node-b"), JOB)
    assert (running.slot, running.incarnation, running.node, running.terminal,
            running.deleting, running.unschedulable_since) == (3, 2, "node-b", False, False, None)
    pending = podindex.pod_facts(worker(1, node=None), JOB)
    assert pending.node is None and pending.unschedulable_since == 1796029200.0
    failed = worker(0)
    failed["status"]["phase"] = "Failed"
    assert podindex.pod_facts(failed, JOB).terminal
    deleting = shapes.load("pod_deleting_graceful")
    assert podindex.pod_facts(deleting, JOB).deleting
    assert podindex.pod_facts(worker(0, job="job2"), JOB).slot is None  # another job's
    marked = shapes.with_condition(worker(0), "Ready", "False")
    assert podindex.pod_facts(marked, JOB).marked and not running.marked
    unreachable = podindex.node_facts(shapes.node("n", "node_unreachable"))
    assert unreachable.problem is not None and not unreachable.cordoned
    ready = shapes.node("n")
    ready["spec"]["unschedulable"] = True
    assert podindex.node_facts(ready).problem is None and podindex.node_facts(ready).cordoned


def variant(rng: random.Random, slot: int, inc: int) -> dict[str, Any]:
    """One of the shapes a watch shows of the pod of (slot, inc)."""
    kind = rng.choice(["running", "pending", "failed", "deleting", "other-job", "moved",
                       "marked"])
    if kind == "pending":
        return worker(slot, inc, node=None)
    p = worker(slot, inc, node=rng.choice(["node-a", "node-b", "node-c"]),
               job="job2" if kind == "other-job" else JOB)
    if kind == "other-job":
        p["metadata"]["name"] = pod_name(JOB, slot, inc)  # the view's key, another job's labels
    if kind == "failed":
        p["status"]["phase"] = "Failed"
    if kind == "deleting":
        p["metadata"]["deletionTimestamp"] = SCHEDULED_AT
    if kind == "marked":  # the node controller's MarkPodsNotReady
        p = shapes.with_condition(p, "Ready", "False")
    if kind == "moved":
        # made again under its name (a UID is never another pod's)
        p["metadata"]["uid"] = f"uid-again-{p['metadata']['name']}-{rng.randrange(1000)}"
    return p


GOING = disruption.Settings()


def node_variant(rng: random.Random, name: str) -> dict[str, Any]:
    """A node as a watch shows it: Ready or unreachable, cordoned, tainted to drain or not,
    a node-problem-detector condition that holds (one the settings count, or not)."""
    n = shapes.node(name, rng.choice(["node_ready", "node_ready", "node_unreachable"]))
    n["spec"]["unschedulable"] = rng.random() < 0.2
    if rng.random() < 0.3:
        n["spec"]["taints"] = [{"key": rng.choice(["karpenter.sh/disrupted", "team/gpu"]),
                                "effect": "NoSchedule"}]
    if rng.random() < 0.3:
        n["status"]["conditions"].append({
            "type": rng.choice(["KernelDeadlock", "GPUHot"]), "status": "True",
            "reason": "Found"})
    return n


@pytest.mark.parametrize("seed", range(8))
def test_the_index_kept_change_by_change_equals_one_built_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    pods: dict[str, Any] = {}
    nodes: dict[str, Any] = {}
    kept = PodIndex(JOB)
    reached: set[str] = set()
    current = {pod_name(JOB, i, 2): i for i in range(12)}  # every slot at incarnation 2
    for _ in range(400):
        op = rng.random()
        if op < 0.6:
            p = variant(rng, rng.randrange(12), rng.randrange(1, 4))
            pods[p["metadata"]["name"]] = copy.deepcopy(p)
            kept.put(p)
        elif op < 0.85 and pods:
            name = rng.choice(sorted(pods))
            del pods[name]
            kept.drop(name)
        elif op < 0.95:
            n = node_variant(rng, rng.choice(["node-a", "node-b", "node-c"]))
            nodes[n["metadata"]["name"]] = n
            kept.put_node(n)
        else:
            name = rng.choice(["node-a", "node-b", "node-c", "node-gone"])
            nodes.pop(name, None)
            kept.drop_node(name)
        kept.drop("never-there")  # a DELETED of a pod the view never held
        assert kept == podindex.build(pods, nodes, JOB)
        assert kept.going(nodes, GOING) == disruption.going_nodes(nodes.values(), GOING)
        if rng.random() < 0.05:  # a new fleet: its current pods are another object
            current = {pod_name(JOB, i, rng.randrange(1, 4)): i for i in range(12)}
        if rng.random() < 0.6:  # (else several changes come before the next ask)
            assert kept.others(current) == pods.keys() - current.keys()
        reached |= {k for k in ("live", "placed", "unschedulable", "marked", "on_node",
                                "noticed", "not_running") if getattr(kept, k)}
        reached |= {k for k, v in (("going", kept.going(nodes, GOING)),
                                   ("others", kept.others(current))) if v}
    assert reached == {"live", "placed", "unschedulable", "marked", "on_node", "noticed",
                       "not_running", "going", "others"}  # the sequence reached them all


def test_a_failed_pod_leaves_its_node_and_the_live_count() -> None:
    ix = PodIndex(JOB)
    ix.put(worker(0, node="node-a"))
    ix.put(worker(1, node="node-a"))
    assert ix.placed == {"node-a": 2} and ix.live == 2
    failed = worker(0, node="node-a")
    failed["status"]["phase"] = "Failed"
    ix.put(failed)
    assert ix.placed == {"node-a": 1} and ix.live == 1 and ix.by_slot == {0: {"job1-w0-1"},
                                                                          1: {"job1-w1-1"}}
    ix.drop("job1-w1-1")
    assert ix.placed == {} and ix.live == 0 and set(ix.by_slot) == {0}


def test_the_addresses_count_as_changed_only_when_a_pods_address_does() -> None:
    ix = PodIndex(JOB)
    pending = worker(0, node=None)
    pending["status"].pop("podIP", None)
    ix.put(pending)
    assert ix.readdressed == 0  # no IP: no address
    ix.put(worker(0))
    assert ix.readdressed == 1
    ready_again = shapes.with_condition(worker(0), "Ready", "False")
    ix.put(ready_again)
    assert ix.readdressed == 1  # its status changed, not its address
    moved = worker(0)
    moved["status"]["podIP"] = "10.1.0.99"
    ix.put(moved)
    assert ix.readdressed == 2
    ix.drop("job1-w0-1")
    ix.drop("job1-w0-1")
    assert ix.readdressed == 3


def test_the_loop_keeps_the_index_of_what_its_watches_show() -> None:
    """The wiring: the real loop (loop.Supervisor, its watches adapter) handed the watch events
    a reflector hands it (slimmed objects, a repeat of one resourceVersion, a change, a node
    cordoned and gone, a pod deleted on the watch and one the relist found gone by name only):
    after each batch its index equals one built from its view."""
    from supervisor.model import WatchEvent
    from supervisor.observe import EventType, Kind, slim
    from tests.unit.test_never_starts_loop import Clock, labelled, loop

    clock, ops, events = Clock(), [], []  # type: ignore[var-annotated]
    sup = loop(clock, ops, events)
    w0 = labelled(shapes.pod("job1-w0-1", ip="10.1.0.10", node="node-a"), 0)
    w1 = labelled(shapes.pod("job1-w1-1", ip="10.1.0.11", node="node-b"), 1)
    failed = copy.deepcopy(w1)
    failed["status"]["phase"], failed["metadata"]["resourceVersion"] = "Failed", "999"
    cordoned = shapes.node("node-b")
    cordoned["spec"]["unschedulable"], cordoned["metadata"]["resourceVersion"] = True, "998"

    def pod(t: EventType, p: dict[str, Any], relist: bool = False) -> WatchEvent:
        return WatchEvent(Kind.POD, t, slim(Kind.POD, p), clock.now, relist)

    batches = [
        [WatchEvent(Kind.NODE, EventType.ADDED, slim(Kind.NODE, shapes.node(n)), clock.now)
         for n in ("node-a", "node-b")] + [pod(EventType.ADDED, w0), pod(EventType.ADDED, w1)],
        [pod(EventType.MODIFIED, w0)],  # the same resourceVersion: nothing changed
        [pod(EventType.MODIFIED, failed),
         WatchEvent(Kind.NODE, EventType.MODIFIED, slim(Kind.NODE, cordoned), clock.now)],
        [pod(EventType.DELETED, failed)],
        [WatchEvent(Kind.POD, EventType.DELETED, {"metadata": {"name": "job1-w0-1"}},
                    clock.now, relist=True),
         WatchEvent(Kind.NODE, EventType.DELETED, {"metadata": {"name": "node-a"}}, clock.now)],
    ]
    sizes = []
    for batch in batches:
        sup._apply(batch, clock.now)
        assert sup.watches.index == podindex.build(sup.view.pods, sup.view.nodes, "job1")
        sizes.append((len(sup.watches.index.pods), len(sup.watches.index.nodes)))
    assert sizes == [(2, 2), (2, 2), (2, 2), (1, 2), (0, 1)]
    assert sup.watches.index.nodes["node-b"].cordoned
