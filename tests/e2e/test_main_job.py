"""The product's promise, end to end on real nodes: the main job of the manifests survives
every failure class a cluster throws at it.

`TestMainTour` deploys manifests/overlays/local once (the launcher and worker images, the
manifests' RBAC and policy) on the session's cluster with real nodes, and throws one fault after
the other at it: a killed container, a force delete, an eviction, an OOM kill inside a running
pod, a scale-out and scale-in, a frozen node, a stopped kubelet, a SIGKILLed supervisor. Each test
is one fault with all of its own assertions: the supervisor's decision and Event, the fencing
where there is one, back at full size within a bound, no committed step lost and at most
COMMIT_EVERY computed again (on what happened so far), one live pod per slot. The tour ends the
training through the stop file and checks the whole run. Victims never host rank 0 (rank 0's
step log stays whole) nor share the launcher's node.

Two faults have jobs of their own: an exit code the policy ignores (one worker fewer for the rest
of the job), and a restart limit used up (it ends the job).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.job import JOB, REPO
from localcluster.nodes import Cluster
from supervisor import hostkeys, timeline_png
from supervisor.hook.elastic_supervisor_hook.owner import OWNER_ENV
from supervisor.leader import lease_name
from tests.e2e.jobs import (
    COMMIT_EVERY,
    Job,
    alone_on_its_node,
    check_steps,
    check_training,
    compose,
    edit_worker_template,
    evicted_leaves_gracefully,
    left_gracefully,
    main_job,
    no_restart_since,
    one_live_pod_per_slot,
    process_env,
    tour_budgets,
    with_policy,
)
from tests.helpers import CLUSTER_NODE_GRACE_S, wait_for
from tests.integration.harness import scrape

# The tour trains until its last fault is checked, then stops through the stop file: this is
# only a bound no tour reaches.
STEPS = 1_000_000
METRICS_PORT = 9400  # the manifests' SUPERVISOR_METRICS_PORT, on the launcher pod's IP
# Seconds from a fault to training back at full size. A process's death is seen at once and a
# replacement joins in 5-10 s; a frozen node is found by its silence (~3 s); a stopped kubelet
# only after the node controller's grace and the tour's SUPERVISOR_NODE_GRACE_SECONDS.
BACK_S = 60
NODE_GRACE_S = 2  # the tour's SUPERVISOR_NODE_GRACE_SECONDS: the node controller's comes first
BACK_AFTER_NODE_LOSS_S = CLUSTER_NODE_GRACE_S + NODE_GRACE_S + BACK_S
OOM_LIMIT_MIB = 1536


def guaranteed_workers(memory: str) -> Callable[[list[dict[str, Any]]], None]:
    """Workers of QoS class Guaranteed (limits = requests) with this much memory: the kubelet
    then asks for oom_score_adj -997, which containerd raises to its own (0), so a process
    started in the container later (kubectl exec) is not the OOM killer's first choice, as it
    is in a Burstable pod (adj ~940 here)."""
    def change(template: dict[str, Any]) -> None:
        resources = template["spec"]["containers"][0].setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        requests["memory"] = memory
        requests.setdefault("cpu", "1")
        resources["limits"] = dict(requests)
    return lambda docs: edit_worker_template(docs, change)


@pytest.fixture(scope="class")
def tour(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    out = tmp_path_factory.mktemp("main-tour")
    with main_job(cluster, cluster_api, out, steps=STEPS, checkpoint=out / "checkpoint",
                  transform=compose(guaranteed_workers(f"{OOM_LIMIT_MIB}Mi"),
                                    with_policy(tour_budgets)),
                  env={"SUPERVISOR_NODE_GRACE_SECONDS": str(NODE_GRACE_S)}) as job:
        job.wait_training(past=10, size=2, timeout=420)
        yield job


def node_state(job: Job, name: str) -> tuple[str | None, set[str]]:
    """A node's Ready status and the keys of its node.kubernetes.io/ taints."""
    node = job.core.read_node(name)
    ready = next((c.status for c in node.status.conditions or () if c.type == "Ready"), None)
    return ready, {t.key for t in node.spec.taints or ()
                   if t.key.startswith("node.kubernetes.io/")}


