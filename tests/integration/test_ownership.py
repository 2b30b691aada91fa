"""Ownership on the real control plane, with the manifests' RBAC and the apiserver's
OwnerReferencesPermissionEnforcement admission plugin: the workers and the state belong to the
launcher Job (a real batch/v1 Job whose controller made a real launcher pod), not to one
launcher pod, so the garbage collector never takes them when a finished launcher pod goes (PodGC,
node removal, cleanup), and a Job retry's launcher adopts them. Workers an older launcher pod
owned are re-owned by the Job.

The launcher pod is never scheduled (no kubelet runs it here); the supervisor runs as a local
process with its name (SUPERVISOR_POD_NAME) and a token of the manifests' ServiceAccount.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.controlplane import ControlPlane
from supervisor.decide.fleet import state_name
from tests.helpers import wait_for
from tests.integration.harness import AutoKubelet, Job, SupervisorProcess
from tests.integration.test_manifests import (  # noqa: F401 (module fixture)
    apply_rbac,
    manifests,
)

JOB = "elastic-train"  # the name the manifests' RBAC (resourceNames) is written for


@pytest.fixture
def world(control_plane: ControlPlane, api_client: client.ApiClient,
          manifests: Path,  # noqa: F811 (the fixture imported above)
          tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A namespace with the manifests' RBAC, a launcher Job whose pod is pending, and a worker
    Job harness whose pods a kubelet stand-in starts."""
    core = client.CoreV1Api(api_client)
    applied = apply_rbac(control_plane, core, manifests, tmp_path)
    kubeconfig, ns = applied.token
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(ns, {
        "metadata": {"name": JOB},
        "spec": {"backoffLimit": 6, "template": {
            "metadata": {"labels": {"elastic-supervisor/job": JOB,
                                    "elastic-supervisor/role": "launcher"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"es-test/nowhere": "x"},
                     "containers": [{"name": "launcher", "image": "launcher:local"}]}}}})
    job = Job(api_client, ns, name=JOB)
    job.kubelet = AutoKubelet(job)
    job.node("n1")
    made: list[SupervisorProcess] = []

    def supervisor(pod: str, **env: str) -> SupervisorProcess:
        own = tmp_path / f"run{len(made)}"  # each launcher its own directory (its own pod)
        own.mkdir()
        sup = SupervisorProcess(control_plane, ns, own, KUBECONFIG=str(kubeconfig),
                                SUPERVISOR_JOB_NAME=JOB, SUPERVISOR_POD_NAME=pod,
                                SUPERVISOR_LEADER_LEASE_SECONDS="4",
                                SUPERVISOR_WORKER_TEMPLATE=str(job.template(
                                    own / "worker.json")), **env)
        made.append(sup)
        return sup.start()

    yield {"ns": ns, "core": core, "batch": batch, "job": job, "supervisor": supervisor}
    for sup in made:
        sup.close()
    job.kubelet.close()
    job.close()
    core.delete_namespace(ns)


def launcher_pods(core: client.CoreV1Api, ns: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector="elastic-supervisor/role=launcher").items
    return sorted((p for p in pods if not p.metadata.deletion_timestamp),
                  key=lambda p: p.metadata.creation_timestamp)


Ref = tuple[str, str, str, str, bool, bool]  # apiVersion, kind, name, uid, block, controller


def job_ref(batch: client.BatchV1Api, ns: str) -> Ref:
    """The reference the workers and the state must carry: the Job, blocking its foreground
    deletion, and not as their controller (the Job controller would release pods it controls
    that its selector does not match)."""
    return ("batch/v1", "Job", JOB, batch.read_namespaced_job(JOB, ns).metadata.uid, True,
            False)


def owners(obj: Any) -> list[Ref]:
    return [(r.api_version, r.kind, r.name, r.uid, bool(r.block_owner_deletion),
             bool(r.controller)) for r in obj.metadata.owner_references or ()]


def gc_done(core: client.CoreV1Api, ns: str, owner: client.V1Pod) -> None:
    """Delete `owner` and wait until the garbage collector removed a canary it owns."""
    core.create_namespaced_config_map(ns, {"metadata": {"name": "canary", "ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": owner.metadata.name,
        "uid": owner.metadata.uid}]}})
    core.delete_namespaced_pod(owner.metadata.name, ns)

    def canary_gone() -> bool:
        try:
            core.read_namespaced_config_map("canary", ns)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(canary_gone, 30, what=f"the garbage collector acting on {owner.metadata.name}")


