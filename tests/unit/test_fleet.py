"""Slots of a managed job: failure -> next incarnation / dropped / stale, creation, persistence."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from supervisor.decide import fleet
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.fleet import Create, Fleet, Slot
from supervisor.decide.policy import Action, Budgets, Policy, Rule
from supervisor.workers import pod_name

JOB = "job1"
KILLED = Failure(Cause.EXIT_CODE, "job1-w0-1", "u1", "node-a", 137, "worker")
BUG = Failure(Cause.EXIT_CODE, "job1-w0-1", "u1", "node-a", 1, "worker")
LOST = Failure(Cause.NODE_NOT_READY, "job1-w0-1", "u1", "node-a")


def pod(slot: int | None, inc: int | None, job: str = JOB) -> dict:
    labels = {"elastic-supervisor/job": job, "elastic-supervisor/role": "worker"}
    if slot is not None:
        labels["elastic-supervisor/slot"] = str(slot)
    if inc is not None:
        labels["elastic-supervisor/incarnation"] = str(inc)
    return {"metadata": {"name": "p", "labels": labels}}


@pytest.mark.parametrize(("obj", "expected"), [
    (pod(0, 1), (0, 1)),
    (pod(3, 12), (3, 12)),
    (pod(None, 1), None),
    (pod(0, None), None),
    (pod(0, 1, job="other"), None),
    ({"metadata": {"name": "p", "labels": {"elastic-supervisor/job": JOB,
                                            "elastic-supervisor/slot": "x",
                                            "elastic-supervisor/incarnation": "1"}}}, None),
    (pod(0, 0), None),
])
def test_slot_of(obj: dict, expected: tuple[int, int] | None) -> None:
    assert fleet.slot_of(obj, JOB) == expected


def test_initial_fleet_wants_every_slot_at_once() -> None:
    f = fleet.initial(fleet.workers_for(np=3, slots_per_worker=2))
    assert f.active() == [0, 1]
    assert fleet.wanted(f, JOB, set(), now=0.0) == [
        Create(0, 1, "job1-w0-1", None), Create(1, 1, "job1-w1-1", None)]
    assert fleet.wanted(f, JOB, {"job1-w0-1"}, now=0.0) == [Create(1, 1, "job1-w1-1", None)]


@pytest.mark.parametrize(("failure", "policy", "found", "expected_slot", "action"), [
    pytest.param(KILLED, Policy(), (0, 1), Slot(incarnation=2, avoid_node="node-a", due=100.0),
                 Action.RESTART, id="exit 137 -> next incarnation away from the node"),
    pytest.param(LOST, Policy(), (0, 1), Slot(incarnation=2, avoid_node="node-a", due=100.0),
                 Action.RESTART, id="node lost -> next incarnation"),
    pytest.param(BUG, Policy(), (0, 1), Slot(incarnation=1, dropped="Ignore by default: other "
                                             "exit codes"),
                 Action.IGNORE, id="exit 1 -> dropped by the default rule"),
    pytest.param(KILLED, Policy(budgets=Budgets(restart_limit=0)), (0, 1),
                 Slot(incarnation=1, dropped="restart limit 0 reached"), Action.IGNORE,
                 id="no budget -> dropped with the reason"),
    pytest.param(BUG, Policy(rules=(Rule("r0", Action.FAIL_JOB, exit_codes=((1, 1),)),)),
                 (0, 1), Slot(incarnation=1, dropped="FailJob by r0"), Action.FAIL_JOB,
                 id="FailJob rule"),
])
def test_failure_of_the_current_incarnation(failure: Failure, policy: Policy,
                                            found: tuple[int, int], expected_slot: Slot,
                                            action: Action) -> None:
    f, d = fleet.on_failure(fleet.initial(1), failure, found, policy, 100.0,
                            unmanaged_reason="-")
    assert d is not None and d.action is action
    assert f.slots[0] == expected_slot
    # A node lost is the infrastructure's doing: free of the budget by default.
    assert f.ledger.total == (1 if action is Action.RESTART and failure is not LOST else 0)


def test_failures_of_old_incarnations_and_dropped_slots_are_stale() -> None:
    f, _ = fleet.on_failure(fleet.initial(2), KILLED, (0, 1), Policy(), 10.0,
                            unmanaged_reason="-")
    again, d = fleet.on_failure(f, KILLED, (0, 1), Policy(), 11.0, unmanaged_reason="-")
    assert d is None and again is f  # a restarted supervisor sees incarnation 1 fail again
    f2, _ = fleet.on_failure(f, BUG, (1, 1), Policy(), 12.0, unmanaged_reason="-")
    assert f2.slots[1].dropped
    assert fleet.on_failure(f2, KILLED, (1, 1), Policy(), 13.0, unmanaged_reason="-")[1] is None
    assert fleet.on_failure(f2, KILLED, (7, 1), Policy(), 13.0, unmanaged_reason="-")[1] is None


def test_an_unmanaged_worker_is_never_restarted_and_never_costs_budget() -> None:
    f0 = fleet.initial(1)
    f, d = fleet.on_failure(f0, KILLED, None, Policy(), 0.0, unmanaged_reason="no template")
    assert f is f0
    assert d is not None and d.action is Action.IGNORE and d.refused == "no template"
    assert d.rule.startswith("default: exit codes 128-255")
    f, d = fleet.on_failure(f0, BUG, None, Policy(), 0.0, unmanaged_reason="no template")
    assert d is not None and d.action is Action.IGNORE and d.refused is None


def test_the_next_deadline_is_the_earliest_future_one_of_an_active_slot() -> None:
    """next_due sorts a fleet's deadlines once and bisects: the same answer as a walk of every
    slot, for random fleets and times (dropped slots, holds, deadlines equal to now)."""
    rng = random.Random(4)
    for _ in range(200):
        slots = {i: Slot(incarnation=2, due=rng.choice([0.0, 100.0, 101.0, 105.5]),
                         hold_until=rng.choice([None, 101.0, 103.0]),
                         dropped=rng.choice([None, None, "gone"]))
                 for i in range(rng.randint(0, 12))}
        f = Fleet(slots=slots)
        for now in (0.0, 99.0, 100.0, 101.0, 104.0, 106.0):
            future = [t for s in slots.values() if s.dropped is None
                      for t in (s.due, s.hold_until or 0.0) if t > now]
            assert fleet.next_due(f, now) == (min(future) if future else None), (slots, now)


def test_a_fleet_changed_one_slot_at_a_time_answers_as_one_made_anew() -> None:
    """Fleet.with_slot carries what was worked out of the fleet before (its active, changing
    and retiring slots, each job's current pods, its deadlines) changed for
    the one slot: over random changes
    (a restart, a drop, a scale-out or -in, a slot removed or added; asked or not in between)
    the same answers as a fleet made from the same slots."""
    rng = random.Random(6)
    f = fleet.initial(12)
    for step in range(600):
        i = rng.randrange(16)
        due = rng.choice([0.0, 0.0, 100.0, 101.0, 102.5])
        slot = rng.choice([None, Slot(incarnation=rng.randint(1, 4), due=due),
                           Slot(incarnation=rng.randint(1, 4), dropped="gone", due=due),
                           Slot(incarnation=2, added_at=5.0),
                           Slot(incarnation=2, retiring_at=6.0),
                           Slot(incarnation=3, added_at=5.0, retiring_at=6.0),
                           Slot(incarnation=4, due=due, hold_until=rng.choice([101.0, 103.0]),
                                avoid_node="node-a")])
        f = f.with_slot(i, slot, f.ledger if rng.random() < 0.5 else None)
        anew = Fleet(slots=dict(f.slots), ledger=f.ledger)
        assert f == anew, step
        if rng.random() < 0.7:  # (else the next change carries what was not asked yet)
            assert f.active() == anew.active(), step
            assert f.changing() == anew.changing(), step
            assert f.retiring() == anew.retiring(), step
            for job in rng.sample([JOB, "other"], rng.randint(1, 2)):
                assert f.current(job) == anew.current(job), step
            for now in (0.0, 100.0, 101.5, 102.5):
                assert fleet.next_due(f, now) == fleet.next_due(anew, now), (step, now)
            assert fleet.fleet_to_dict(f) == fleet.fleet_to_dict(anew), step
            assert json.dumps(fleet.fleet_to_dict(f), sort_keys=True) == json.dumps(
                fleet.fleet_to_dict(anew), sort_keys=True), "the same stored text"
            assert fleet.stored_slots(f) == json.dumps(fleet.fleet_to_dict(anew)["slots"],
                                                       sort_keys=True), step
    assert f.slots.keys() != set(range(12)), "slots were added and removed"


def test_backoff_delays_the_second_replacement_of_a_slot() -> None:
    policy = Policy(budgets=Budgets(backoff_initial_s=2.0))
    f, d1 = fleet.on_failure(fleet.initial(1), KILLED, (0, 1), policy, 100.0,
                             unmanaged_reason="-")
    assert d1 is not None and d1.delay_s == 0
    f, d2 = fleet.on_failure(f, KILLED, (0, 2), policy, 101.0, unmanaged_reason="-")
    assert d2 is not None and d2.delay_s == pytest.approx(1.0)  # 100 + 2 - 101
    assert fleet.wanted(f, JOB, set(), now=101.5) == []
    assert fleet.next_due(f, 101.5) == pytest.approx(102.0)
    assert fleet.wanted(f, JOB, set(), now=102.0) == [Create(0, 3, "job1-w0-3", "node-a")]


def test_adopt_moves_a_slot_up_to_a_newer_incarnation_seen_in_the_cluster() -> None:
    f = fleet.initial(2)
    adopted = fleet.adopt(f, [pod(0, 3), pod(1, 1), pod(None, 5), pod(4, 2)], JOB)
    assert adopted.slots[0] == Slot(incarnation=3)
    assert adopted.slots[1] == Slot()
    assert adopted.slots[4] == Slot(incarnation=2)
    assert fleet.adopt(f, [pod(0, 1)], JOB) is f


def test_capacity_counts_active_slots_only() -> None:
    f, _ = fleet.on_failure(fleet.initial(3), BUG, (2, 1), Policy(), 0.0, unmanaged_reason="-")
    assert f.active() == [0, 1]
    assert [c.name for c in fleet.wanted(f, JOB, set(), 0.0)] == [
        pod_name(JOB, 0, 1), pod_name(JOB, 1, 1)]


HUNG = Failure(Cause.HUNG, "job1-w1-1", "u2", "node-b", None, "", "silent for 3.0s")


def test_state_round_trips_through_json() -> None:
    f, _ = fleet.on_failure(fleet.initial(3), KILLED, (0, 1), Policy(), 50.0,
                            unmanaged_reason="-")
    f, _ = fleet.on_failure(f, BUG, (2, 1), Policy(), 51.0, unmanaged_reason="-")
    f, _ = fleet.on_failure(f, HUNG, (1, 1), Policy(), 52.0, unmanaged_reason="-")
    assert f.slots[1].hold_until == 52.0 + fleet.HUNG_HOLD_S
    data = json.loads(json.dumps(fleet.fleet_to_dict(f)))
    assert fleet.fleet_from_dict(data) == f


def test_a_stored_slot_is_made_once_per_slot_object() -> None:
    """At 10,000 slots each save made every slot's entry again; a slot that changed is a new
    object, so its entry is made again and the others' are the ones stored before."""
    f = fleet.initial(3)
    before = fleet.fleet_to_dict(f)["slots"]
    g, _ = fleet.on_failure(f, KILLED, (1, 1), Policy(), 50.0, unmanaged_reason="-")
    after = fleet.fleet_to_dict(g)["slots"]
    assert after["0"] is before["0"] and after["2"] is before["2"]
    assert after["1"] is not before["1"] and after["1"]["incarnation"] == 2
    assert before["1"] == {"incarnation": 1}, "the earlier state is unchanged"
    assert fleet.fleet_from_dict(json.loads(json.dumps(fleet.fleet_to_dict(g)))) == g


@pytest.mark.parametrize(("data", "message"), [
    (None, "expected a mapping with version 1"),
    ({"version": 2, "slots": {}}, "expected a mapping with version 1"),
    ({"version": 1, "slots": []}, "slots: expected a mapping"),
    ({"version": 1, "slots": {"a": {"incarnation": 1}}}, "slots.a: expected a slot number"),
    ({"version": 1, "slots": {"0": {"incarnation": 0}}}, "slots.0.incarnation: expected an "
     "integer >= 1"),
    ({"version": 1, "slots": {"0": {"incarnation": 1, "due": "soon"}}}, "slots.0.due"),
    ({"version": 1, "slots": {"0": {"incarnation": 1}}, "ledger": {"version": 1, "total": -1}},
     "ledger: total: expected an integer >= 0"),
])
def test_damaged_state_is_refused_with_the_field(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        fleet.fleet_from_dict(data)


def test_empty_fleet_has_no_active_slots() -> None:
    assert Fleet().active() == []


def test_renew_replaces_a_slots_pod_without_using_budget() -> None:
    f = fleet.initial(2)
    renewed = fleet.renew(f, 1, 1, now=50.0)
    assert renewed.slots[1] == fleet.Slot(incarnation=2, due=50.0)
    assert renewed.ledger == f.ledger
    assert fleet.current_pods(renewed, "job1") == {"job1-w0-1", "job1-w1-2"}
    # A stale incarnation, a dropped or an unknown slot: nothing to renew.
    assert fleet.renew(renewed, 1, 1, now=60.0) is renewed
    dropped = dataclasses.replace(renewed, slots={**renewed.slots, 0: fleet.Slot(dropped="x")})
    assert fleet.renew(dropped, 0, 1, now=60.0) is dropped
    assert fleet.renew(f, 7, 1, now=60.0) is f


def test_adoption_keeps_a_slot_below_a_replacement_placed_ahead_of_a_move() -> None:
    """A cordoned worker's replacement placed ahead (leaving.move_ahead) is no crash-before-save:
    while that worker is there, its slot stays; once it is gone or going, the slot moves up."""
    def named(inc: int, **meta: object) -> dict:
        p = pod(0, inc)
        p["metadata"].update(name=pod_name(JOB, 0, inc), **meta)
        return p

    f = fleet.initial(1)
    worker = named(1)
    ahead = named(2, annotations={"elastic-supervisor/ahead-of": pod_name(JOB, 0, 1)})
    assert fleet.adopt(f, [worker, ahead], JOB) is f
    assert fleet.adopt(f, [ahead], JOB).slots[0] == Slot(incarnation=2)
    going = named(1, deletionTimestamp="2026-11-28T14:00:00Z")
    assert fleet.adopt(f, [going, ahead], JOB).slots[0] == Slot(incarnation=2)


def test_adoption_never_revives_a_slot_removed_by_a_scale_in_whose_pod_is_going() -> None:
    f = fleet.initial(2)
    going = {"metadata": {"name": "job1-w2-1", "deletionTimestamp": "2026-11-23T10:00:00Z",
                          "labels": {"elastic-supervisor/job": "job1",
                                     "elastic-supervisor/slot": "2",
                                     "elastic-supervisor/incarnation": "1"}}}
    assert fleet.adopt(f, [going], "job1") is f
    alive = {"metadata": {**going["metadata"], "deletionTimestamp": None}}
    assert 2 in fleet.adopt(f, [alive], "job1").slots  # state lost: the live pod says


@pytest.mark.parametrize(("old_there", "now", "expected"), [
    pytest.param(True, 100.0, [], id="the hung pod still there: held"),
    pytest.param(False, 100.0, [Create(1, 2, "job1-w1-2", "node-b")],
                 id="the hung pod gone: made, its node only preferred away"),
    pytest.param(True, 100.0 + fleet.HUNG_HOLD_S,
                 [Create(1, 2, "job1-w1-2", "node-b", away=True)],
                 id="the hold over, the pod still there: made, its node required away"),
])
def test_a_hung_pods_replacement_waits_for_it_to_be_gone(old_there: bool, now: float,
                                                        expected: list[Create]) -> None:
    f, d = fleet.on_failure(fleet.initial(2), HUNG, (1, 1), Policy(), 100.0,
                            unmanaged_reason="-")
    assert d is not None and d.action is Action.RESTART
    existing = {"job1-w0-1", *(["job1-w1-1"] if old_there else [])}
    assert fleet.wanted(f, "job1", existing, now) == expected
    assert fleet.next_due(f, 100.0) == 100.0 + fleet.HUNG_HOLD_S
