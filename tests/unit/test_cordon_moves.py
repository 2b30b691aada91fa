"""A cordon alone (issue 39 item 7): kubectl cordon evicts nothing, so a worker on a cordoned
node moves only once its replacement, placed ahead as its slot's next incarnation, runs.
With nowhere to go the replacement stays Pending: the job keeps its size and the worker trains
on until a node is there (make before break). Drain taints, bad conditions and evictions still
make a worker leave at once (test_core)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from supervisor.decide.classify import Cause, Failure
from supervisor.decide.core import manage
from supervisor.decide.failures import Failed
from supervisor.decide.plan import Note
from supervisor.decide.script import CreateWorker
from supervisor.workers import pod_name
from tests.unit import shapes
from tests.unit.test_core import (
    JOB,
    KEPT,
    LEAVING,
    NODES,
    NOW,
    PODS,
    cordon,
    exited,
    script,
    seen,
    worker,
)

W0, W0B = pod_name(JOB, 0, 1), pod_name(JOB, 0, 2)
CORDONED = {**NODES, "node-0": cordon("node-0"), "node-2": shapes.node("node-2")}


def ahead(**status: Any) -> dict[str, Any]:
    """Slot 0's next incarnation on node-2, Running and Ready (another address)."""
    p = worker(0, 2, node="node-2")
    p["status"]["podIP"] = "10.1.0.99"
    p["status"].update(status)
    return p


def unschedulable() -> dict[str, Any]:
    """Slot 0's next incarnation as the scheduler leaves it when no node fits."""
    p = worker(0, 2)
    p["spec"].pop("nodeName")
    p["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient "
                   "nvidia.com/gpu."}], "qosClass": "BestEffort"}
    return p


def first() -> Any:
    return manage(KEPT, seen(PODS, nodes=CORDONED), LEAVING)


def created() -> Any:
    """The memory once the watch showed the replacement (reconcile drops its expectation)."""
    return replace(first().core, expected={})


def test_a_cordon_places_the_replacement_first_and_the_worker_trains_on() -> None:
    p = first()
    assert script(p) == [("say", "worker.moving"), ("create", W0B)]
    note = p.todo[0]
    assert isinstance(note, Note) and note.k8s is not None and note.k8s.reason == "WorkerMoving"
    create = p.todo[1]
    assert isinstance(create, CreateWorker)
    assert (create.create.slot, create.create.incarnation) == (0, 2)
    assert create.lost_nodes == ("node-0",) and create.create.avoid_node == "node-0"
    assert create.ahead_of == W0, "a restarted supervisor must not move the slot up to it"
    c = p.core
    assert c.fleet == KEPT.fleet, "the slot keeps its pod: nothing moved yet"
    assert c.leaving == {} and "uid-" + W0 not in c.failed, "still listed, still training"
    assert c.moving == {W0: W0B} and W0B in c.expected
    assert script(manage(c, seen(PODS, nodes=CORDONED), LEAVING)) == [], "asked for once"


def test_with_nowhere_to_go_the_job_keeps_its_size_and_the_worker_trains_on() -> None:
    c = created()
    pending = {**PODS, W0B: unschedulable()}
    for later in (1.0, 120.0, 3600.0):
        p = manage(c, seen(pending, nodes=CORDONED, now=NOW + later), LEAVING)
        assert script(p) == [], later
        c = p.core
    assert c.fleet is not None and len(c.fleet.active()) == 2
    assert c.fleet.slots[0].incarnation == 1 and "uid-" + W0 not in c.failed
    # A node is there: the replacement runs, the worker leaves (no create: it is there).
    p = manage(c, seen({**PODS, W0B: ahead()}, nodes=CORDONED), LEAVING)
    assert script(p) == [("say", "worker.leaving"), ("save",), ("budget", 2)]
    assert p.core.fleet is not None and p.core.fleet.slots[0].incarnation == 2
    assert set(p.core.leaving) == {W0} and p.core.moving == {}
    assert "runs already" in p.todo[0].k8s.note  # type: ignore[union-attr]


