"""A worker pod that never starts (issue 39 item 7): core.manage after the bound, from the
kubelet's container statuses (tests/unit/shapes/pod_waiting_reasons.json).

The node's fault, or one the pod's status does not say: a NotStarted failure, its pod deleted
and replaced off the node (preferred), no restart budget used, the kubelet's reason and message
in the Event; at most starts.LIMIT pods of a slot in a row. The template's fault (an image,
a missing Secret): said once, never replaced in a loop. Before the bound: nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from supervisor.decide import quarantine, starts
from supervisor.decide.core import manage
from supervisor.decide.memory import Memory
from supervisor.decide.plan import Note
from supervisor.decide.policy import Budgets, Policy
from supervisor.decide.script import CreateWorker
from supervisor.workers import LABEL_INCARNATION, LABEL_JOB, LABEL_ROLE, LABEL_SLOT, pod_name
from tests.unit import shapes
from tests.unit.test_core import JOB, NOW, PODS, STEADY, script, seen, worker
from tests.unit.test_core import settings as core_settings

BOUND = 600.0
# Restarts that count are used up and disruptions count too: a pod that never started is
# replaced all the same (the script never ran).
S = replace(core_settings(Policy(budgets=Budgets(restart_limit=0, disruptions_free=False))),
            start_timeout_s=BOUND)
W0 = pod_name(JOB, 0, 1)


def unstarted(variant: str, slot: int = 0, inc: int = 1) -> dict[str, Any]:
    """Worker `slot` bound to its node, not started, with the kubelet's `variant` statuses."""
    p = shapes.not_started(variant, pod_name(JOB, slot, inc), node=f"node-{slot}")
    p["metadata"]["labels"] = {LABEL_JOB: JOB, LABEL_ROLE: "worker", LABEL_SLOT: str(slot),
                               LABEL_INCARNATION: str(inc)}
    return p


def pods(variant: str) -> dict[str, Any]:
    return {**PODS, W0: unstarted(variant)}


def after(variant: str, waited: float, c: Memory = STEADY, st: Any = S) -> Any:
    """The pass `waited` seconds after the first pass saw worker 0 not started."""
    first = manage(c, seen(pods(variant), now=NOW - waited), st)
    return manage(first.core, seen(pods(variant)), st)


def event(p: Any, name: str) -> Note:
    return next(t for t in p.todo if isinstance(t, Note) and t.event == name)


@pytest.mark.parametrize(("variant", "node_fault"), [
    pytest.param("container_creating", False,
                 id="ContainerCreating for good (the kubelet's Events say why)"),
    pytest.param("config_error_no_relationship", True,
                 id="the node authorizer after a kube-apiserver restart: the node's fault"),
    pytest.param("err_image_pull_disk_full", True, id="the node's disk is full"),
    pytest.param("no_container_status", False, id="the kubelet never reported on it"),
])
def test_after_the_bound_it_is_replaced_off_its_node_with_no_budget_used(
        variant: str, node_fault: bool) -> None:
    assert script(after(variant, BOUND - 1)) == [], "within the bound: nothing"
    p = after(variant, BOUND)
    assert script(p) == [("delete", W0, None), ("say", "worker.failed"), ("save",),
                         ("create", pod_name(JOB, 0, 2))]
    note = event(p, "worker.failed")
    assert note.fields["cause"] == "NotStarted" and note.fields["counted"] is False
    assert note.k8s is not None and note.k8s.reason == "WorkerRestarting"
    found = starts.stuck(unstarted(variant))
    assert found is not None and found.said() in note.k8s.note, "the kubelet's own words"
    assert "(never started: not counted)" in note.k8s.note
    assert ("the node's fault" in note.k8s.note) is node_fault
    create = next(t for t in p.todo if isinstance(t, CreateWorker))
    assert create.create.avoid_node == "node-0", "kept off the node (preferred)"
    c = p.core
    assert c.fleet is not None and c.fleet.ledger.total == 0
    assert c.unstarted == {0: 1} and c.unstarted_since == {}
    assert "uid-" + W0 in c.failed
    # The same picture again asks for nothing new (level-triggered).
    assert script(manage(c, seen(pods(variant)), S)) == []


def test_the_nodes_fault_counts_towards_its_quarantine_an_unsaid_one_does_not() -> None:
    q = replace(S, quarantine=quarantine.Settings(failures=1))
    nodes = {f"node-{i}": shapes.node(f"node-{i}") for i in range(3)}
    for variant, quarantined in (("config_error_no_relationship", True),
                                 ("container_creating", False)):
        first = manage(STEADY, seen(pods(variant), nodes=nodes, now=NOW - BOUND), q)
        p = manage(first.core, seen(pods(variant), nodes=nodes), q)
        # At the threshold the node is quarantined, or spared when the nodes left were not
        # seen to hold the whole job (quarantine.py): either way its fault was counted.
        said = {t.event for t in p.todo if isinstance(t, Note)}
        counted = bool(said & {"node.quarantined", "node.quarantine_spared"})
        assert counted is quarantined, (variant, said)


