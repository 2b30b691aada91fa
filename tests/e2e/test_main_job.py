"""The product's promise, end to end on real nodes: the main job of the manifests survives
every failure class a cluster throws at it.

Each test deploys manifests/overlays/local into a namespace of its own on the session's cluster
with real nodes (the launcher and worker images, the manifests' RBAC and policy), lets it train
at full size, injects one fault the way it happens in a cluster, and checks the launcher's exit
code, the target step, that no committed step is lost, that the world size comes back, and the
supervisor's decisions and Events. Victims never host rank 0 (rank 0's step log stays whole) nor
share the launcher's node.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from localcluster.job import JOB
from tests.e2e.jobs import COMMIT_EVERY, Job, check_training, with_policy
from tests.helpers import CLUSTER_NODE_GRACE_S, wait_for

# Long enough (~40 s at full size) that the job outlasts a fault and its replacement's start:
# at world size 1 a step takes ~25 ms, and a replacement needs 5-10 s to join.
STEPS = 800
# Faults found only after the node controller's grace need a job that is still training then.
LONG = 2000
MakeJob = Callable[..., Job]


def training(make_job: MakeJob, **kw: Any) -> Job:
    """A started job, training at full size (world size 2) past step 10."""
    job = make_job(**{"steps": STEPS, **kw})
    job.wait_training(past=10, size=2, timeout=420)
    return job


def test_a_worker_whose_container_is_killed_is_replaced_on_a_real_node(
        make_job: MakeJob) -> None:
    job = training(make_job)
    victim, pod = job.victim()
    before = set(job.workers())
    t0 = time.time()
    job.kill_container(victim)
    job.back_to(2, t0)
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
    replacement = victim[:-1] + "2"  # <job>-w<slot>-<incarnation>
    workers = job.workers()
    assert set(workers) == before | {replacement}
    assert workers[victim]["status"]["containerStatuses"][0]["state"]["terminated"][
        "exitCode"] == 137, "the kubelet reported the container's real exit code"
    assert workers[replacement]["status"]["podIP"] != pod["status"]["podIP"]
    check_training(job.records(), STEPS, final_size=2)
    reasons = job.reasons()
    assert reasons.count("WorkerCreated") == 3 and "WorkerRestarting" in reasons
    assert any(f"worker {victim} (slot " in n and "ExitCode 137" in n
               for n in job.notes("WorkerRestarting"))


def test_an_exit_code_the_policy_ignores_drops_the_worker_and_training_goes_on_smaller(
        make_job: MakeJob) -> None:
    def ignore_137(policy: dict[str, Any]) -> None:
        policy["faultTolerantPolicy"].insert(0, {"exitCodes": "137", "action": "Ignore"})

    job = make_job(steps=STEPS, transform=with_policy(ignore_137))
    job.wait_training(past=10, size=2, timeout=420)
    victim, _ = job.victim()
    t0 = time.time()
    job.kill_container(victim)
    job.wait("a reset to world size 1", job.reset_after(t0, 1), 180)
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Ignore")
    assert d["rule"].startswith("faultTolerantPolicy[0]"), d["rule"]
    check_training(job.records(), STEPS, final_size=1)
    assert len(job.workers()) == 2, "nothing was created for the dropped worker"
    assert "WorkerDropped" in job.reasons() and "WorkerRestarting" not in job.reasons()


def test_a_force_deleted_worker_pod_is_replaced(make_job: MakeJob) -> None:
    job = training(make_job)
    victim, _ = job.victim()
    t0 = time.time()
    job.force_delete(victim)
    job.back_to(2, t0)
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["action"]) == ("PodForceDeleted", "Restart")
    assert victim not in job.workers()
    assert job.workers()[victim[:-1] + "2"]["status"]["phase"] == "Running"
    check_training(job.records(), STEPS, final_size=2)


def test_an_evicted_worker_is_replaced(make_job: MakeJob) -> None:
    job = training(make_job)
    victim, _ = job.victim()
    t0 = time.time()
    job.evict(victim)
    job.back_to(2, t0)
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["action"]) == ("Evicted", "Restart"), d
    assert "EvictionByEvictionAPI" in d["detail"]
    check_training(job.records(), STEPS, final_size=2)


def test_a_frozen_node_is_found_its_worker_fenced_and_replaced_on_another_node(
        make_job: MakeJob) -> None:
    """The hang Horovod alone never leaves: the frozen worker's TCP connections stay open (its
    kernel answers), its ssh session never ends, its kubelet is frozen too."""
    job = training(make_job, steps=LONG)
    victim, pod = job.victim()
    node = job.cluster.node(pod["spec"]["nodeName"])
    t0 = time.time()
    node.freeze()
    try:
        job.back_to(2, t0, timeout=CLUSTER_NODE_GRACE_S + 240)
    finally:
        node.thaw()
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    # Its heartbeats stop: Hung seconds before the node controller marks the node NotReady.
    assert (d["cause"], d["action"]) == ("Hung", "Restart"), d
    assert job.ssh_killed(victim), "horovodrun's ssh client to the frozen worker was killed"
    # The survivor left the collective the frozen worker held (the hook's fence), instead of
    # waiting for the Gloo timeout.
    severed = [json.loads(m) for m in re.findall(r'\{"event": "fence\.severed".*?\}',
                                                 job.text())]
    assert len(severed) == 1 and severed[0]["connections"] >= 1, severed
    assert severed[0]["host"] != pod["status"]["podIP"], "cut by the survivor"
    assert victim not in job.workers(), "the stranded pod was force-deleted"
    # The replacement prefers other nodes (the one that hung is suspect), but the frozen node
    # still says Ready and the scheduler may bind it there (here the other worker node holds
    # the survivor, which the template's spreading also avoids): then it never starts, and is
    # replaced again once the node controller marks the node NotReady. Either way the worker
    # that trains at the end of the job runs on another node.
    slot = victim[:-1]
    final = [p for n, p in job.workers().items() if n.startswith(slot)
             and p["status"].get("phase") in ("Running", "Succeeded")]
    assert final and all(p["spec"]["nodeName"] != node.name for p in final), final
    on_frozen = job.workers().get(slot + "2")
    if on_frozen is not None and on_frozen["spec"]["nodeName"] == node.name:
        assert job.decision(slot + "2")["cause"] == "NodeNotReady"
    check_training(job.records(), LONG, final_size=2)


def test_a_node_whose_kubelet_stopped_loses_its_worker_to_a_replacement(
        make_job: MakeJob) -> None:
    """The node controller marks the node NotReady after its grace (real 10 s Lease
    renewals); the worker still runs (no kubelet to stop it), so the supervisor must cut it
    off: its ssh client killed, its pod force-deleted, a replacement elsewhere."""
    job = training(make_job, steps=LONG)
    victim, pod = job.victim()
    node = job.cluster.node(pod["spec"]["nodeName"])
    t0 = time.time()
    node.stop_kubelet()
    try:
        job.back_to(2, t0, timeout=CLUSTER_NODE_GRACE_S + 240)
    finally:
        node.start_kubelet()
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["action"]) == ("NodeNotReady", "Restart"), d
    assert job.workers()[victim[:-1] + "2"]["spec"]["nodeName"] != node.name
    check_training(job.records(), LONG, final_size=2)


def guaranteed_workers(memory: str) -> Callable[[list[dict[str, Any]]], None]:
    """Workers of QoS class Guaranteed (limits = requests) with this much memory: the kubelet
    then asks for oom_score_adj -997, which containerd raises to its own (0), so a process
    started in the container later (kubectl exec) is not the OOM killer's first choice, as it
    is in a Burstable pod (adj ~940 here)."""
    def transform(docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            if doc["kind"] == "ConfigMap" and "worker-template.yaml" in (doc.get("data") or {}):
                template = yaml.safe_load(doc["data"]["worker-template.yaml"])
                resources = template["spec"]["containers"][0].setdefault("resources", {})
                requests = resources.setdefault("requests", {})
                requests["memory"] = memory
                requests.setdefault("cpu", "1")
                resources["limits"] = dict(requests)
                doc["data"]["worker-template.yaml"] = yaml.safe_dump(template)
    return transform


def test_a_training_process_oom_killed_inside_its_running_pod_is_replaced(
        make_job: MakeJob) -> None:
    """The kernel's OOM killer, enforcing the container's memory limit, kills the training
    process, not the container (sshd, its PID 1, lives on): the pod stays Running and Ready,
    and Horovod never uses that host again. horovodrun's driver saw the process fail: the
    supervisor replaces the pod."""
    job = make_job(steps=LONG, transform=guaranteed_workers("1536Mi"))
    job.wait_training(past=10, size=2, timeout=420)
    victim, pod = job.victim()
    training = job.processes(victim, lambda argv: any(a.endswith("train.py") for a in argv))
    assert training, "the training process in the victim's container"
    # It goes first when the container runs out of memory: the OOM killer's score is the
    # process's memory plus adj/1000 of the limit, 1000 here (the host may raise a score, not
    # lower one: this sandbox lacks CAP_SYS_RESOURCE).
    for pid in training:
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
    # Something else in the container asks for more than the limit leaves beside the training
    # process, and fits once it is gone: the limit less half of the training process's memory
    # (torch alone is ~250 MB). Its score (that size, adj 0) is below the training process's
    # (its memory + the whole limit).
    rss_mib = max(int(next(line.split()[1] for line in
                           Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:"))) for pid in training) >> 10
    hog_mib = 1536 - rss_mib // 2
    hog_cmd = f"import time; time.sleep(5); b = b'x' * ({hog_mib} * 2**20); time.sleep(30)"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        exec_ = pool.submit(job.kubectl, "exec", victim, "--", "python", "-c", hog_cmd,
                            check=False, timeout=120)
        hogs = wait_for(lambda: job.processes(victim, lambda argv: hog_cmd in argv), 30,
                        what="the hog in the victim's container")
        adj = {int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in hogs}
        assert adj and max(adj) < 1000, f"the hog would be picked first: oom_score_adj {adj}"
        t0 = time.time()
        job.back_to(2, t0)
        hog = exec_.result()
    assert job.wait_exit(400) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["action"]) == ("ExitCode", "Restart"), d
    assert "its training process" in d["detail"] and "the pod still runs" in d["detail"], d
    assert [e["pod"] for e in job.logs("worker.process_exited")] == [victim]
    assert "WorkerProcessExited" in job.reasons()
    assert victim not in job.live_workers(), "the idle pod was deleted"
    assert job.workers()[victim[:-1] + "2"]["status"]["podIP"] != pod["status"]["podIP"]
    check_training(job.records(), LONG, final_size=2)
    # The kernel killed it (the OOM killer of the container's memory cgroup), not the test; it
    # may kill the hog too, milliseconds later, before the first one's memory is released.
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    killed = [line for line in kernel.splitlines() if "Memory cgroup out of memory: Killed "
              "process" in line and any(f"process {pid} (" in line for pid in training)]
    assert killed, f"no OOM kill of {training} in the kernel's log (hog: {hog.returncode})"


def test_scale_out_and_in_while_training(make_job: MakeJob) -> None:
    job = training(make_job, steps=STEPS + 100)
    t0 = time.time()
    job.scale(3)
    job.wait("training at world size 3", job.reset_after(t0, 3), 300)
    assert len(job.live_workers()) == 3
    t1 = time.time()
    job.scale(2)
    job.wait("training back at world size 2", job.reset_after(t1, 2), 180)
    assert job.wait_exit(300) == 0, job.tail()

    removed = job.logs("scale.worker_removed")
    assert [r["pod"] for r in removed] == [f"{JOB}-w2-1"], removed
    assert removed[0]["ssh_clients_left"] == 0, "deleted only after horovodrun let it go"
    assert job.logs("worker.failed") == [], "a scale-in is never taken for a failure"
    check_training(job.records(), STEPS + 100, final_size=2)
    reasons = job.reasons()
    assert reasons.count("Scaled") == 2 and "WorkerRemoved" in reasons


def test_repeated_failures_exhaust_the_restart_limit_and_fail_the_job_below_min_np(
        make_job: MakeJob) -> None:
    def limit_one(policy: dict[str, Any]) -> None:
        policy["restartLimit"] = 1
        policy["disruptionsFree"] = False

    job = make_job(steps=100_000, transform=with_policy(limit_one),
                   env={"SUPERVISOR_MIN_WORKERS": "2", "SUPERVISOR_SHUTDOWN_GRACE_SECONDS": "10"})
    job.wait_training(past=10, size=2, timeout=420)
    first, _ = job.victim()
    t0 = time.time()
    job.kill_container(first)
    job.back_to(2, t0)
    second, _ = job.victim()
    t1 = time.time()
    job.kill_container(second)
    assert job.wait_exit(90) == 6, job.tail()
    assert time.time() - t1 < 90

    assert job.decision(first)["action"] == "Restart"
    refused = job.decision(second)
    assert refused["refused"] and "restart limit" in refused["refused"], refused
    assert [f["code"] for f in job.logs("job.failing")] == [6]
    events = job.events()
    assert any(e["reason"] == "RestartRefused" and e["type"] == "Warning" for e in events)
    assert any(e["reason"] == "JobFailing" and e["type"] == "Warning" for e in events)
    # The Job's podFailurePolicy turns exit 6 into FailJob: no second launcher.
    batch = client.BatchV1Api(job.api)
    failed = job.wait("the Job failed", lambda: any(
        c.type == "Failed" and c.status == "True"
        for c in batch.read_namespaced_job(JOB, job.namespace).status.conditions or ()), 60,
        after_exit=True)
    assert failed and len(job.launchers()) == 1


def test_a_killed_supervisor_is_replaced_by_the_job_and_goes_on_with_the_same_budgets(
        make_job: MakeJob, tmp_path: Path) -> None:
    job = training(make_job, checkpoint=tmp_path / "checkpoint")
    victim, _ = job.victim()
    t0 = time.time()
    job.kill_container(victim)
    job.back_to(2, t0)
    job.wait_training(past=(job.last_step() or {"step": 0})["step"] + COMMIT_EVERY, size=2)
    workers = sorted(job.live_workers())
    assert job.state()["ledger"]["total"] == 1
    first_launcher = job.launcher()
    assert first_launcher is not None

    killed_at = (job.last_step() or {"step": 0})["step"]
    pids = job.processes(first_launcher["metadata"]["name"],
                         lambda argv: any("elastic-supervisor" in a for a in argv[:2]))
    assert pids, "the supervisor process in the launcher container"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # PID 1 of the container: it ends with 137
    job.wait("a second launcher pod", lambda: len(job.launchers()) == 2, 120, after_exit=True)
    assert job.wait_exit(600) == 0, job.tail()

    assert sorted(job.live_workers()) == workers, "the same workers, no duplicates"
    assert len(job.workers()) == 3  # 2 live + the killed first incarnation
    assert job.state()["ledger"]["total"] == 1, "the budget used before the restart is kept"
    resumed = [r for r in job.records() if r.get("event") == "resumed"]
    assert len(resumed) == 1 and killed_at - resumed[0]["step"] <= COMMIT_EVERY, resumed
    check_training(job.records(), STEPS, final_size=2)