def state(core: client.CoreV1Api, ns: str) -> client.V1ConfigMap:
    return core.read_namespaced_config_map(state_name(JOB), ns)


def test_workers_and_state_belong_to_the_job_and_a_retry_adopts_them(world) -> None:
    core, ns, job = world["core"], world["ns"], world["job"]
    [first] = wait_for(lambda: launcher_pods(core, ns), 30, what="the launcher pod")
    sup = world["supervisor"](first.metadata.name)
    workers = wait_for(lambda: len(job.live()) == 2 and job.live(), 30, what="2 workers")
    sup.wait_log("horovodrun.started", timeout=20)
    ref = job_ref(world["batch"], ns)
    for name in workers:
        assert owners(core.read_namespaced_pod(name, ns)) == [ref], name
    assert owners(state(core, ns)) == [ref]
    job.terminate(workers[0], 137)  # spend one restart, so the budget has something to carry
    wait_for(lambda: len(job.live()) == 2 and job.live() != workers, 30, what="a replacement")
    sup.wait_log("worker.created", pod="elastic-train-w0-2")
    before = {n: p["metadata"]["uid"] for n, p in job.pods().items()}
    # The launcher dies without a word (OOM, node loss); its finished pod is garbage later.
    sup.signal(signal.SIGKILL)
    sup.wait_exit(10)
    gc_done(core, ns, first)
    assert {n: p["metadata"]["uid"] for n, p in job.pods().items()} == before
    ledger = json.loads(state(core, ns).data["state.json"])["ledger"]
    assert ledger["total"] == 1
    # The Job retries: its next launcher adopts the workers and the budgets.
    [second] = wait_for(lambda: launcher_pods(core, ns), 60, what="the Job's next launcher")
    again = world["supervisor"](second.metadata.name)
    again.wait_log("horovodrun.started", timeout=30)
    assert {n: p["metadata"]["uid"] for n, p in job.pods().items()} == before
    assert not [e for e in again.logs() if e.get("event") == "worker.created"]


def test_workers_an_older_launcher_pod_owned_are_re_owned_by_the_job(world) -> None:
    core, ns, job = world["core"], world["ns"], world["job"]
    [launcher] = wait_for(lambda: launcher_pods(core, ns), 30, what="the launcher pod")
    pod_owner = {"apiVersion": "v1", "kind": "Pod", "name": launcher.metadata.name,
                 "uid": launcher.metadata.uid, "controller": True, "blockOwnerDeletion": True}
    # What a supervisor that gave its workers to its own pod left behind.
    for slot in (0, 1):
        core.create_namespaced_pod(ns, {
            "metadata": {"name": f"{JOB}-w{slot}-1", "ownerReferences": [pod_owner],
                         "labels": {**job.labels(), "elastic-supervisor/slot": str(slot),
                                    "elastic-supervisor/incarnation": "1"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"es-test/namespace": ns},
                     "containers": [{"name": "worker", "image": "worker:local"}]}})
    core.create_namespaced_config_map(ns, {
        "metadata": {"name": state_name(JOB), "ownerReferences": [pod_owner]},
        "data": {"state.json": json.dumps({
            "version": 1, "slots": {"0": {"incarnation": 1}, "1": {"incarnation": 1}},
            "ledger": {"version": 1, "total": 3}, "writer": "older"})}})
    wait_for(lambda: len(job.live()) == 2, 30, what="the older workers running")
    before = {n: p["metadata"]["uid"] for n, p in job.pods().items()}
    sup = world["supervisor"](launcher.metadata.name)
    sup.wait_log("horovodrun.started", timeout=30)
    ref = job_ref(world["batch"], ns)
    wait_for(lambda: all(owners(core.read_namespaced_pod(n, ns)) == [ref] for n in before), 10,
             what="the workers re-owned by the Job")
    wait_for(lambda: owners(state(core, ns)) == [ref], 10, what="the state re-owned")
    sup.wait_log("owner.adopted")
    sup.signal(signal.SIGKILL)
    sup.wait_exit(10)
    gc_done(core, ns, launcher)
    assert {n: p["metadata"]["uid"] for n, p in job.pods().items()} == before
    assert json.loads(state(core, ns).data["state.json"])["ledger"]["total"] == 3


def ledger_total(core: client.CoreV1Api, ns: str) -> int:
    return int(json.loads(state(core, ns).data["state.json"])["ledger"].get("total", 0))


