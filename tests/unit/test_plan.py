"""plan.plan: the fleet's reconcile step, from a whole picture to the pods wanted and what to say.

Pods are the captured Running+Ready worker (tests/unit/shapes) with the labels the supervisor
puts on its workers; each row is one picture and the parts of the Plan it must produce.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from supervisor.decide import fleet
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.failures import Failed, on_failures
from supervisor.decide.fleet import HUNG_HOLD_S, Create, Fleet, Slot
from supervisor.decide.hostlist import HostMode, Rendered
from supervisor.decide.plan import (
    CREATE_BURST,
    EXPECTATION_TIMEOUT_S,
    HUNG_GRACE_S,
    REUSED_LIMIT,
    Picture,
    Settings,
    plan,
)
from supervisor.decide.policy import Action, Budgets, Policy, Rule
from supervisor.decide.script import DeletePod
from supervisor.observe import Kind, Unusable, slim
from supervisor.workers import (
    LABEL_INCARNATION,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_SLOT,
    pod_name,
    worker_pod,
)
from tests.unit import shapes

JOB = "job1"
S = Settings(JOB, HostMode.POD_IP, min_np=1, max_np=4, slots_per_worker=1,
             scale_out_timeout_s=300.0, scale_in_timeout_s=60.0)
NOW, WALL = 500.0, 1_700_000_000.0


def worker(slot: int, inc: int = 1, ip: str | None = None, **status: Any) -> dict[str, Any]:
    name = pod_name(JOB, slot, inc)
    p = shapes.pod(name, ip=ip or f"10.1.0.{10 + slot}", **status)
    p["metadata"]["labels"] = {LABEL_JOB: JOB, LABEL_ROLE: "worker", LABEL_SLOT: str(slot),
                               LABEL_INCARNATION: str(inc)}
    return p


def pods(*ps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in ps}


def picture(f: Fleet, ps: dict[str, Any], **kw: Any) -> Picture:
    base: dict[str, Any] = {
        "published": "".join(f"{p['status']['podIP']}:1\n" for p in ps.values()
                             if "podIP" in p["status"]),
        "view_render": None, "reuse_checked": None, "reused": {}, "scale_request": None,
        "expected": {}, "waiting": frozenset(), "ssh_clients": {}, "now": NOW, "wall": WALL}
    return Picture(fleet=f, pods=ps, **{**base, **kw})


TWO = fleet.initial(2)
RUNNING_TWO = pods(worker(0), worker(1))


def test_a_picture_that_is_already_right_asks_for_nothing() -> None:
    p = plan(picture(TWO, RUNNING_TWO), S)
    assert (p.fleet, p.creates, p.deletes, p.notes, p.fail) == (TWO, (), (), (), None)


def test_the_same_picture_twice_asks_for_each_pod_once() -> None:
    first = plan(picture(TWO, {}), S)
    assert [c.name for c in first.creates] == [pod_name(JOB, 0, 1), pod_name(JOB, 1, 1)]
    again = plan(picture(first.fleet, {}, expected=first.expected), S)
    assert again.creates == (), "the creates asked for are expectations until seen"


@pytest.mark.parametrize(("expected", "waiting", "creates", "unseen"), [
    pytest.param({pod_name(JOB, 1, 1): NOW - 10}, frozenset(), [], [],
                 id="asked for 10 s ago, not seen yet: wait"),
    pytest.param({pod_name(JOB, 1, 1): NOW - EXPECTATION_TIMEOUT_S - 1}, frozenset(),
                 [pod_name(JOB, 1, 1)], [pod_name(JOB, 1, 1)],
                 id="never seen after the expectation timeout: asked for again, said"),
    pytest.param({}, frozenset({pod_name(JOB, 1, 1)}), [], [],
                 id="refused by admission, backoff not over: not asked for"),
])
def test_expectations_and_refusals(expected: dict[str, float], waiting: frozenset[str],
                                   creates: list[str], unseen: list[str]) -> None:
    p = plan(picture(TWO, pods(worker(0)), expected=expected, waiting=waiting), S)
    assert [c.name for c in p.creates] == creates
    assert [n.fields["pod"] for n in p.notes if n.event == "worker.create_unseen"] == unseen


def test_a_pod_the_watch_keeps_not_showing_is_asked_for_again_ever_less_often() -> None:
    """Behind an overloaded API server the watch lags minutes: each create given up unseen
    doubles the wait for the next (the 10,000-worker run asked for pods it had created 48,838
    times in 10 minutes, each answered AlreadyExists); once the watch shows it, forgotten."""
    w1 = pod_name(JOB, 1, 1)
    unseen: dict[str, int] = {}
    waits = []
    for _ in range(6):
        p = plan(picture(TWO, pods(worker(0)), expected={w1: NOW - 10_000}, unseen=unseen), S)
        assert [c.name for c in p.creates] == [w1]
        (note,) = [n for n in p.notes if n.event == "worker.create_unseen"]
        waits.append(note.fields["next_wait_s"])
        unseen = dict(p.unseen)
        within = plan(picture(TWO, pods(worker(0)), expected={w1: NOW - waits[-1] + 1},
                              unseen=unseen), S)
        assert within.creates == () and within.unseen == unseen, "still expected"
    assert waits == [120.0, 240.0, 480.0, 960.0, 960.0, 960.0]
    seen = plan(picture(TWO, RUNNING_TWO, unseen=unseen), S)
    assert seen.unseen == {}


def test_at_most_a_burst_of_creates_is_asked_for_and_not_seen_at_a_time() -> None:
    """A start at 10,000 workers: the first pass asks for CREATE_BURST pods, the next ones only
    as many as the watch has shown meanwhile; a slot's replacement comes before first pods."""
    big = fleet.initial(CREATE_BURST * 2 + 7)
    first = plan(picture(big, {}), S)
    assert [c.slot for c in first.creates] == list(range(CREATE_BURST))
    assert plan(picture(first.fleet, {}, expected=first.expected), S).creates == ()
    seen = pods(*(worker(i) for i in range(3)))
    rest = {n: t for n, t in first.expected.items() if n not in seen}
    again = plan(picture(first.fleet, seen, expected=rest), S)
    assert [c.slot for c in again.creates] == [CREATE_BURST, CREATE_BURST + 1, CREATE_BURST + 2]
    later = replace(big, slots={**big.slots, 900: replace(big.slots[900], incarnation=2)})
    third = plan(picture(later, seen, expected=rest), S)
    assert [c.name for c in third.creates] == [
        pod_name(JOB, 900, 2), pod_name(JOB, CREATE_BURST, 1), pod_name(JOB, CREATE_BURST + 1, 1)]


