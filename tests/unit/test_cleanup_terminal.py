"""Whether a supervisor's exit ends the job for good (supervisor.cleanup.terminal), from real
batch/v1 Job shapes: then SUPERVISOR_CLEAN_POD_POLICY applies; else the Job's next launcher
adopts the workers. And the mark a cleanup leaves (fleet.released)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.cleanup import already_succeeded, success_mark, terminal
from supervisor.decide import fleet
from supervisor.decide.fleet import Fleet, Slot

FAIL_JOB = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "launcher", "operator": "In",
                                          "values": [2, 4, 5, 6, 8, 9]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}


def job(*, backoff: int | None = 2, failed: int = 0, policy: dict | None = FAIL_JOB,
        conditions: tuple[tuple[str, str], ...] = (), deleting: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"podFailurePolicy": policy} if policy else {}
    if backoff is not None:
        spec["backoffLimit"] = backoff
    meta: dict[str, Any] = {"name": "elastic-train", "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    status: dict[str, Any] = {"active": 1}
    if failed:
        status["failed"] = failed
    if conditions:
        status["conditions"] = [{"type": t, "status": s} for t, s in conditions]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec,
            "status": status}


CASES = [
    ("no Job: a local run", 1, None, "no Job"),
    ("success", 0, job(), "success"),
    ("success, the Job not read (an exit 0 does not read it)", 0, None, "success"),
    ("FailJob code 6", 6, job(), "FailJob"),
    ("FailJob code 9", 9, job(), "FailJob"),
    ("horovodrun's 1, retries left", 1, job(failed=1), None),
    ("start timeout 3, retries left", 3, job(), None),
    ("leadership lost 7", 7, job(), None),
    ("SIGTERM (a preempted launcher)", 143, job(), None),
    ("the last attempt", 1, job(failed=2), "last attempt"),
    ("backoffLimit 0", 3, job(backoff=0), "last attempt"),
    ("default backoffLimit 6, 5 failed", 1, job(backoff=None, failed=5), None),
    ("default backoffLimit 6, 6 failed", 1, job(backoff=None, failed=6), "last attempt"),
    ("no podFailurePolicy: 6 is retried", 6, job(policy=None), None),
    ("NotIn rule", 1, job(policy={"rules": [{"action": "FailJob", "onExitCodes": {
        "operator": "NotIn", "values": [0, 1]}}]}), None),
    ("NotIn rule matching", 3, job(policy={"rules": [{"action": "FailJob", "onExitCodes": {
        "operator": "NotIn", "values": [0, 1]}}]}), "FailJob"),
    ("Ignore rule on the code: retried even on the last attempt", 1, job(failed=2, policy={
        "rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}}]}),
     None),
    ("Count rule: the backoff limit decides", 1, job(failed=2, policy={"rules": [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}}]}),
     "last attempt"),
    ("the Job is being deleted", 143, job(deleting=True), "being deleted"),
    ("the Job failed already (deadline)", 143, job(conditions=(("Failed", "True"),)),
     "Failed"),
    ("a false condition is not one", 1, job(conditions=(("Failed", "False"),)), None),
]


@pytest.mark.parametrize(("name", "code", "obj", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_terminal(name: str, code: int, obj: dict | None, expected: str | None) -> None:
    why = terminal(code, obj)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_released_moves_every_active_slot_to_its_next_incarnation() -> None:
    f = Fleet(slots={0: Slot(incarnation=3, avoid_node="n1", due=99.0),
                     1: Slot(incarnation=1, dropped="Ignore by exit code 0"),
                     2: Slot(incarnation=2, retiring_at=5.0)})
    out = fleet.released(f)
    assert out.slots[0] == Slot(incarnation=4)
    assert out.slots[1] == f.slots[1] and out.slots[2] == f.slots[2]
    assert out.ledger == f.ledger


JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic-train", "uid": "u1"}


@pytest.mark.parametrize(("stored", "owner", "done"), [
    pytest.param({"succeeded": "u1"}, JOB_OWNER, True, id="this Job's launcher succeeded"),
    pytest.param({"succeeded": "u0"}, JOB_OWNER, False,
                 id="a Job of the same name before (deleted, made again)"),
    pytest.param({}, JOB_OWNER, False, id="no success recorded"),
    pytest.param(None, JOB_OWNER, False, id="no state yet"),
    pytest.param({"succeeded": "u1"}, None, False, id="a local run: no Job, no standby"),
    pytest.param({"succeeded": "u1"}, {**JOB_OWNER, "kind": "Pod"}, False,
                 id="a bare launcher pod owns the state"),
])
def test_a_standby_sees_a_success_only_of_its_own_job(stored: dict[str, Any] | None,
                                                     owner: dict[str, str] | None,
                                                     done: bool) -> None:
    assert already_succeeded(stored, owner) is done


@pytest.mark.parametrize(("code", "owner", "mark"), [
    pytest.param(0, JOB_OWNER, "u1", id="success under a Job: its uid"),
    pytest.param(1, JOB_OWNER, None, id="a failure: nothing"),
    pytest.param(0, None, None, id="a local run: nothing"),
    pytest.param(0, {**JOB_OWNER, "kind": "Pod"}, None, id="a bare launcher pod: nothing"),
    pytest.param(0, {**JOB_OWNER, "uid": ""}, None, id="no uid: nothing"),
])
def test_a_success_under_a_job_is_marked_with_its_uid(code: int, owner: dict[str, str] | None,
                                                      mark: str | None) -> None:
    assert success_mark(code, owner) == mark
    if mark is not None:  # and the standby of that Job reads it back
        assert already_succeeded({"succeeded": mark}, owner)