def test_an_exit_the_job_retries_leaves_the_workers_to_the_next_launcher(world) -> None:
    core, ns, job = world["core"], world["ns"], world["job"]
    [launcher] = wait_for(lambda: launcher_pods(core, ns), 30, what="the launcher pod")
    # horovodrun exits 1 (a crash of the script): the Job (backoffLimit 6) runs another.
    sup = world["supervisor"](launcher.metadata.name, FAKE_EXIT_AFTER="3", FAKE_EXIT_CODE="1")
    wait_for(lambda: len(job.live()) == 2, 30, what="2 workers")
    before = {n: p["metadata"]["uid"] for n, p in job.pods().items()}
    assert sup.wait_exit(30) == 1
    assert job.live() == sorted(before), "the workers of a retried launcher were deleted"
    assert sup.wait_log("cleanup.skipped")["code"] == 1
    assert not [e for e in sup.logs() if e.get("event") == "cleanup.done"]
    again = world["supervisor"](launcher.metadata.name)
    again.wait_log("horovodrun.started", timeout=30)
    assert {n: p["metadata"]["uid"] for n, p in job.pods().items()} == before
    assert ledger_total(core, ns) == 0


def test_a_terminal_exit_marks_what_it_deletes_so_a_later_launcher_charges_nothing(
        world) -> None:
    core, ns, job = world["core"], world["ns"], world["job"]
    world["batch"].patch_namespaced_job(JOB, ns, {"spec": {"backoffLimit": 0}})  # last attempt
    [launcher] = wait_for(lambda: launcher_pods(core, ns), 30, what="the launcher pod")
    sup = world["supervisor"](launcher.metadata.name, FAKE_EXIT_AFTER="3", FAKE_EXIT_CODE="1")
    workers = wait_for(lambda: len(job.live()) == 2 and job.live(), 30, what="2 workers")
    for name in workers:  # they stay Terminating after the cleanup, as on a slow kubelet
        core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": ["es-test/hold"]}})
    try:
        assert sup.wait_exit(30) == 1
        done = sup.wait_log("cleanup.done")
        assert done["deleted"] == workers and "last attempt" in done["terminal"]
        slots = json.loads(state(core, ns).data["state.json"])["slots"]
        assert {k: v["incarnation"] for k, v in slots.items()} == {"0": 2, "1": 2}
        # A launcher comes after all (the Job was changed, or a person re-ran it) while the
        # deleted workers still terminate: nothing is charged, new incarnations are made.
        world["batch"].patch_namespaced_job(JOB, ns, {"spec": {"backoffLimit": 6}})
        again = world["supervisor"](launcher.metadata.name)
        again.wait_log("horovodrun.started", timeout=30)
        assert sorted(job.live()) == [f"{JOB}-w0-2", f"{JOB}-w1-2"]
        assert ledger_total(core, ns) == 0
        assert not [e for e in again.logs() if e.get("event") == "worker.failed"]
    finally:
        for name in workers:
            core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})


def test_a_warm_standby_exits_0_when_its_leader_ended_the_job_with_success(world) -> None:
    """The manifests' standby overlay (Job parallelism 2): the second launcher waits on the
    Lease; when the leader succeeds, it releases the Lease after recording the success, and the
    standby ends too (exit 0: the Job completes) instead of training the job again."""
    core, ns, job = world["core"], world["ns"], world["job"]
    [launcher] = wait_for(lambda: launcher_pods(core, ns), 30, what="the launcher pod")
    leader = world["supervisor"](launcher.metadata.name, FAKE_EXIT_AFTER="8", FAKE_EXIT_CODE="0")
    leader.wait_log("horovodrun.started", timeout=30)
    standby = world["supervisor"](launcher.metadata.name)
    standby.wait_log("leader.waiting", timeout=30)
    assert leader.wait_exit(30) == 0
    assert leader.wait_log("cleanup.done")["terminal"] == "success"
    assert json.loads(state(core, ns).data["state.json"])["succeeded"] == job_ref(
        world["batch"], ns)[3]
    assert standby.wait_exit(30) == 0
    assert standby.wait_log("leader.job_succeeded")["job"] == JOB
    assert not [e for e in standby.logs() if e.get("event") in (
        "horovodrun.started", "worker.created", "owner.adopted")], "the standby drove the job"
    assert job.live() == [], "no worker made again"