@pytest.mark.parametrize("variant", [
    "config_error_secret_not_found", "config_error_missing_key", "err_image_pull_denied",
    "image_pull_backoff", "init_image_pull_backoff", "config_error_run_as_non_root",
])
def test_the_templates_fault_is_said_once_and_never_replaced(variant: str) -> None:
    p = after(variant, BOUND)
    assert script(p) == [("say", "worker.not_starting")]
    note = event(p, "worker.not_starting")
    found = starts.stuck(unstarted(variant))
    assert found is not None and note.k8s is not None
    assert (note.k8s.type, note.k8s.reason) == ("Warning", "WorkerNotStarting")
    assert found.said() in note.k8s.note and "not replaced" in note.k8s.note
    assert note.fields["fault"] == "template"
    later = manage(p.core, seen(pods(variant), now=NOW + 3600), S)
    assert script(later) == [], "said once: no hot loop, no Event storm"
    assert later.core.fleet == STEADY.fleet


def test_the_templates_fault_is_said_after_a_minute_not_after_the_bound() -> None:
    """Nothing to wait for (no action): said once the kubelet's back-off tried three times,
    before a job that never gets its workers ends at SUPERVISOR_START_TIMEOUT_SECONDS."""
    assert script(after("image_pull_backoff", starts.SAY_AFTER_S - 1)) == []
    assert script(after("image_pull_backoff", starts.SAY_AFTER_S)) == [
        ("say", "worker.not_starting")]
    assert script(after("container_creating", starts.SAY_AFTER_S)) == [], "acted on: the bound"


def test_a_template_fault_with_a_new_reason_is_said_again() -> None:
    p = after("err_image_pull_denied", BOUND)
    again = manage(p.core, seen(pods("image_pull_backoff"), now=NOW + 10), S)
    assert script(again) == [("say", "worker.not_starting")]


def test_a_slot_whose_pods_never_start_in_a_row_is_left_after_the_limit() -> None:
    """starts.LIMIT pods of a slot never started on other nodes: it is not the node."""
    c = replace(STEADY, unstarted={0: starts.LIMIT})
    p = after("container_creating", BOUND, c)
    assert script(p) == [("say", "worker.never_starts")]
    note = event(p, "worker.never_starts")
    assert note.k8s is not None and note.k8s.reason == "WorkerNeverStarts"
    assert script(manage(p.core, seen(pods("container_creating"), now=NOW + 60), S)) == []
    # One below the limit: replaced, and the row grows.
    p = after("container_creating", BOUND, replace(STEADY, unstarted={0: starts.LIMIT - 1}))
    assert ("create", pod_name(JOB, 0, 2)) in script(p)
    assert p.core.unstarted == {0: starts.LIMIT}


def test_the_row_ends_when_a_pod_of_the_slot_runs() -> None:
    c = replace(STEADY, unstarted={0: 2, 1: 1})
    p = manage(c, seen(pods("container_creating")), S)
    assert p.core.unstarted == {0: 2}, "slot 1's pod runs"


def test_a_pod_that_starts_within_the_bound_is_forgotten() -> None:
    first = manage(STEADY, seen(pods("container_creating"), now=NOW - 30), S)
    assert first.core.unstarted_since == {"uid-" + W0: NOW - 30}
    p = manage(first.core, seen(), S)
    assert p.core.unstarted_since == {} and script(p) == []


def test_off_or_unowned() -> None:
    off = replace(S, start_timeout_s=None)
    assert script(after("container_creating", 10 * BOUND, st=off)) == []
    # Workers the supervisor does not create: said, never replaced.
    p = after("container_creating", BOUND, replace(STEADY, fleet=None, saved=None))
    assert script(p) == [("say", "worker.not_starting")]
    assert "does not create workers" in event(p, "worker.not_starting").k8s.note  # type: ignore[union-attr]


def test_an_older_incarnation_is_not_failed_again() -> None:
    """Its slot moved on already: it is superseded (deleted by the plan), not NotStarted."""
    old = unstarted("container_creating")
    c = replace(STEADY, fleet=replace(STEADY.fleet, slots={  # type: ignore[arg-type]
        **STEADY.fleet.slots, 0: replace(STEADY.fleet.slots[0], incarnation=2)}))  # type: ignore[union-attr]
    ps = {**PODS, W0: old, pod_name(JOB, 0, 2): worker(0, 2)}
    first = manage(c, seen(ps, now=NOW - BOUND), S)
    assert script(first)[:2] == [("say", "worker.superseded"), ("delete", W0, None)]
    p = manage(first.core, seen(ps), S)
    assert script(p) == [] and p.core.unstarted == {}