def back_within(job: Job, t0: float, size: int, bound: float) -> float:
    """Wait for training back at world size `size` after the fault at `t0`, by an elastic
    reset (horovodrun never restarted); assert it took at most `bound` seconds, return how long
    it took."""
    first = job.back_to(size, t0, timeout=bound + 60)
    took = float(first["time"]) - t0
    assert took <= bound, f"back at world size {size} {took:.1f}s after the fault (> {bound}s)"
    no_restart_since(job, t0)
    return took



def counted(job: Job, reason: str, at_least: int) -> None:
    """Wait for the Event `reason` to be posted at least `at_least` times (Events trail the
    decisions by the recorder's batching)."""
    job.wait(f"{at_least} Events {reason}", lambda: job.reasons().count(reason) >= at_least, 30)


@pytest.mark.tour
class TestMainTour:
    def test_a_node_whose_kubelet_stopped_loses_its_worker_to_a_replacement(
            self, tour: Job) -> None:
        """The node controller marks the node NotReady (Unknown, tainted unreachable) after its
        grace, not before (the kubelets renew their Leases every 10 s); the worker still runs
        (no kubelet to stop it), so the supervisor must cut it off: its ssh client killed, its
        pod force-deleted, a replacement elsewhere. Started again, the kubelet brings the node
        back Ready and untainted."""
        job = tour
        job.settled(2)
        victim, pod = job.victim()
        alone_on_its_node(job, pod)
        node = job.cluster.node(pod["spec"]["nodeName"])
        t0 = time.time()
        job.silence_node(node)
        node.stop_kubelet()
        try:
            back_within(job, t0, 2, BACK_AFTER_NODE_LOSS_S)
            ready, taints = node_state(job, node.name)
            assert ready == "Unknown" and "node.kubernetes.io/unreachable" in taints, (
                ready, taints)
            [cond] = [c for c in job.core.read_node(node.name).status.conditions
                      if c.type == "Ready"]
            went = cond.last_transition_time.timestamp() - t0
            assert went >= CLUSTER_NODE_GRACE_S - 11, f"NotReady {went:.1f}s after the stop"
        finally:
            node.start_kubelet()

        d = job.decision(victim)
        assert (d["cause"], d["action"]) == ("NodeNotReady", "Restart"), d
        # Its ssh session is cut either way: by Horovod itself once the NotReady host left the
        # discovery file (it regroups without it), or by the supervisor's fence.
        assert victim not in job.live_workers(), "the lost pod was force-deleted"
        assert job.workers()[job.successor(victim)]["spec"]["nodeName"] != node.name
        one_live_pod_per_slot(job)
        check_steps(job.records())

        job.wait(f"{node.name} Ready and untainted again", lambda: node_state(job, node.name)
                 == ("True", set()), 60)

    def test_the_hook_key_is_on_no_command_line_and_in_no_environment(self, tour: Job) -> None:
        """Issue 27, item 10: the hook channel's key comes from the job's Secret file; Horovod
        writes horovodrun's environment onto every ssh command line, and that carries only the
        file's path now. And those ssh clients check the workers' pinned host key."""
        job = tour
        job.settled(2)
        key = (REPO / "manifests" / "base" / "ssh" / "hook.key").read_text().strip()
        launcher = job.launcher()
        assert launcher is not None
        pods = [launcher["metadata"]["name"], *job.live_workers()]
        lines, leaks = [], []
        for pod in pods:
            for pid in job.processes(pod, lambda argv: True):
                for part in ("cmdline", "environ"):
                    with contextlib.suppress(OSError):
                        text = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
                        if key in text:
                            leaks.append((pod, pid, part))
                        if part == "cmdline" and "ELASTIC_SUPERVISOR_HOOK_KEY_FILE=" in text:
                            lines.append((pod, pid))
        assert not leaks, f"the hook key is readable in {leaks}"
        assert lines, "no ssh command line of horovodrun's found: the check saw nothing"
        # The same ssh clients check the workers' host key against the job's pinned one.
        ssh = []
        for pid in job.processes(pods[0], lambda argv: bool(argv) and Path(argv[0]).name == "ssh"):
            with contextlib.suppress(OSError):
                ssh.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"))
        assert ssh, "no ssh client in the launcher"
        for argv in ssh:
            assert "StrictHostKeyChecking=yes" in argv, argv
            assert "UserKnownHostsFile=/etc/edl/hostfile.known_hosts" in argv, argv
            assert "StrictHostKeyChecking=no" not in argv, argv
        # Issue 39, item 9: each worker its own host key, its address pinned to that key only
        # (SUPERVISOR_SSH_HOST_KEYS=worker): the file the launcher's ssh reads, one line per
        # listed worker, `[IP]:2222 <the key its pod shows>`, the key of its own Secret.
        workers = job.workers()
        want = sorted(f"[{workers[w]['status']['podIP']}]:2222 "
                      f"{workers[w]['metadata']['annotations'][hostkeys.ANNOTATION]}"
                      for w in job.live_workers())
        in_launcher = job.processes(pods[0], lambda argv: bool(argv) and argv[0] != "/pause")
        known = Path(f"/proc/{in_launcher[0]}/root"
                     "/etc/edl/hostfile.known_hosts")
        assert sorted(known.read_text().splitlines()) == want
        assert len({line.split()[-1] for line in want}) == len(want), "one key per worker"

    def test_a_worker_whose_container_is_killed_is_replaced_on_a_real_node(
            self, tour: Job) -> None:
        job = tour
        job.settled(2)
        victim, pod = job.victim()
        created = job.reasons().count("WorkerCreated")
        t0 = time.time()
        job.kill_container(victim)
        back_within(job, t0, 2, BACK_S)

        d = job.decision(victim)
        assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
        replacement = job.successor(victim)
        live = job.live_workers()
        assert replacement in live and victim not in live, sorted(live)
        assert job.workers()[victim]["status"]["containerStatuses"][0]["state"]["terminated"][
            "exitCode"] == 137, "the kubelet reported the container's real exit code"
        assert live[replacement]["status"]["podIP"] != pod["status"]["podIP"]
        counted(job, "WorkerCreated", created + 1)
        assert any(f"worker {victim} (slot " in n and "ExitCode 137" in n
                   for n in job.notes("WorkerRestarting"))
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_a_force_deleted_worker_is_replaced(self, tour: Job) -> None:
        job = tour
        job.settled(2)
        victim, _ = job.victim()
        t0 = time.time()
        job.force_delete(victim)
        back_within(job, t0, 2, BACK_S)

        d = job.decision(victim)
        assert (d["cause"], d["action"]) == ("PodForceDeleted", "Restart"), d
        assert "deleted with grace period 0" in d["detail"], d
        assert victim not in job.workers(), "gone from the API at once"
        assert job.live_workers()[job.successor(victim)]["status"]["phase"] == "Running"
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_a_worker_evicted_through_the_eviction_api_leaves_without_losing_a_step(
            self, tour: Job) -> None:
        """Issue 24: an eviction is announced, not a crash. The worker leaves the discovery
        file, its entrypoint holds SIGTERM until Horovod let it go at its next step's host
        check, the survivors go on without a rollback, and a replacement joins."""
        evicted_leaves_gracefully(tour)

    def test_a_drained_node_loses_its_workers_gracefully_to_other_nodes(
            self, tour: Job) -> None:
        """`kubectl drain` as an operator runs it (cordon, then the Eviction API, waiting for
        the pods to be gone): every worker on the node leaves gracefully (when the node holds
        both, one stays until the other's replacement joined: Horovod needs a member of the
        last world, and the PodDisruptionBudget holds the second eviction back meanwhile),
        the drain ends once Horovod let them go, their replacements run on other nodes."""
        job = tour
        job.settled(2)
        _, pod = job.victim()
        node = pod["spec"]["nodeName"]
        on_node = sorted(n for n, p in job.live_workers().items()
                         if p["spec"]["nodeName"] == node)
        t0 = time.time()
        try:
            drained = job.drain(node)
            took = time.time() - t0
            evicting = {line.rsplit("/", 1)[-1] for line in drained.stdout.splitlines()
                        if line.startswith("evicting pod ")}
            # (and the node's terminated worker pods, kept for their logs)
            assert set(on_node) <= evicting and f"node/{node} drained" in drained.stdout, \
                drained.stdout
            print(f"kubectl drain {node} ({len(on_node)} workers): {took:.1f}s")
            # The cordon comes first, the eviction a few ms later: either is seen first.
            left_gracefully(job, on_node, t0, "NodeCordoned", "Evicted")
            for victim in on_node:
                assert job.live_workers()[job.successor(victim)]["spec"]["nodeName"] != node
        finally:
            job.kubectl("uncordon", node, namespaced=False)

    def test_a_training_process_oom_killed_inside_its_running_pod_is_replaced(
            self, tour: Job) -> None:
        """The kernel's OOM killer, enforcing the container's memory limit, kills the training
        process, not the container (sshd, its PID 1, lives on): the pod stays Running and
        Ready, and Horovod never uses that host again. horovodrun's driver saw the process
        fail: the supervisor replaces the pod."""
        job = tour
        job.settled(2)
        exited = job.reasons().count("WorkerProcessExited")
        victim, pod = job.victim()
        training = job.processes(victim, lambda argv: any(a.endswith("train.py") for a in argv))
        assert training, "the training process in the victim's container"
        # It goes first when the container runs out of memory: the OOM killer's score is the
        # process's memory plus adj/1000 of the limit, 1000 here (the host may raise a score,
        # not lower one: this sandbox lacks CAP_SYS_RESOURCE).
        for pid in training:
            Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
        # Something else in the container asks for more than the limit leaves beside the
        # training process, and fits once it is gone: the limit less half of the training
        # process's memory (torch alone is ~250 MB). Its score (that size, adj 0) is below the
        # training process's (its memory + the whole limit).
        rss_mib = max(int(next(line.split()[1] for line in
                               Path(f"/proc/{pid}/status").read_text().splitlines()
                               if line.startswith("VmRSS:"))) for pid in training) >> 10
        hog_mib = OOM_LIMIT_MIB - rss_mib // 2
        hog_cmd = f"import time; time.sleep(5); b = b'x' * ({hog_mib} * 2**20); time.sleep(30)"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            exec_ = pool.submit(job.kubectl, "exec", victim, "--", "python", "-c", hog_cmd,
                                check=False, timeout=120)
            hogs = wait_for(lambda: job.processes(victim, lambda argv: hog_cmd in argv), 30,
                            what="the hog in the victim's container")
            adj = {int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in hogs}
            assert adj and max(adj) < 1000, f"the hog would be picked first: oom_score_adj {adj}"
            t0 = time.time()
            back_within(job, t0, 2, BACK_S)
            hog = exec_.result()

        d = job.decision(victim)
        assert (d["cause"], d["action"]) == ("ExitCode", "Restart"), d
        assert "its training process" in d["detail"] and "the pod still runs" in d["detail"], d
        assert [e["pod"] for e in job.logs_since("worker.process_exited", t0)] == [victim]
        counted(job, "WorkerProcessExited", exited + 1)
        assert victim not in job.live_workers(), "the idle pod was deleted"
        assert job.workers()[job.successor(victim)]["status"]["podIP"] != pod["status"]["podIP"]
        # The kernel killed it (the OOM killer of the container's memory cgroup), not the test;
        # it may kill the hog too, milliseconds later, before the first one's memory is freed.
        kernel = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
        killed = [line for line in kernel.splitlines() if "Memory cgroup out of memory: Killed "
                  "process" in line and any(f"process {pid} (" in line for pid in training)]
        assert killed, f"no OOM kill of {training} in the kernel's log (hog: {hog.returncode})"
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_scale_out_and_in_while_training(self, tour: Job) -> None:
        job = tour
        job.settled(2)
        reasons = job.reasons()
        scaled, removed_before = reasons.count("Scaled"), reasons.count("WorkerRemoved")
        t0 = time.time()
        job.scale(3)
        back_within(job, t0, 3, BACK_S)
        assert len(job.live_workers()) == 3
        t1 = time.time()
        job.scale(2)
        back_within(job, t1, 2, BACK_S)

        # The scaled-in pod is deleted only once horovodrun let it go, seconds after the reset.
        removed = job.wait("the scaled-in worker removed",
                           lambda: job.logs_since("scale.worker_removed", t1), 60)
        assert [r["pod"] for r in removed] == [f"{JOB}-w2-1"], removed
        assert removed[0]["ssh_clients_left"] == 0, "deleted only after horovodrun let it go"
        assert job.logs_since("worker.failed", t0) == [], "a scale-in is never taken for a failure"
        counted(job, "Scaled", scaled + 2)
        counted(job, "WorkerRemoved", removed_before + 1)
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_a_frozen_node_is_found_its_worker_fenced_and_replaced_on_another_node(
            self, tour: Job) -> None:
        """The hang Horovod alone never leaves: the frozen worker's TCP connections stay open
        (its kernel answers), its ssh session never ends, its kubelet is frozen too."""
        job = tour
        job.settled(2)
        victim, pod = job.victim()
        alone_on_its_node(job, pod)
        node = job.cluster.node(pod["spec"]["nodeName"])
        severed_before = len(severed(job))
        t0 = time.time()
        job.silence_node(node)
        node.freeze()
        try:
            # The frozen node still says Ready: a replacement bound there is replaced again
            # only once the node controller marks it NotReady.
            back_within(job, t0, 2, BACK_AFTER_NODE_LOSS_S)
        finally:
            node.thaw()

        d = job.decision(victim)
        # Its heartbeats stop: Hung seconds before the node controller marks it NotReady.
        assert (d["cause"], d["action"]) == ("Hung", "Restart"), d
        assert job.ssh_killed(victim), "horovodrun's ssh client to the frozen worker was killed"
        # The survivor left the collective the frozen worker held (the hook's fence), instead
        # of waiting for the Gloo timeout.
        cut = severed(job)[severed_before:]
        assert len(cut) == 1 and cut[0]["connections"] >= 1, cut
        assert cut[0]["host"] != pod["status"]["podIP"], "cut by the survivor"
        # Deleted with a grace its kubelet honours (issue 27, item 4): gone once the thawed
        # kubelet killed it. Its replacement waited for that at most 10 s, then was kept off
        # the frozen node; either way the slot's worker that trains now runs on another node.
        job.wait("the hung pod gone once its node thawed", lambda: victim not in job.workers(),
                 30)
        slot = victim.rsplit("-", 1)[0]
        final = [p for n, p in job.live_workers().items() if n.startswith(f"{slot}-")]
        assert final and all(p["spec"]["nodeName"] != node.name for p in final), final
        first = job.workers().get(job.successor(victim))
        if first is not None and first["spec"]["nodeName"] == node.name:
            assert job.decision(job.successor(victim))["cause"] == "NodeNotReady"
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_status_metrics_and_the_timeline_show_the_progress_and_each_incident(
            self, tour: Job, tmp_path: Path) -> None:
        """After the tour's faults (issue 26): the step the hook counted from rank 0 is the
        step the script printed, the goodput is below 1, every failure decided is an incident
        with its phases, the metrics carry the phase histograms, and `timeline` draws one
        label per incident on integer world ticks."""
        job = tour
        job.settled(2)
        s = job.status_as_printed()
        p = s["progress"]
        assert p["world"] == p["desired"] == 2 and p["training"] and p["rate"] > 0, p
        assert 0 < p["goodput"] <= p["goodput_any"] <= 1 and p["goodput"] < 1, p
        # Both grow (how they compare depends on how close the tour's faults came: a tour of
        # ten faults in three minutes has lost more than it trained)
        assert p["lost_ws"] > 0 and p["productive_ws"] > 0, p

        found = s["incidents"]
        by_pod = {pod: i for i in found for pod in i["pods"]}
        failed = job.logs("worker.failed")
        assert failed and all(e["pod"] in by_pod for e in failed), (failed, found)
        assert {"NodeNotReady", "ExitCode", "PodForceDeleted", "Hung", "ScaleOut",
                "ScaleIn"} <= {i["cause"] for i in found}, found
        assert {"leave", "scale", "failure"} <= {i["kind"] for i in found}, found
        for i in found:
            if not i["open"]:
                ph = i["phases"]
                assert min(ph.values()) == ph["detected"] and max(ph.values()) == ph["full"], i
        frozen = by_pod[[e for e in failed if e["cause"] == "Hung"][-1]["pod"]]
        assert frozen["cause"] == "Hung" and not frozen["open"], frozen
        assert set(frozen["phases"]) == {"detected", "fenced", "resumed", "created",
                                         "scheduled", "started", "joined", "full"}, frozen
        text = job.cli("status")
        assert "PROGRESS: step " in text and "goodput " in text, text
        assert "LAST INCIDENT #" in text, text

        launcher = job.launcher()
        assert launcher is not None
        m = scrape(METRICS_PORT, launcher["status"]["podIP"])
        full = [v for k, v in m.items() if k.startswith(
            "elastic_supervisor_incident_phase_seconds_count{") and 'phase="full"' in k]
        assert sum(full) >= len([i for i in found if not i["open"]]) - 1 > 0, full
        assert any(k.startswith("elastic_supervisor_incident_phase_seconds_bucket{") for k in m)
        assert m["elastic_supervisor_training_steps_total"] > 0
        assert 0 < m['elastic_supervisor_goodput_ratio{of="full"}'] < 1

        png = tmp_path / "timeline.png"
        job.cli("timeline", "-o", str(png))
        drawn = json.loads(timeline_png.read_png_text(png)[timeline_png.METADATA_KEY])
        ticks = drawn["world_ticks"]
        assert ticks and all(t.isdigit() for t in ticks) and "2" in ticks, ticks
        labels = drawn["labels"]
        state = job.state()
        assert len(labels) == len(state["incidents"]), (labels, state)  # one per incident

    def test_a_killed_supervisor_is_replaced_by_the_job_and_goes_on_with_the_same_budgets(
            self, tour: Job) -> None:
        job = tour
        job.settled(2)
        job.wait_training(past=(job.last_step() or {"step": 0})["step"] + COMMIT_EVERY, size=2)
        workers = sorted(job.live_workers())
        used = job.state()["ledger"]["total"]
        assert used >= 1, "the faults before were counted"
        first_launcher = job.launcher()
        assert first_launcher is not None and len(job.launchers()) == 1

        killed_at = (job.last_step() or {"step": 0})["step"]
        pids = job.supervisors(first_launcher["metadata"]["name"])
        assert pids, "the supervisor process in the launcher container"
        t0 = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # PID 1 of the container: it ends with 137
        job.wait("a second launcher pod", lambda: len(job.launchers()) == 2, 120,
                 after_exit=True)
        # Steps the old run printed in the milliseconds between t0 and the kill also come after
        # t0: training again means after the new run resumed.
        def resumed() -> list[dict[str, Any]]:
            return [r for r in job.records() if r.get("event") == "resumed" and r["time"] > t0]

        job.wait("training again after the takeover", lambda: resumed() and any(
            s["time"] > resumed()[0]["time"] and s["size"] == 2 for s in job.steps()), 240)

        assert sorted(job.live_workers()) == workers, "the same workers, no duplicates"
        # The new leader's term (the Lease's transitions) is in every training process of its
        # run, and nothing of an older term trains on any worker (hook owner.py).
        lease = client.CoordinationV1Api(job.api).read_namespaced_lease(
            lease_name(JOB), job.namespace)
        term = f"{lease.metadata.uid}.{lease.spec.lease_transitions}"
        assert lease.spec.lease_transitions >= 1, "the second launcher took the Lease over"
        for pod in workers:
            trainers = job.processes(pod, lambda argv: any(a.endswith("train.py") for a in argv))
            assert trainers and {process_env(pid).get(OWNER_ENV) for pid in trainers} == {
                term}, (pod, [process_env(pid).get(OWNER_ENV) for pid in trainers])
        assert job.state()["ledger"]["total"] == used, "the budget used before is kept"
        again = resumed()
        assert len(again) == 1 and killed_at - again[0]["step"] <= COMMIT_EVERY, again
        one_live_pod_per_slot(job)
        check_steps(job.records())

    def test_the_tour_ends_training_through_the_stop_file_with_exit_0(self, tour: Job) -> None:
        job = tour
        target = job.stop_at()
        assert job.wait_exit(300) == 0, job.tail()
        check_training(job.records(), target, final_size=2)


