"""The pure decisions behind issue 15's real-cluster behaviour, as tables: the leader Lease step,
the backoff of refused creates, which pods the clean pod policy deletes, which objects are
re-owned, which discovery files are someone else's. The claims about the API server are proven
in tests/integration (test_leader, test_admission, test_cleanup, test_ownership)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor import cleanup, discovery, startup
from supervisor.config import CleanPodPolicy
from supervisor.decide import admission
from supervisor.leader import Wait, Write, lease_name, micro_time, step

ME, OTHER = "job1-host/12", "job1-other/34"
T0 = 1_800_000_000.0  # wall clock written into the Lease


def lease(holder: str, *, duration: int = 60, transitions: int = 0) -> dict[str, Any]:
    """A Lease as the API server returns it."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name("job1"), "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "acquireTime": "2026-11-23T10:00:00.000000Z",
                     "renewTime": "2026-11-23T10:00:30.000000Z",
                     "leaseTransitions": transitions}}


@pytest.mark.parametrize(("current", "seen_at", "now", "expected"), [
    pytest.param(None, 0.0, 100.0, Write({
        "holderIdentity": ME, "leaseDurationSeconds": 60, "acquireTime": micro_time(T0),
        "renewTime": micro_time(T0), "leaseTransitions": 0}, create=True),
        id="no lease yet: create it, holding it"),
    pytest.param(lease(OTHER), 100.0, 130.0, Wait(OTHER, 30.0),
                 id="held by another and renewed 30s ago (its 60s): wait"),
    pytest.param(lease(OTHER, duration=10), 100.0, 130.0, Write({
        "holderIdentity": ME, "leaseDurationSeconds": 60, "acquireTime": micro_time(T0),
        "renewTime": micro_time(T0), "leaseTransitions": 1}, create=False),
        id="held by another, not renewed for its own 10s: take over, one more transition"),
    pytest.param(lease(""), 100.0, 100.0, Write({
        "holderIdentity": ME, "leaseDurationSeconds": 60, "acquireTime": micro_time(T0),
        "renewTime": micro_time(T0), "leaseTransitions": 1}, create=False),
        id="released (empty holder): take over at once"),
    pytest.param(lease(ME, transitions=3), 100.0, 101.0, Write({
        "holderIdentity": ME, "leaseDurationSeconds": 60,
        "acquireTime": "2026-11-23T10:00:00.000000Z", "renewTime": micro_time(T0),
        "leaseTransitions": 3}, create=False),
        id="ours: renew, keeping acquireTime and transitions"),
])
def test_the_leader_lease_step(current: dict[str, Any] | None, seen_at: float, now: float,
                               expected: Wait | Write) -> None:
    assert step(current, ME, 60, seen_at=seen_at, now=now, wall=T0) == expected


def test_a_holder_known_to_be_gone_is_taken_over_at_once() -> None:
    """Sidecar mode: the holder was a supervisor process of this pod that died (the kubelet
    started this one): no waiting out its 60 s."""
    assert step(lease(OTHER), ME, 60, seen_at=100.0, now=100.5, wall=T0, gone=True) == Write({
        "holderIdentity": ME, "leaseDurationSeconds": 60, "acquireTime": micro_time(T0),
        "renewTime": micro_time(T0), "leaseTransitions": 1}, create=False)
    assert step(lease(OTHER), ME, 60, seen_at=100.0, now=100.5, wall=T0) == Wait(OTHER, 59.5)


def test_expiry_is_measured_from_when_this_process_saw_the_record_not_from_renew_time() -> None:
    # renewTime says 2026 and the clock says 2027: never compared. A standby that first sees
    # the record now waits the whole duration from now.
    assert step(lease(OTHER), ME, 60, seen_at=500.0, now=500.0, wall=T0 + 3e7) == Wait(
        OTHER, 60.0)


@pytest.mark.parametrize(("attempts", "delay"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0),
                                                 (6, 30.0), (20, 30.0)])
def test_a_refused_create_backs_off_doubling_to_30s(attempts: int, delay: float) -> None:
    r = None
    for i in range(attempts):
        r = admission.refused(r, f"exceeded quota {i}", now=100.0)
    assert r == admission.Refusal(attempts, 100.0 + delay, f"exceeded quota {attempts - 1}")
    assert admission.waiting({"w": r}, 100.0 + delay - 0.01) == {"w"}
    assert admission.waiting({"w": r}, 100.0 + delay) == set()