@pytest.mark.parametrize(("want", "event", "reason", "active"), [
    pytest.param(3, "scale.applied", "Scaled", [0, 1, 2], id="within the limits: applied"),
    pytest.param(5, "scale.refused", "ScaleRefused", [0, 1], id="above MAX_NP: refused"),
    pytest.param(0, "scale.refused", "ScaleRefused", [0, 1], id="below MIN_NP: refused"),
])
def test_a_scale_request_is_applied_or_refused_and_then_gone(
        want: int, event: str, reason: str, active: list[int]) -> None:
    p = plan(picture(TWO, RUNNING_TWO, scale_request=want), S)
    assert p.scale_request is None
    assert p.fleet.active() == active
    assert [(n.event, n.k8s.reason if n.k8s else None) for n in p.notes][:1] == [(event, reason)]


def test_a_scale_request_for_the_current_size_changes_nothing() -> None:
    p = plan(picture(TWO, RUNNING_TWO, scale_request=2), S)
    assert (p.fleet, p.notes, p.scale_request) == (TWO, (), None)


ADDED = Fleet(slots={0: Slot(), 1: Slot(), 2: Slot(due=WALL - 10, added_at=WALL - 10)})
ROLLED_BACK = replace(ADDED.slots[2], added_at=None,
                      dropped=f"scale-out rolled back: {pod_name(JOB, 2, 1)} not Running "
                      "after 300s")