def test_the_cordon_lifted_before_the_move_deletes_the_replacement_placed_ahead() -> None:
    c = created()
    p = manage(c, seen({**PODS, W0B: unschedulable()}), LEAVING)
    assert script(p) == [("delete", W0B, None), ("say", "worker.move_cancelled")]
    assert "uid-" + W0B in p.core.failed and p.core.moving == {}
    assert p.core.fleet == KEPT.fleet


def test_a_replacement_that_fails_before_it_runs_is_deleted_and_the_worker_stays() -> None:
    c = created()
    dead = exited(ahead(phase="Failed"), 1)
    p = manage(c, seen({**PODS, W0B: dead}, nodes=CORDONED), LEAVING)
    assert script(p) == [("delete", W0B, None), ("say", "worker.stays")]
    assert p.core.staying == {W0}
    # Gone: not placed again while the cordon lasts (no loop); said once.
    again = manage(p.core, seen(PODS, nodes=CORDONED, now=NOW + 600), LEAVING)
    assert script(again) == [] and again.core.staying == {W0}
    # The cordon is over: forgotten; a new cordon moves it again.
    over = manage(again.core, seen(PODS), LEAVING)
    assert over.core.staying == frozenset()
    assert script(manage(over.core, seen(PODS, nodes=CORDONED), LEAVING)) == [
        ("say", "worker.moving"), ("create", W0B)]


def test_a_failure_of_the_replacement_placed_ahead_costs_the_slot_nothing() -> None:
    """Its slot is still at the worker's incarnation: a later one's failure is stale."""
    c = created()
    dead = exited(ahead(), 137)
    f = Failure(Cause.EXIT_CODE, W0B, "uid-" + W0B, "node-2", 137, "worker", "exited")
    p = manage(replace(c, found=(Failed(f, dead, NOW),), failed=c.failed | {"uid-" + W0B}),
               seen({**PODS, W0B: dead}, nodes=CORDONED), LEAVING)
    assert p.core.fleet is not None and p.core.fleet.slots[0].incarnation == 1
    assert p.core.fleet.ledger == KEPT.fleet.ledger  # type: ignore[union-attr]
    assert ("say", "worker.failure_handled_before") in script(p)


def test_the_worker_failing_while_it_moves_hands_its_slot_to_the_replacement() -> None:
    c = created()
    w0 = exited(copy.deepcopy(PODS[W0]), 137)
    f = Failure(Cause.EXIT_CODE, W0, "uid-" + W0, "node-0", 137, "worker", "exited")
    p = manage(replace(c, found=(Failed(f, w0, NOW),), failed=c.failed | {"uid-" + W0}),
               seen({**PODS, W0: w0, W0B: unschedulable()}, nodes=CORDONED), LEAVING)
    assert p.core.fleet is not None and p.core.fleet.slots[0].incarnation == 2
    assert ("create", W0B) not in script(p), "it is there already"


def test_a_replacement_placed_ahead_that_never_starts_is_given_up_at_the_bound() -> None:
    """Said with the kubelet's reason, deleted, and the worker stays (no loop)."""
    st = replace(LEAVING, start_timeout_s=600.0)
    c = replace(manage(KEPT, seen(PODS, nodes=CORDONED), st).core, expected={})
    stuck = shapes.not_started("container_creating", W0B, node="node-2")
    stuck["metadata"].update(labels=worker(0, 2)["metadata"]["labels"],
                             annotations={"elastic-supervisor/ahead-of": W0})
    pods = {**PODS, W0B: stuck}
    c = manage(c, seen(pods, nodes=CORDONED, now=NOW), st).core
    assert script(manage(c, seen(pods, nodes=CORDONED, now=NOW + 599), st)) == []
    p = manage(c, seen(pods, nodes=CORDONED, now=NOW + 600), st)
    assert script(p) == [("say", "worker.not_starting"), ("delete", W0B, None),
                         ("say", "worker.stays")]
    note = p.todo[0]
    assert isinstance(note, Note) and note.k8s is not None
    assert "ContainerCreating" in note.k8s.note and f"ahead of the move of {W0}" in note.k8s.note
    assert p.core.staying == {W0} and p.core.fleet == KEPT.fleet
    assert script(manage(p.core, seen(PODS, nodes=CORDONED, now=NOW + 700), st)) == []