def severed(job: Job) -> list[dict[str, Any]]:
    """The hook's fence.severed lines (a survivor cut its connections to a failed peer)."""
    return [json.loads(m) for m in re.findall(r'\{"event": "fence\.severed".*?\}', job.text())]


# ---- jobs of their own: a dropped worker, a restart limit used up ---------------------------

def test_an_exit_code_the_policy_ignores_drops_the_worker_and_training_goes_on_smaller(
        make_job: Callable[..., Job], tmp_path: Path) -> None:
    def ignore_137(policy: dict[str, Any]) -> None:
        policy["faultTolerantPolicy"].insert(0, {"exitCodes": "137", "action": "Ignore"})

    job = make_job(steps=STEPS, checkpoint=tmp_path / "checkpoint",
                   transform=with_policy(ignore_137))
    job.wait_training(past=10, size=2, timeout=420)
    victim, _ = job.victim()
    t0 = time.time()
    job.kill_container(victim)
    back_within(job, t0, 1, BACK_S)
    target = job.stop_at()
    assert job.wait_exit(300) == 0, job.tail()

    d = job.decision(victim)
    assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Ignore")
    assert d["rule"].startswith("faultTolerantPolicy[0]"), d["rule"]
    check_training(job.records(), target, final_size=1)
    assert len(job.workers()) == 2, "nothing was created for the dropped worker"
    assert "WorkerDropped" in job.reasons() and "WorkerRestarting" not in job.reasons()


def test_repeated_failures_exhaust_the_restart_limit_and_fail_the_job_below_min_np(
        make_job: Callable[..., Job]) -> None:
    def limit_one(policy: dict[str, Any]) -> None:
        policy["restartLimit"] = 1
        policy["disruptionsFree"] = False

    job = make_job(steps=STEPS, transform=with_policy(limit_one),
                   env={"SUPERVISOR_MIN_WORKERS": "2", "SUPERVISOR_SHUTDOWN_GRACE_SECONDS": "10"})
    job.wait_training(past=10, size=2, timeout=420)
    first, _ = job.victim()
    t0 = time.time()
    job.kill_container(first)
    back_within(job, t0, 2, BACK_S)
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
    check_steps(job.records())