def made(pod: dict[str, Any], at: float) -> dict[str, Any]:
    """`pod` created at wall time `at` (the API server's creationTimestamp, in seconds; NaN:
    not given)."""
    meta = {k: v for k, v in pod["metadata"].items() if k != "creationTimestamp"}
    if not math.isnan(at):
        meta["creationTimestamp"] = datetime.fromtimestamp(at, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    return {**pod, "metadata": meta}


@pytest.mark.parametrize(("third", "wall", "kw", "slot", "deleted", "event"), [
    pytest.param(made(worker(2), WALL - 9), WALL, {}, Slot(due=WALL - 10), [], None,
                 id="its pod runs: the scale-out is confirmed"),
    pytest.param(made(worker(2, phase="Pending"), WALL - 9), WALL, {}, ADDED.slots[2], [],
                 None, id="pending within the scale-out timeout: keep waiting"),
    pytest.param(made(worker(2, phase="Pending"), WALL - 9), WALL + 300, {}, ROLLED_BACK,
                 [pod_name(JOB, 2, 1)], "scale.rolled_back",
                 id="not Running after the timeout: rolled back, its pod deleted"),
    pytest.param(made(worker(2, phase="Pending"), math.nan), WALL + 300, {}, ROLLED_BACK,
                 [pod_name(JOB, 2, 1)], "scale.rolled_back",
                 id="the pod's creation time unknown: timed from the adding"),
    pytest.param(made(worker(2, phase="Pending"), WALL + 200), WALL + 300, {}, ADDED.slots[2],
                 [], None, id="its pod made 100 s ago, 310 s after the adding: keep waiting"),
    pytest.param(None, WALL + 300, {"expected": {pod_name(JOB, 2, 1): NOW - 30}},
                 ADDED.slots[2], [], None,
                 id="asked for 30 s ago, 280 s after the adding, not seen yet: keep waiting"),
    pytest.param(None, WALL + 300, {"waiting": frozenset({pod_name(JOB, 2, 1)})},
                 ROLLED_BACK, [], "scale.rolled_back",
                 id="refused by admission since: timed from the adding, rolled back"),
])
def test_scale_out(*, third: dict[str, Any] | None, wall: float, kw: dict[str, Any], slot: Slot,
                   deleted: list[str], event: str | None) -> None:
    p = plan(picture(ADDED, pods(worker(0), worker(1), *([third] if third else [])),
                     wall=wall, **kw), S)
    assert p.fleet.slots[2] == slot
    assert [d.name for d in p.deletes] == deleted
    assert [n.event for n in p.notes] == ([event] if event else [])


def test_a_scale_out_to_thousands_rolls_back_no_slot_for_its_turn_in_the_burst() -> None:
    """3 -> 1,503 workers: the creates go out CREATE_BURST at a time over minutes, and each
    slot's timeout starts when its create is asked for, not when the 1,500 were added (with
    the adding's clock the last thousand were rolled back unasked)."""
    s = replace(S, max_np=2_000)
    f = fleet.scale_to(fleet.initial(3), 1_503, WALL)
    running = pods(worker(0), worker(1), worker(2))
    first = plan(picture(f, running, wall=WALL), s)
    assert len(first.creates) == CREATE_BURST
    later = plan(picture(first.fleet, running, expected=first.expected, wall=WALL + 400,
                         now=NOW + 400), s)
    rolled = [n.fields["slot"] for n in later.notes if n.event == "scale.rolled_back"]
    assert rolled == [c.slot for c in first.creates], "only the asked-for, never seen"
    assert len(later.fleet.active()) == 1_503 - CREATE_BURST
    assert not any(n.event == "scale.rolled_back" and n.fields["slot"] >= 3 + CREATE_BURST
                   for n in later.notes)


RETIRING = Fleet(slots={0: Slot(), 1: Slot(retiring_at=WALL - 5)})
SCALED_IN = pods(worker(0), worker(1))


@pytest.mark.parametrize(("published", "clients", "wall", "removed", "note"), [
    pytest.param("10.1.0.10:1\n10.1.0.11:1\n", {}, WALL, False, None,
                 id="still in the discovery file: not yet"),
    pytest.param("10.1.0.10:1\n", {"10.1.0.11": 1}, WALL, False, None,
                 id="out of the file, horovodrun still has an ssh client to it: not yet"),
    pytest.param("10.1.0.10:1\n", {}, WALL, True, " (horovodrun let it go)",
                 id="out of the file and let go: deleted"),
    pytest.param("10.1.0.10:1\n", {"10.1.0.11": 1}, WALL + 60, True,
                 " (timeout; 1 ssh clients left)", id="still held after the timeout: deleted"),
])
def test_scale_in(published: str, clients: dict[str, int], wall: float, removed: bool,
                  note: str | None) -> None:
    p = plan(picture(RETIRING, SCALED_IN, published=published,
                     ssh_clients={"10.1.0.11": 0, **clients}, wall=wall), S)
    name = pod_name(JOB, 1, 1)
    assert (1 not in p.fleet.slots) is removed
    assert p.deletes == ((DeletePod(name, f"uid-{name}", None),) if removed else ())
    assert p.ours == (frozenset({f"uid-{name}"}) if removed else frozenset())
    notes = [n.k8s.note for n in p.notes if n.k8s is not None]
    assert notes == ([f"scaled in: deleted {name} after {wall - WALL + 5:.1f}s{note}"]
                     if removed else [])
    assert p.creates == (), "a retiring slot never gets a new pod"


def reused_render(name: str) -> Rendered:
    return Rendered(lines=("10.1.0.10:1",), hosts={"10.1.0.10": pod_name(JOB, 0, 1)},
                    left_out={name: Unusable.HOST_REUSED})


@pytest.mark.parametrize(("before", "replaced", "said"), [
    pytest.param(0, True, "worker.host_reused", id="first time: replaced, no budget"),
    pytest.param(REUSED_LIMIT, False, "worker.host_reused_again",
                 id="the slot's pods got reused addresses REUSED_LIMIT times: left out, said"),
    pytest.param(REUSED_LIMIT + 1, False, None, id="and said only once"),
])
def test_a_worker_with_a_reused_address(before: int, replaced: bool, said: str | None) -> None:
    name = pod_name(JOB, 1, 1)
    rendered = reused_render(name)
    p = plan(picture(TWO, RUNNING_TWO, view_render=rendered, reused={1: before}), S)
    assert p.fleet.slots[1].incarnation == (2 if replaced else 1)
    assert p.fleet.ledger == TWO.ledger, "no restart budget used"
    assert [d.name for d in p.deletes] == ([name] if replaced else [])
    assert [c.name for c in p.creates] == ([pod_name(JOB, 1, 2)] if replaced else [])
    assert [n.event for n in p.notes] == ([said] if said else [])
    assert p.reused == {1: before + 1}
    assert p.reuse_checked is rendered
    again = plan(picture(p.fleet, RUNNING_TWO, view_render=rendered, reuse_checked=rendered,
                         reused=p.reused, expected=p.expected, failed=p.ours), S)
    assert (again.deletes, again.notes) == ((), ()), "one render is looked at once"


def deleting(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    return p


SLOT1_AT_2 = replace(TWO, slots={**TWO.slots, 1: Slot(incarnation=2)})
OLD = pod_name(JOB, 1, 1)


@pytest.mark.parametrize(("f", "ps", "failed", "deleted"), [
    pytest.param(SLOT1_AT_2, pods(worker(0), worker(1), worker(1, 2, ip="10.1.0.21")),
                 frozenset(), [OLD], id="a live pod of an older incarnation is deleted"),
    pytest.param(SLOT1_AT_2, pods(worker(0), worker(1), worker(1, 2, ip="10.1.0.21")),
                 frozenset({f"uid-{OLD}"}), [],
                 id="not one already classified failed or deleted by us"),
    pytest.param(SLOT1_AT_2, pods(worker(0), deleting(worker(1))), frozenset(), [],
                 id="not one being deleted"),
    pytest.param(SLOT1_AT_2, pods(worker(0), worker(1, phase="Failed")), frozenset(), [],
                 id="not one that ended (kept for its logs)"),
    pytest.param(replace(TWO, slots={**TWO.slots, 1: Slot(incarnation=2, dropped="Ignore")}),
                 pods(worker(0), worker(1)), frozenset(), [], id="not a dropped slot's"),
    pytest.param(TWO, RUNNING_TWO, frozenset(), [], id="the current incarnations stay"),
])
def test_live_pods_of_older_incarnations_are_deleted(
        f: Fleet, ps: dict[str, Any], failed: frozenset[str], deleted: list[str]) -> None:
    p = plan(picture(f, ps, failed=failed), S)
    assert [d.name for d in p.deletes] == deleted
    assert [n.k8s.reason for n in p.notes if n.k8s] == ["WorkerSuperseded"] * len(deleted)
    assert {f"uid-{n}" for n in deleted} <= p.ours
    if deleted:
        again = plan(picture(p.fleet, ps, failed=failed | p.ours, expected=p.expected), S)
        assert again.deletes == (), "deleted once"


def test_below_min_np_the_job_fails_with_the_dropped_slots() -> None:
    f = Fleet(slots={0: Slot(dropped="exit 42 matched rule ignore"), 1: Slot(dropped="x")})
    p = plan(picture(f, {}), replace(S, min_np=1))
    assert p.fail == ("only 0 of MIN_NP 1 slots can still run; dropped slots: "
                      "{0: 'exit 42 matched rule ignore', 1: 'x'}")
    assert p.creates == ()


def test_backoff_holds_a_replacement_until_due() -> None:
    f = Fleet(slots={0: Slot(), 1: Slot(incarnation=2, due=WALL + 5, avoid_node="node-a")})
    assert plan(picture(f, pods(worker(0))), S).creates == ()
    later = plan(picture(f, pods(worker(0)), wall=WALL + 5), S)
    assert later.creates == (Create(1, 2, pod_name(JOB, 1, 2), "node-a"),)


def test_a_worker_retiring_since_this_step_waits_for_its_ssh_clients_to_be_counted() -> None:
    """The file withdrawn (published ""): the host is not in it, but nobody counted horovodrun's
    ssh clients to it yet: not deleted in this step."""
    p = plan(picture(TWO, RUNNING_TWO, scale_request=1, published=""), S)
    assert p.fleet.slots[1].retiring_at == WALL
    assert p.deletes == ()
    counted = plan(picture(p.fleet, RUNNING_TWO, published="", ssh_clients={"10.1.0.11": 0}), S)
    assert [d.name for d in counted.deletes] == [pod_name(JOB, 1, 1)]


# -- on_failures ---------------------------------------------------------------------------------

W0 = pod_name(JOB, 0, 1)


def failed(cause: Cause, *, exit_code: int | None = None, deleting: bool = False,
           container_ended: bool = False) -> Failed:
    p = worker(0)
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-11-21T12:14:00Z"
        p["metadata"]["deletionGracePeriodSeconds"] = 0
    if container_ended:
        p["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 137}}
    f = Failure(cause, W0, f"uid-{W0}", "node-a", exit_code, "worker" if exit_code else None,
                "detail")
    return Failed(f, p, NOW)


@pytest.mark.parametrize(("x", "policy", "deletes", "reason", "slot"), [
    pytest.param(failed(Cause.HUNG), Policy(), [DeletePod(W0, f"uid-{W0}", HUNG_GRACE_S)],
                 "WorkerRestarting", Slot(incarnation=2, due=WALL, avoid_node="node-a",
                                          hold_until=WALL + HUNG_HOLD_S),
                 id="hung: deleted with a grace its kubelet honours, its replacement held"),
    pytest.param(failed(Cause.HUNG, deleting=True), Policy(), [], "WorkerRestarting",
                 Slot(incarnation=2, due=WALL, avoid_node="node-a",
                      hold_until=WALL + HUNG_HOLD_S),
                 id="hung, already being deleted: not again"),
    pytest.param(failed(Cause.NODE_NOT_READY, deleting=True), Policy(), [], "WorkerRestarting",
                 Slot(incarnation=2, due=WALL, avoid_node="node-a"),
                 id="lost node, already force-deleted: not again"),
    pytest.param(failed(Cause.EXIT_CODE, exit_code=137), Policy(),
                 [DeletePod(W0, f"uid-{W0}", None)], "WorkerRestarting",
                 Slot(incarnation=2, due=WALL, avoid_node="node-a"),
                 id="its process died, its container runs on idle: deleted gracefully"),
    pytest.param(failed(Cause.EXIT_CODE, exit_code=137, container_ended=True), Policy(), [],
                 "WorkerRestarting", Slot(incarnation=2, due=WALL, avoid_node="node-a"),
                 id="its container ended: nothing to delete"),
    pytest.param(failed(Cause.EXIT_CODE, exit_code=137, container_ended=True),
                 Policy(budgets=Budgets(restart_limit=0)), [], "RestartRefused",
                 Slot(dropped="restart limit 0 reached"), id="no budget left: dropped"),
    pytest.param(failed(Cause.EXIT_CODE, exit_code=1, container_ended=True), Policy(), [],
                 "WorkerDropped", Slot(dropped="Ignore by default: other exit codes"),
                 id="exit 1: the default rule ignores it"),
])
def test_a_decision_per_failure(x: Failed, policy: Policy, deletes: list[DeletePod],
                                reason: str, slot: Slot) -> None:
    d = on_failures(TWO, [x], policy, S, WALL)
    assert list(d.deletes) == deletes
    assert d.fleet is not None and d.fleet.slots[0] == slot
    assert [(n.event, n.k8s.reason if n.k8s else None) for n in d.notes] == [
        ("worker.failed", reason)]
    assert d.counts == ((x.failure.cause.value, d.notes[0].fields["action"]),)
    assert d.replace_from == ({pod_name(JOB, 0, 2): NOW} if reason == "WorkerRestarting"
                              else {})
    assert d.fail is None


COUNTED = Policy(budgets=Budgets(disruptions_free=False))


@pytest.mark.parametrize(("policy", "used"), [
    (COUNTED, "1/100"),
    (Policy(), "0/100 (a disruption: not counted)"),  # disruptionsFree by default
])
def test_the_event_says_what_was_decided_and_the_budget_used(policy: Policy, used: str) -> None:
    d = on_failures(TWO, [failed(Cause.HUNG)], policy, S, WALL)
    n = d.notes[0]
    assert n.k8s is not None and n.k8s.note == (
        f"worker {W0} (slot 0) on node node-a: Hung: detail; rule 'default: node loss, force "
        "delete, eviction, preemption, deletion, hang': Restart; replacing it with "
        f"{pod_name(JOB, 0, 2)}; restarts used {used}")


def test_a_second_failure_of_the_same_pod_is_stale() -> None:
    d = on_failures(TWO, [failed(Cause.HUNG), failed(Cause.NODE_NOT_READY)], COUNTED, S, WALL)
    assert [n.event for n in d.notes] == ["worker.failed", "worker.failure_handled_before"]
    assert d.fleet is not None and d.fleet.ledger.total == 1


def test_a_fail_job_rule_fails_the_job_with_the_rule() -> None:
    rule = Rule("r0", Action.FAIL_JOB, exit_codes=((3, 3),))
    d = on_failures(TWO, [failed(Cause.EXIT_CODE, exit_code=3, container_ended=True)],
                    Policy(rules=(rule,)), S, WALL)
    assert d.fail == f"{W0}: ExitCode (detail) matched r0 -> FailJob"
    assert d.notes[0].k8s is not None and d.notes[0].k8s.reason == "JobFailing"


def test_without_a_fleet_a_restart_is_refused_and_nothing_is_deleted() -> None:
    d = on_failures(None, [failed(Cause.HUNG)], Policy(), S, WALL)
    assert (d.fleet, d.deletes, d.replace_from) == (None, (), {})
    assert d.notes[0].fields["refused"] == ("SUPERVISOR_WORKER_TEMPLATE is not set: the "
                                            "supervisor does not create workers")


# -- a worker kept off a node that is up again, and found no node -------------------------------

def pending(slot: int, inc: int, *, kept_off: tuple[str, ...] = (),
            scheduled: str | None = "Unschedulable") -> dict[str, Any]:
    """A worker as the scheduler leaves a pod it found no node for: no nodeName, Pending,
    PodScheduled False (reason Unschedulable); `kept_off`: the required NotIn that worker_pod
    renders for lost nodes (workers.worker_pod's own output for the affinity)."""
    p = worker(slot, inc, ip=None)
    rendered = worker_pod({"metadata": {}, "spec": {"containers": []}}, job=JOB, slot=slot,
                          incarnation=inc, owner=None, lost_nodes=kept_off)
    p["spec"] = {**p["spec"], **rendered["spec"], "containers": p["spec"]["containers"]}
    p["spec"].pop("nodeName", None)
    p["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [] if scheduled
                   is None else [{"type": "PodScheduled", "status": "False",
                                  "reason": scheduled, "lastProbeTime": None,
                                  "lastTransitionTime": "2026-11-26T23:22:05Z",
                                  "message": "0/3 nodes are available: 1 Insufficient cpu, 2 "
                                             "node(s) didn't match Pod's node affinity/selector."}]}
    return slim(Kind.POD, p)  # as the supervisor's view keeps it


HUNG_OLD = deleting(worker(1, 1, ip="10.1.0.21"))  # the slot's previous pod, still on node-a


@pytest.mark.parametrize(("ps", "lost", "deleted"), [
    pytest.param(pods(worker(0), pending(1, 2, kept_off=("node-b",))), frozenset(),
                 [pod_name(JOB, 1, 2)],
                 id="kept off node-b, which is up again, and no node found: created again"),
    pytest.param(pods(worker(0), pending(1, 2, kept_off=("node-b",))), frozenset({"node-b"}),
                 [], id="node-b is still down: it stays kept off"),
    pytest.param(pods(worker(0), HUNG_OLD, pending(1, 2, kept_off=("node-a",))), frozenset(),
                 [], id="node-a still holds the slot's previous pod: it stays kept off"),
    pytest.param(pods(worker(0), worker(1, 1, ip="10.1.0.21", phase="Failed"),
                      pending(1, 2, kept_off=("node-a",))), frozenset(), [pod_name(JOB, 1, 2)],
                 id="the slot's previous pod on node-a is Failed (kept for its logs): it holds "
                    "nothing (seen on real nodes)"),
    pytest.param(pods(worker(0), pending(1, 2, kept_off=("node-b",), scheduled=None)),
                 frozenset(), [], id="not judged by the scheduler yet: wait"),
    pytest.param(pods(worker(0), pending(1, 2)), frozenset(), [],
                 id="no node for it, and nothing kept it off (capacity): not ours to fix"),
    pytest.param(pods(worker(0), pending(1, 1, kept_off=("node-b",))), frozenset(),
                 [pod_name(JOB, 1, 1)],
                 id="an older incarnation of its slot: deleted by the superseded rule"),
])
def test_a_worker_kept_off_a_node_that_is_up_again_is_created_again(
        ps: dict[str, Any], lost: frozenset[str], deleted: list[str]) -> None:
    f = replace(TWO, slots={**TWO.slots, 1: Slot(incarnation=2)})
    out = plan(picture(f, ps, lost_nodes=lost), S)
    assert [d.name for d in out.deletes] == deleted
    said = [n for n in out.notes if n.event == "worker.rescheduled"]
    assert len(said) == len([d for d in deleted if d.endswith("-2")])
    if said:
        assert said[0].k8s is not None and said[0].k8s.reason == "WorkerRescheduled"
        assert " up again now" in said[0].k8s.note
        assert {ps[deleted[0]]["metadata"]["uid"]} <= out.ours
        assert out.creates == (), "the same name is created once the deleted pod is gone"
        again = plan(picture(f, ps, lost_nodes=lost, failed=out.ours), S)
        assert again.deletes == () and again.notes == (), (
            "deleted once: the view shows the unbound pod until the watch says it is gone "
            "(seen on real nodes: two deletes and two Events 34 ms apart)")