@pytest.mark.parametrize(("policy", "expected"), [
    (CleanPodPolicy.RUNNING, ("elastic-supervisor/job=job1,elastic-supervisor/slot",
                              "status.phase!=Succeeded,status.phase!=Failed")),
    (CleanPodPolicy.ALL, ("elastic-supervisor/job=job1,elastic-supervisor/slot", "")),
    (CleanPodPolicy.NONE, None),
], ids=["Running: the job's pods not finished", "All: every pod of the job", "None: nothing"])
def test_what_the_clean_pod_policy_deletes(policy: CleanPodPolicy, expected: Any) -> None:
    assert cleanup.selectors(policy, "job1") == expected


JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "job1", "uid": "job-uid"}
OURS = {"apiVersion": "batch/v1", "kind": "Job", "name": "job1", "uid": "job-uid",
        "blockOwnerDeletion": True}
OLD_POD = {"apiVersion": "v1", "kind": "Pod", "name": "job1-x7k2p", "uid": "pod-uid",
           "controller": True, "blockOwnerDeletion": True}
OLD_JOB = {**OURS, "uid": "old-job-uid"}
OTHER_OWNER = {"apiVersion": "example.com/v1", "kind": "Team", "name": "ml", "uid": "t"}


@pytest.mark.parametrize(("refs", "expected"), [
    pytest.param([OURS], None, id="already owned by the Job: untouched"),
    pytest.param([OLD_POD], [OURS], id="an older launcher pod's: the Job instead"),
    pytest.param([], [OURS], id="unowned (a local run made it): the Job"),
    pytest.param([OLD_JOB], [OURS], id="a Job of the same name before: ours instead"),
    pytest.param([OTHER_OWNER, OLD_POD], [OTHER_OWNER, OURS],
                 id="someone else's extra owner is kept"),
])
def test_which_owner_references_adoption_writes(refs: list[dict[str, Any]],
                                               expected: list[dict[str, Any]] | None) -> None:
    assert startup.adopted_owners(refs, JOB) == expected


def worker(name: str, refs: list[dict[str, Any]], *, slot: str | None = "0",
           deleting: bool = False) -> dict[str, Any]:
    labels = {"elastic-supervisor/job": "job1", "elastic-supervisor/role": "worker"}
    if slot is not None:
        labels |= {"elastic-supervisor/slot": slot, "elastic-supervisor/incarnation": "1"}
    meta: dict[str, Any] = {"name": name, "uid": f"{name}-uid", "labels": labels,
                            "ownerReferences": refs}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    return {"metadata": meta}


def test_only_the_jobs_own_live_workers_are_re_owned() -> None:
    pods = [worker("job1-w1-1", [OLD_POD]), worker("job1-w0-1", [OLD_POD]),
            worker("job1-w2-1", [OURS]), worker("someone", [OLD_POD], slot=None),
            worker("job1-w3-1", [OLD_POD], deleting=True)]
    assert startup.to_adopt(pods, "job1", JOB) == [
        ("job1-w0-1", "job1-w0-1-uid", [OURS]), ("job1-w1-1", "job1-w1-1-uid", [OURS])]


@pytest.mark.parametrize(("content", "foreign"), [
    pytest.param("", None, id="empty: ours (nothing usable was left)"),
    pytest.param("10.0.0.1:1\n10.0.0.2:1\n", None, id="pod IPs: ours"),
    pytest.param("w0.job1.ns.svc:4\n", None, id="dns names: ours"),
    pytest.param("127.0.0.1 localhost\n", "127.0.0.1 localhost", id="/etc/hosts"),
    pytest.param("10.0.0.1:1\nsomething else\n", "something else", id="one foreign line"),
    pytest.param("10.0.0.1\n", "10.0.0.1", id="no slots: not written by the supervisor"),
])
def test_a_discovery_file_that_is_not_ours_is_recognised(content: str,
                                                        foreign: str | None) -> None:
    assert discovery.foreign_line(content) == foreign
