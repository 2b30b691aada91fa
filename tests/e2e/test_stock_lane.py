"""The stock-script lane: an unmodified Horovod elastic script under the real supervisor, on real
nodes.

`stock_train.py` imports nothing of this project; whatever the supervisor promises must hold for
it as it is. The jobs are the main job of the manifests (launcher and worker images, default
settings: no Lease option, the hook on) with the training command replaced by the stock script
(given to the workers by a ConfigMap, as a user's own script would be).

`TestStockTour` is one such job and one fault after the other through `tests.faults.PodFaults`
on the real nodes: a long checkpoint and a slow first batch that are not hangs, SIGKILLs (a
worker, rank 0's, two at once), a force delete, a replacement killed while it joins, a frozen
process on a healthy node, a silent node, a partition, a kube-apiserver restart, and SIGTERM to
the supervisor. Each fault checks that no committed batch was lost so far, that the survivors
did not sit out the Gloo timeout (the manifests' 60 s), that the world size came back, and that
the supervisor's decisions and Events explain what happened. A stall that uses up the horovodrun
restart limit, and a job without the hook, are jobs of their own. The times of recovery are
measured by `make bench` (bench/e2e_stock.py), not here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.job import OVERLAY, REPO, log_time
from localcluster.nodes import Cluster
from supervisor.hook.elastic_supervisor_hook import wire
from tests.e2e.jobs import (
    CHECKPOINT_MOUNT,
    HANG_FILE,
    SHIPPED_QUARANTINE,
    STOCK,
    STOCK_DIR,
    TOUR_SLEEP,
    Job,
    Transform,
    alone_on_its_node,
    check_steps,
    check_training,
    compose,
    left_gracefully,
    main_job,
    no_restart_since,
    one_live_pod_per_slot,
    process_env,
    recomputed_since,
    step_after_reset,
    steps_of,
    stock_script_of,
    tour_budgets,
    udp_ports,
    with_policy,
)
from tests.faults import PodFaults
from tests.integration.harness import scrape

BATCHES = 1_000_000  # a bound no job reaches: tours end through the stop file
GLOO_TIMEOUT_S = 60  # the manifests'; the fence must make the survivors leave long before
METRICS_PORT = 9400  # the manifests' SUPERVISOR_METRICS_PORT, on the launcher pod's IP
# kube-apiserver down: longer than main_job's leader lease (10 s), and short enough that the
# kubelets report again within the cluster's node-monitor grace (20 s): at 15 s they did not
# always, and the node controller marked nodes NotReady after the outage.
OUTAGE_S = 11
# The tour's first batch sleeps FIRST_BATCH_S; rank 0 computes in Python only for PYTHON_S after
# batch 15 (an evaluation) and writes for WRITE_S after batch 25 (a long checkpoint) while the
# other waits in the next allreduce: all longer than the heartbeat timeout (3 s), during which
# no collective completes; the evaluation and the write are longer than the tour's stuck
# threshold (STUCK_S), for which only the position and the I/O of rank 0's main thread move.
# After batch 35 rank 0 holds the GIL for GIL_S of wall time while computing (a long
# garbage-collector pass): its heartbeat thread cannot run, it is silent past the heartbeat
# timeout, but its process watcher says it runs (given STUCK_S before it would be Hung). The
# hold is bounded by the clock, not sized by a calibration: one C call sized so held 8.6 s once
# for 6 s on the nodes, past STUCK_S once on 2026-11-30 (rank 0 declared Hung "though its
# process ran"), and in CI on 2026-12-02 no silence past the timeout was seen at all (most
# likely a hold cut short by a calibration made under more load: the gap held the calibration).
FIRST_BATCH_S, PYTHON_S, WRITE_S, GIL_S, STUCK_S = 4, 12, 12, 5, 10
SLOW = ("--slow-step", f"1:{FIRST_BATCH_S}:sleep", "--slow-step", f"15:{PYTHON_S}:python",
        "--slow-step", f"25:{WRITE_S}:write", "--slow-step", f"35:{GIL_S}:gil",
        "--hang-file", f"{CHECKPOINT_MOUNT}/{HANG_FILE}")
MakeJob = Callable[..., tuple[Job, PodFaults]]


def stock_command(batches: int, *extra: str) -> list[str]:
    return ["python", f"{STOCK_DIR}/{STOCK.name}", "--batches", str(batches),
            "--batches-per-commit", "5", "--sleep", TOUR_SLEEP, *extra]


@contextlib.contextmanager
def stock_job(cluster: Cluster, api: client.ApiClient, out: Path, *, workers: int = 2,
              batches: int = BATCHES, script: tuple[str, ...] = (), policy: Any = None,
              overlay: Path = OVERLAY, stock: Path = STOCK, command: list[str] | None = None,
              transform: Transform | None = None,
              **env: str) -> Iterator[tuple[Job, PodFaults]]:
    """The stock-script job: `stock` (stock_train.py, which keeps a checkpoint) given to the
    workers by a ConfigMap, run by `command` (stock_command's, by default), once it trains at
    size `workers`; with the faults on its pods. `policy` changes the policy file, `transform`
    the rendered objects further, `env` the supervisor's environment."""
    changes = [stock_script_of(stock), *([with_policy(policy)] if policy is not None else []),
               *([transform] if transform is not None else [])]
    with main_job(cluster, api, out, steps=batches,
                  command=command or stock_command(batches, *script),
                  checkpoint=out / "checkpoint", transform=compose(*changes), overlay=overlay,
                  keeps_checkpoint=stock == STOCK,
                  env={"SUPERVISOR_WORKERS": str(workers), **env}) as job:
        faults = PodFaults(job, stock.name)
        try:
            job.wait_training(past=10, size=workers, timeout=420)
            yield job, faults
        finally:
            faults.close()


@pytest.fixture
def make_job(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
             tmp_path: Path) -> Iterator[MakeJob]:
    with contextlib.ExitStack() as stack:
        def make(**kw: Any) -> tuple[Job, PodFaults]:
            return stack.enter_context(stock_job(cluster, cluster_api, tmp_path, **kw))
        yield make


def send_from(pid: int, datagram: bytes, ip: str, port: int) -> None:
    """Send `datagram` to ip:port over UDP from host process `pid`'s network namespace (a pod's)."""
    subprocess.run(["nsenter", "-t", str(pid), "-n", sys.executable, "-c",
                    "import socket, sys; socket.socket(socket.AF_INET, "
                    "socket.SOCK_DGRAM).sendto(bytes.fromhex(sys.argv[1]), "
                    "(sys.argv[2], int(sys.argv[3])))", datagram.hex(), ip, str(port)],
                   check=True, timeout=30)


@pytest.fixture(scope="class")
def tour(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Job, PodFaults]]:
    # main_job's leader lease (10 s: fast takeovers) is shorter than the kube-apiserver outage
    # of the tour: the leader pauses through it and training goes on.
    # The shipped quarantine: its node faults (a silent node, a partition) are the node
    # evidence it acts on, and a quarantine the job is then short of is lifted (a replacement
    # of the two-at-once kill with nowhere else to go; before the lift it stayed Pending).
    with stock_job(cluster, cluster_api, tmp_path_factory.mktemp("stock-tour"), script=SLOW,
                   policy=tour_budgets, SUPERVISOR_STUCK_SECONDS=str(STUCK_S),
                   **SHIPPED_QUARANTINE) as jf:
        yield jf


def resumed_after(job: Job, t0: float) -> dict[str, Any] | None:
    """Rank 0's first batch after a reset that came after wall time `t0`."""
    return step_after_reset(job.records(), t0)



def decisions(job: Job) -> dict[str, dict[str, Any]]:
    return {d["pod"]: d for d in job.logs("worker.failed")}



def no_gloo_timeout(job: Job, t0: float, within: float = GLOO_TIMEOUT_S / 2) -> float:
    """Seconds from the fault to rank 0's first batch after the reset: within `within` (by
    default well under the Gloo timeout, or the survivors sat it out)."""
    first = job.wait("a reset after the fault", lambda: resumed_after(job, t0), 120)
    took = first["time"] - t0
    assert took <= within, f"resumed {took:.2f}s after the fault, bound {within}s: not fenced?"
    return took


def sound(job: Job, t0: float | None = None) -> None:
    """What holds after every fault: one live pod per slot, no committed batch lost, and, for
    a fault at `t0`, horovodrun not restarted since (the script would start over without the
    checkpoint this job keeps)."""
    one_live_pod_per_slot(job)
    check_steps(job.records())
    if t0 is not None:
        no_restart_since(job, t0)


def hung_then_replaced(job: Job, victim: str, t0: float, within: float = GLOO_TIMEOUT_S / 2,
                       size: int = 2) -> dict[str, Any]:
    """The checks every hang fault shares, the survivors resumed within `within` seconds and
    back at `size`; returns the decision."""
    took = no_gloo_timeout(job, t0, within)
    job.back_to(size, t0)
    d = decisions(job)[victim]
    assert (d["cause"], d["action"]) == ("Hung", "Restart"), d
    assert job.ssh_killed(victim), "horovodrun's ssh client to it was killed"
    assert [h["pod"] for h in job.logs_since("worker.hung", t0)] == [victim]
    hung = [n for n in job.notes("WorkerHung") if victim in n]
    assert len(hung) == 1 and "sent no heartbeat" in hung[0], hung
    assert any(victim in n and "Hung" in n for n in job.notes("WorkerRestarting"))
    # Deleted with a grace its kubelet honours (issue 27, item 4): gone once the kubelet killed
    # it; on a frozen node only once the node thaws or is found down.
    assert victim not in job.live_workers(), "the hung pod was not deleted"
    print(f"{victim}: resumed {took:.2f}s after the fault")
    sound(job, t0)
    return d


def frozen_then_replaced(job: Job, faults: PodFaults, within: float = GLOO_TIMEOUT_S / 2,
                         size: int = 2) -> dict[str, Any]:
    """A worker's training process frozen (SIGSTOP) on a healthy node, once the job is
    settled at `size`: found by its silence, fenced, replaced (hung_then_replaced); returns
    its pod."""
    job.settled(size)
    victim, pod = job.victim()
    t0 = time.time()
    faults.freeze_training(victim)
    hung_then_replaced(job, victim, t0, within, size)
    return pod


def partitioned_then_replaced(job: Job, faults: PodFaults,
                              within: float = GLOO_TIMEOUT_S / 2) -> None:
    """A worker cut off the pod network (iptables), once the job is settled: found, fenced,
    deleted, replaced (hung_then_replaced)."""
    job.settled(2)
    victim, _ = job.victim()
    with faults.partition(victim):
        t0 = time.time()
        # The partition ends with the pod (the supervisor deletes a hung one): its rules
        # would otherwise catch whatever reuses its ports later.
        job.wait("the partitioned pod deleted", lambda: victim not in job.live_workers(), 60)
    hung_then_replaced(job, victim, t0, within)


def silent_node_then_replaced(job: Job, faults: PodFaults,
                              within: float = GLOO_TIMEOUT_S / 2) -> None:
    """A worker's node goes silent (its kubelet and the worker frozen), without the node
    Lease option: the worker found silent, fenced, replaced on another node (hung_then_replaced,
    the survivors resumed within `within`)."""
    job.settled(2)
    assert not any(e["name"] == "SUPERVISOR_NODE_LEASE_SECONDS" for e in job.launcher_env())
    victim, pod = job.victim()
    alone_on_its_node(job, pod)
    t0 = time.time()
    faults.silence_node(pod["spec"]["nodeName"])
    try:
        hung_then_replaced(job, victim, t0, within)
        # The replacement avoids the node that hung, but that node still says Ready in the
        # API and the scheduler may bind it there: it then never starts and is replaced
        # again once the node is NotReady. Either way the slot's worker that trains now
        # runs on another node.
        slot = victim.rsplit("-", 1)[0]
        final = [p for n, p in job.live_workers().items() if n.startswith(f"{slot}-")]
        assert final and all(p["spec"]["nodeName"] != pod["spec"]["nodeName"]
                             for p in final), final
    finally:
        faults.close()
    job.wait("the hung pod gone once its node is back", lambda: victim not in job.workers(), 30)


def replacement_killed_while_it_joins(job: Job, faults: PodFaults) -> None:
    """A worker SIGKILLed, then its replacement too once its training process started and
    before training was back at size 2: both replaced, no broken rendezvous, back at 2."""
    job.settled(2)
    victim, _ = job.victim()
    broken_before = len(job.notes("RendezvousBroken"))
    t0 = time.time()
    faults.kill(victim)
    replacement = job.successor(victim)
    job.wait("the replacement's training process started",
             lambda: replacement in job.live_workers() and faults.training(replacement), 120)
    joining = not any(r.get("event") == "reset" and r["time"] > t0 and r["size"] == 2
                      for r in job.records())
    t1 = time.time()
    faults.kill(replacement)
    assert joining, "killed before training was back at size 2"
    # Horovod 0.28 alone would send the survivor into the new world's rendezvous and wait
    # there for the dead replacement until the Gloo timeout aborted it (a horovodrun
    # restart: a checkpoint-less script starts over). The hardened driver holds the
    # survivor out until the new worker is in (the join gate) and assigns the world again
    # without it: the survivor resets elastically with the next replacement.
    job.back_to(2, t1, timeout=240)
    d = decisions(job)
    assert d[victim]["action"] == d[replacement]["action"] == "Restart"
    assert job.successor(replacement) in job.live_workers()
    ip = job.workers()[replacement]["status"]["podIP"]
    assert f"re-planning the world without {ip}" in job.text(), job.tail()
    assert job.notes("RendezvousBroken")[broken_before:] == []
    sound(job, t0)


def force_deleted_then_replaced(job: Job, faults: PodFaults,
                                within: float = GLOO_TIMEOUT_S / 2) -> float:
    """A worker force-deleted (`kubectl delete --force`), once the job is settled: the
    survivors resume within `within` seconds, it is replaced; returns the resume time."""
    job.settled(2)
    victim, _ = job.victim()
    t0 = time.time()
    faults.force_delete(victim)
    took = no_gloo_timeout(job, t0, within)
    job.back_to(2, t0)
    assert decisions(job)[victim]["cause"] == "PodForceDeleted"
    assert any(victim in n for n in job.notes("WorkerRestarting"))
    print(f"{victim}: resumed {took:.2f}s after the force delete")
    sound(job, t0)
    return took


def stuck_then_replaced(job: Job, faults: PodFaults, *, rank0: bool, stuck_s: float,
                        within: float = GLOO_TIMEOUT_S / 2) -> float:
    """The main thread of a rank (rank 0's, or another's) deadlocked through the script's
    --hang-file, once the job is settled: its heartbeat thread runs on, so it is not silent;
    its main thread stands still outside the collective the other waits in: named stuck after
    `stuck_s` with the script's frame, fenced, replaced, the survivors resumed within `within`
    seconds of the deadlock; returns that time."""
    job.settled(2)
    host = job.rank0_host()
    victim, pod = next((n, p) for n, p in sorted(job.live_workers().items())
                       if (p["status"]["podIP"] == host) == rank0)
    t0 = time.time()
    job.hang(pod["status"]["podIP"])
    try:
        job.wait("the stuck pod deleted", lambda: victim not in job.live_workers(), 90)
    finally:
        job.hang("")  # a later pod that gets the same IP trains on
    took = no_gloo_timeout(job, t0, within)  # the survivor's send to it too (test_sever_gloo.py)
    job.back_to(2, t0)
    d = decisions(job)[victim]
    assert (d["cause"], d["action"]) == ("Hung", "Restart"), d
    stuck = job.logs_since("worker.stuck", t0)
    assert [k["pod"] for k in stuck] == [victim], stuck
    assert stuck[0]["still_s"] >= stuck_s and stuck[0]["node"] == pod["spec"]["nodeName"]
    assert "deadlock_if_named" in stuck[0]["where"][0], stuck[0]["where"]
    note = [n for n in job.notes("WorkerStuck") if victim in n]
    assert len(note) == 1 and "its main thread has not moved" in note[0], note
    assert faults.script in note[0] and "waited in a collective" in note[0], note
    assert job.logs_since("worker.hung", t0) == [], "it was never silent"
    shown = [d for d in job.status()["decisions"] if d["reason"] == "WorkerStuck"]
    assert any(victim in d["note"] for d in shown), shown
    assert job.ssh_killed(victim), "horovodrun's ssh client to it was killed"
    print(f"{victim}: resumed {took:.2f}s after the deadlock")
    sound(job, t0)
    return took


@pytest.mark.tour
class TestStockTour:
    # ---- no false positives (the job's first minute) ---------------------------------------------

    def test_a_long_checkpoint_an_evaluation_a_pause_and_a_slow_first_batch_are_not_hangs(
            self, tour: tuple[Job, PodFaults]) -> None:
        """No collective completes during any, yet every process heartbeats (or, while its GIL
        is held, runs: its watcher says so), so nothing is Hung; rank 0's main thread moves
        (Python) or writes, so nothing is stuck either; and nothing is restarted."""
        job, _ = tour
        job.wait_training(past=40, size=2, timeout=240)
        steps = steps_of(job.records())
        # The slow part of batch N comes before rank 0 prints it: the first batch's sleep lies
        # between horovodrun's start and batch 1, the write between batches 24 and 25.
        started = log_time(job.logs("horovodrun.started")[0])
        assert steps[0]["step"] == 1 and steps[0]["time"] - started >= FIRST_BATCH_S, steps[0]
        gaps = {a["step"]: b["time"] - a["time"] for a, b in itertools.pairwise(steps)}
        assert gaps[24] >= WRITE_S, "the long write happened between batches 24 and 25"
        assert gaps[14] >= PYTHON_S, "the evaluation happened between batches 14 and 15"
        assert gaps[34] >= GIL_S, "the GIL was held (silence) past the heartbeat timeout (3 s)"
        # Silent past the timeout, yet not Hung: its watcher said it runs. Said once per
        # silence, and never of another host.
        busy = job.logs("worker.silent_but_running")
        assert busy and {b["host"] for b in busy} == {steps[34]["host"]}, busy
        assert job.logs("worker.hung") == [] and job.logs("worker.failed") == []
        assert job.logs("worker.stuck") == [] and "WorkerStuck" not in job.reasons()
        assert [r for r in job.records() if r.get("event") == "reset"] == []
        assert "WorkerHung" not in job.reasons() and "TrainingStalled" not in job.reasons()
        sound(job, job.applied_at)

    # ---- processes that die or hang, one at a time (node faults while the workers are spread) --

    @pytest.mark.parametrize("which", ["a worker", "rank 0's worker"])
    def test_a_sigkilled_worker_is_replaced(self, tour: tuple[Job, PodFaults],
                                            which: str) -> None:
        job, faults = tour
        job.settled(2)
        rank0 = job.rank0_host()
        victim = next(n for n, p in sorted(job.live_workers().items())
                      if (p["status"]["podIP"] == rank0) == (which == "rank 0's worker"))
        t0 = time.time()
        faults.kill(victim)
        no_gloo_timeout(job, t0)
        job.back_to(2, t0)
        d = decisions(job)[victim]
        assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
        assert any(victim in n and "ExitCode 137" in n for n in job.notes("WorkerRestarting"))
        assert job.successor(victim) in job.live_workers()
        sound(job, t0)

    def test_a_force_deleted_worker_is_replaced(self, tour: tuple[Job, PodFaults]) -> None:
        force_deleted_then_replaced(*tour)

    @pytest.mark.parametrize("announced", ["a node-problem-detector condition",
                                           "the cluster autoscaler's taint"])
    def test_a_worker_whose_node_is_announced_to_go_leaves_without_losing_a_batch(
            self, tour: tuple[Job, PodFaults], announced: str) -> None:
        """Issue 24: a node going bad (KernelDeadlock, patched into its status as
        node-problem-detector does) or going away (the autoscaler's ToBeDeletedByClusterAutoscaler
        taint): the worker leaves gracefully and is replaced on another node, for a script that
        knows nothing of it."""
        job, _ = tour
        job.settled(2)
        _, pod = job.victim()
        node = pod["spec"]["nodeName"]
        on_node = sorted(n for n, p in job.live_workers().items()
                         if p["spec"]["nodeName"] == node)
        core = job.core
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def condition(status: str) -> None:
            core.patch_node_status(node, {"status": {"conditions": [{
                "type": "KernelDeadlock", "status": status, "reason": "DockerHung",
                "message": "task docker:7 blocked for more than 300 seconds",
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}})

        t0 = time.time()
        try:
            if announced.startswith("a node-problem"):
                condition("True")
            else:
                core.patch_node(node, {"spec": {"taints": [{
                    "key": "ToBeDeletedByClusterAutoscaler", "value": str(int(t0)),
                    "effect": "NoSchedule"}]}})
            # both, one after the other, where they share it
            left_gracefully(job, on_node, t0, "NodeCondition" if "condition" in announced
                            else "NodeTainted")
            for victim in on_node:
                replacement = job.live_workers()[job.successor(victim)]
                assert replacement["spec"]["nodeName"] != node, "kept off the node that goes"
            launcher = job.launcher()
            assert launcher is not None
            why = "NodeCondition" if "condition" in announced else "NodeTainted"
            left = scrape(METRICS_PORT, launcher["status"]["podIP"]).get(
                f'elastic_supervisor_worker_leaves_total{{why="{why}"}}', 0)
            assert left == len(on_node), f"worker_leaves_total{{why={why}}}: {left}"
        finally:
            if announced.startswith("a node-problem"):
                condition("False")
            else:
                core.patch_node(node, {"spec": {"taints": None}})
        sound(job, t0)

    def test_a_frozen_process_on_a_healthy_node_is_found_by_its_silence(
            self, tour: tuple[Job, PodFaults]) -> None:
        job, _ = tour
        pod = frozen_then_replaced(*tour)
        node = job.core.read_node(pod["spec"]["nodeName"])
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True", "the node stayed healthy throughout"

    @pytest.mark.parametrize("which", ["a worker", "rank 0's worker"])
    def test_a_rank_whose_main_thread_deadlocks_is_named_stuck_and_replaced(
            self, tour: tuple[Job, PodFaults], which: str) -> None:
        """Its heartbeat thread runs on, so it is not silent; its main thread stands still
        outside the collective the other waits in: stuck after STUCK_S, fenced, replaced."""
        stuck_then_replaced(*tour, rank0=which == "rank 0's worker", stuck_s=STUCK_S)

    def test_a_silent_node_with_a_frozen_worker_is_found_without_the_lease_option(
            self, tour: tuple[Job, PodFaults]) -> None:
        silent_node_then_replaced(*tour)

    def test_a_partitioned_worker_is_found_and_cut_off(
            self, tour: tuple[Job, PodFaults]) -> None:
        partitioned_then_replaced(*tour)

    def test_six_ready_blips_of_a_workers_node_cost_nothing(
            self, tour: tuple[Job, PodFaults]) -> None:
        """Issue 27, item 12: the node's Ready goes False for a second, six times (a kubelet's
        PLEG hiccups): its worker's training processes heartbeat throughout, so its host stays
        in the file (without them it leaves at once: tests/integration/test_node_blips.py):
        no reset, no restart, no failure."""
        job, faults = tour
        job.settled(2)
        victim, pod = job.victim()
        node = pod["spec"]["nodeName"]
        at = (job.last_step() or {"step": 0})["step"]
        t0 = time.time()
        for _ in range(6):
            faults.blip_node(node, 1.0)
            time.sleep(1.0)
        job.wait("the node untainted", lambda: not any(
            t.key.startswith("node.kubernetes.io/")
            for t in job.core.read_node(node).spec.taints or ()), 60)
        job.wait_training(past=at + 20, size=2, timeout=60)
        kept = [e for e in job.logs_since("workers.kept_on_down_nodes", t0) if e["hosts"]]
        assert kept and all(pod["status"]["podIP"] in e["hosts"] for e in kept), kept
        assert [r for r in job.records() if r.get("event") == "reset" and r["time"] > t0] == []
        assert job.logs_since("worker.failed", t0) == []
        assert victim in job.live_workers()
        sound(job, t0)

    # ---- faults during a recovery, several at once -----------------------------------------------

    def test_a_replacement_killed_while_it_joins_is_replaced_again(
            self, tour: tuple[Job, PodFaults]) -> None:
        replacement_killed_while_it_joins(*tour)

    def test_two_workers_killed_at_once_are_both_replaced(
            self, tour: tuple[Job, PodFaults]) -> None:
        job, faults = tour
        job.settled(2)
        t0 = time.time()
        job.scale(3)
        job.back_to(3, t0)
        victims = sorted(job.live_workers())[:2]
        t1 = time.time()
        faults.kill(*victims)
        no_gloo_timeout(job, t1)
        job.back_to(3, t1)
        assert {v: decisions(job)[v]["action"] for v in victims} == dict.fromkeys(
            victims, "Restart")
        sound(job, t0)
        t2 = time.time()
        job.scale(2)
        job.back_to(2, t2)
        assert job.logs_since("worker.failed", t2) == [], "a scale-in is never taken for a failure"
        sound(job, t0)

    # ---- the control plane restarts --------------------------------------------------------------

    def test_training_survives_a_kube_apiserver_outage_longer_than_the_leader_lease(
            self, tour: tuple[Job, PodFaults], cluster_alone: Cluster) -> None:
        """Issue 27, item 1: kube-apiserver down for longer than the leader Lease (10 s): the
        supervisor (in its launcher pod, through the `kubernetes` Service) pauses, takes no
        decision, keeps training going, renews, reconnects and relists, and still acts on
        failures afterwards; the kubelets reconnect too (the outage is shorter than the node
        controller's grace). It has the cluster alone: every job on it would pause."""
        job, faults = tour
        job.settled(2)
        launcher = job.launcher()
        assert launcher is not None
        ip = launcher["status"]["podIP"]
        before = scrape(METRICS_PORT, ip)
        workers = sorted(job.live_workers())
        at = (job.last_step() or {"step": 0})["step"]
        t0 = time.time()

        assert job.cluster.cp is not None
        job.cluster.cp.restart_apiserver(down_s=OUTAGE_S)
        up = time.time()
        # Training never needed the API: it went on at full size through the outage.
        during = [r for r in job.steps() if t0 + 2 < float(r["time"]) < up - 2]
        assert during and all(r["size"] == 2 for r in during), "training stopped in the outage"
        job.wait_training(past=at + 10, size=2, timeout=120)
        paused = job.logs_since("leader.paused", t0)
        assert paused, "the outage outlasted the lease's renew deadline: paused"
        resumed = job.wait("the leader renewed again",
                           lambda: job.logs_since("leader.resumed", t0), 60)
        assert resumed[0]["paused_s"] >= OUTAGE_S - 10  # paused after 2/3 of the lease
        assert job.logs_since("leader.lost", t0) == [] and job.exit_code() is None
        p = "elastic_supervisor_"

        def reconnected() -> bool:
            now = scrape(METRICS_PORT, ip)
            return all(now.get(f'{p}watch_connects_total{{kind="{k}"}}', 0)
                       > before[f'{p}watch_connects_total{{kind="{k}"}}']
                       for k in ("pod", "node"))
        job.wait("the pod and node watches connected again", reconnected, 90)
        assert sorted(job.live_workers()) == workers, "nothing replaced: nothing failed"
        assert job.logs_since("worker.failed", t0) == []
        assert job.logs_since("watch.broken", t0), "the outage was noticed"

        # The supervisor still acts after the outage.
        job.settled(2)
        victim, _ = job.victim()
        t1 = time.time()
        faults.kill(victim)
        job.back_to(2, t1)
        assert decisions(job)[victim]["action"] == "Restart"
        sound(job, t0)

    # ---- a holder of the key --------------------------------------------------------------------

    def test_a_key_holder_in_one_worker_cannot_get_another_declared_dead(
            self, tour: tuple[Job, PodFaults]) -> None:
        """Issue 27, item 10: a process of worker A holds the job's key (the Secret file every
        worker mounts). From A's network namespace it sends, authentic, the driver's report
        that B's training process exited and a heartbeat for B: both refused (they do not come
        from the launcher or from B's address), B keeps training."""
        job, _ = tour
        job.settled(2)
        launcher = job.launcher()
        assert launcher is not None
        ip = launcher["status"]["podIP"]
        unbound = 'elastic_supervisor_hook_datagrams{outcome="unbound"}'
        before = scrape(METRICS_PORT, ip).get(unbound, 0)
        live = job.live_workers()
        a, b = sorted(live)
        pid = job.processes(a, lambda argv: any(x.endswith(STOCK.name) for x in argv))[0]
        env = process_env(pid)
        key = wire.read_key(str(REPO / "manifests" / "base" / "ssh" / "hook.key"), "hook.key")
        b_ip, run = live[b]["status"]["podIP"], env["ELASTIC_SUPERVISOR_HOOK_RUN"]
        forged = [wire.encode(key, {"t": "driver", "s": "forged-driver", "n": 1, "run": run,
                                    "ok": True, "wseq": 99, "world": [b_ip],
                                    "exited": {b_ip: 1}}),
                  wire.encode(key, {"t": "hb", "s": "forged-b", "n": 1, "run": run,
                                    "host": b_ip, "pid": 1, "lr": 0, "wait": 5.0, "in": "x"})]
        t0 = time.time()
        for datagram in forged:
            send_from(pid, datagram, ip, int(env["ELASTIC_SUPERVISOR_HOOK_PORT"]))
        job.wait("both forgeries refused as unbound (authentic: the key was right)",
                 lambda: scrape(METRICS_PORT, ip).get(unbound, 0) >= before + 2, 20)
        # It also signs an exit as the supervisor's, far ahead in sequence, to B's training
        # process: only the supervisor's address may command it (issue 39 item 9).
        b_pid = job.processes(b, lambda argv: any(x.endswith(STOCK.name) for x in argv))[0]
        b_port = udp_ports(b_pid)[0]
        exit_b = wire.encode(key, {"t": "exit", "s": wire.SUPERVISOR, "n": 10**12, "run": run,
                                   "why": "forged"})
        send_from(pid, exit_b, b_ip, b_port)
        time.sleep(5)  # past the heartbeat timeout a forged silent process would have set off
        assert b in job.live_workers(), "the forged report got B replaced"
        assert Path(f"/proc/{b_pid}").exists(), "the forged exit ended B's training process"
        assert any("signed as the supervisor's come from another address" in e["problem"]
                   for e in job.logs_since("hook.problem", t0)), "B said so"
        assert job.logs_since("worker.failed", t0) == []
        assert job.logs_since("worker.hung", t0) == []

    # ---- the end ---------------------------------------------------------------------------------

    def test_sigterm_reaches_a_stock_script_and_the_supervisor_exits_with_it(
            self, tour: tuple[Job, PodFaults]) -> None:
        job, _ = tour
        job.settled(2)
        t0 = time.time()
        launcher = job.launcher()
        assert launcher is not None
        # What the kubelet does on a delete: SIGTERM to the container's main process.
        supervisor = job.supervisors(launcher["metadata"]["name"])
        assert supervisor, "the supervisor in the launcher container"
        for pid in supervisor:
            os.kill(pid, signal.SIGTERM)
        code = job.wait_exit(120)
        assert code != 0, "stopped, not finished"
        assert job.logs_since("worker.hung", t0) == [], "workers stopped on purpose are never Hung"
        check_steps(job.records())


# ---- jobs of their own -----------------------------------------------------------------------

def test_a_job_that_stalls_is_restarted_then_failed(make_job: MakeJob) -> None:
    """Every rank blocks forever (a deadlock in the script everywhere: nobody to name as
    stuck) while everybody heartbeats: after the stall timeout horovodrun is restarted and the
    script resumes from its checkpoint; it stalls again, and with the restart limit used up the
    job fails with exit 9."""
    job, _ = make_job(script=("--slow-step", "20:100000:sleepall"),
                      SUPERVISOR_STALL_TIMEOUT_SECONDS="10",
                      SUPERVISOR_HOROVODRUN_RESTART_LIMIT="1",
                      SUPERVISOR_SHUTDOWN_GRACE_SECONDS="5")
    assert job.wait_exit(300) == 9, job.tail()
    stalls = job.notes("TrainingStalled")
    assert len(stalls) == 1 and "restarting horovodrun (1 of 1)" in stalls[0], stalls
    # What the restart throws away, for a script without a checkpoint: this run's training.
    lost = re.search(r"This run trained (\d+)s \(up to (\d+) collectives in one process\): a "
                     "script that keeps no checkpoint starts over", stalls[0])
    assert lost and int(lost[1]) >= 10 and int(lost[2]) > 0, stalls[0]
    # The restart starts with the slots usable then (both workers), not NP regardless.
    assert [s["np"] for s in job.logs("horovodrun.started")] == [2, 2]
    assert [f["code"] for f in job.logs("job.failing")] == [9]
    assert [r["event"] for r in job.records() if r.get("event") == "resumed"] == ["resumed"]
    assert job.logs("worker.hung") == [] and job.logs("worker.stuck") == []
    assert sum(1 for e in job.logs("horovodrun.started")) == 2


def test_without_the_worker_hook_the_job_trains_and_says_hang_detection_is_off(
        make_job: MakeJob) -> None:
    job, _ = make_job(batches=30, SUPERVISOR_WORKER_HOOK="false")
    assert job.wait_exit(300) == 0, job.tail()
    check_training(job.records(), 30, final_size=2)
    off = job.notes("HangDetectionOff")
    assert len(off) == 1 and "SUPERVISOR_WORKER_HOOK=false" in off[0], off
    assert "DriverNotHardened" not in job.reasons(), "the driver half stays on"


HOLD = "e2e.elastic-supervisor.io/hold"  # a NoSchedule taint the supervisor does not read


def hold(core: client.CoreV1Api, node: str, on: bool) -> None:
    """Keep new pods off `node` (or let them back): a taint of the test's own, which neither
    drains nor cordons (the supervisor would move the workers then)."""
    taints = [t for t in core.read_node(node).spec.taints or () if t.key != HOLD]
    if on:
        taints.append(client.V1Taint(key=HOLD, value="1", effect="NoSchedule"))
    core.patch_node(node, {"spec": {"taints": [core.api_client.sanitize_for_serialization(t)
                                               for t in taints]}})


def test_a_frozen_node_with_rank_0_and_another_worker_is_one_incident(
        make_job: MakeJob, cluster: Cluster, cluster_api: client.ApiClient) -> None:
    """Issue 40 item 3: a node froze while it held rank 0 and another worker. Declared one at a
    time, the first reset's world still held the other frozen one, and the rendezvous broke
    (horovodrun restarted: a script without a checkpoint starts over). Both are declared
    together, in one dead set: the survivor resumes within the bound, horovodrun is not
    restarted, and the job grows back once the node is. The shipped defaults, quarantine
    included."""
    core = client.CoreV1Api(cluster_api)
    names = [n.name for n in cluster.nodes]
    spare = names[-1]
    hold(core, spare, True)  # the launcher takes one node, both first workers the other
    try:
        job, faults = make_job(workers=2, **SHIPPED_QUARANTINE)
        first = {p["spec"]["nodeName"] for p in job.live_workers().values()}
        assert len(first) == 1, f"the first two workers share a node: {first}"
        (both,) = first
        hold(core, both, True)
        hold(core, spare, False)
        job.scale(3)  # the third worker can go only to the spare node
        job.settled(3)
    finally:
        for name in names:
            hold(core, name, False)
    frozen = sorted(n for n, p in job.live_workers().items() if p["spec"]["nodeName"] == both)
    rank0 = job.rank0_host()
    assert len(frozen) == 2 and any(
        job.live_workers()[n]["status"]["podIP"] == rank0 for n in frozen), (
        f"rank 0 ({rank0}) and another worker on the node to freeze: {frozen}")
    frozen_ips = sorted(job.live_workers()[n]["status"]["podIP"] for n in frozen)
    t0 = time.time()
    faults.silence_node(both)
    try:
        first_step = job.wait("the survivor's first batch after the reset",
                              lambda: step_after_reset(job.records(), t0), 60)
        took = first_step["time"] - t0
        print(f"{frozen} on {both}: resumed {took:.2f}s after the freeze")
        resets = [r for r in job.records() if r.get("event") == "reset" and r["time"] > t0]
        assert resets[0]["size"] == 1, f"one reset, both frozen workers out: {resets}"
        # One dead set, one fence: both in the first fence after the freeze (declared in one
        # pass, each on its own evidence, or the second pulled in with the first:
        # workers.hung_together)
        fences = [sorted(f["hosts"]) for f in job.logs_since("worker.fenced", t0)]
        assert fences and fences[0] == frozen_ips, fences
        together = job.logs_since("workers.hung_together", t0)
        assert all(sorted(t["pods"]) == frozen for t in together), together
        assert sorted(h["pod"] for h in job.logs_since("worker.hung", t0)) == frozen
        assert took <= 5.0, f"resumed {took:.2f}s after the freeze (bound 5 s)"
        no_restart_since(job, t0)
        check_steps(job.records())
        # While the node is frozen the replacements' only room is the survivor's node
        # (workers avoid the launcher's): the job waits below its size. Once the node is
        # back it grows to 3 again, whether or not the frozen node was quarantined (a
        # quarantine the job is short of is lifted: node.quarantine_lifted).
    finally:
        faults.close()
    job.back_to(3, t0)
    no_restart_since(job, t0)
    check_steps(job.records())


# A straggler (issue 42): the stock script with no extra sleep and a batch large enough that
# its steps are mostly its own compute (~36 ms alone on a core), one worker given
# THROTTLE_PERCENT of a CPU. The 30 % makes a rank 3x slow where it had a core to
# itself; here three workers, the control plane and the kubelets share two cores, a worker gets
# about two thirds of one, and 30 % made the throttled one 2.0-2.1x the others (measured on
# 2026-11-30): 20 % makes it the 3x. Bounds: named within SLOW_NAMED_S of the throttle,
# and the step rate back within 10 % of its rate before within RATE_BACK_S (the issue's
# targets).
THROTTLE_PERCENT, SLOW_NAMED_S, RATE_BACK_S, RATE_WINDOW_S = 20, 60.0, 120.0, 10.0
COMPUTE_BOUND = ("--batches-per-commit", "5", "--batch-size", "8192")


def rate_between(records: list[dict[str, Any]], start: float, end: float) -> float:
    """Rank 0's steps per second between wall times `start` and `end`."""
    steps = [r for r in steps_of(records) if start <= r["time"] <= end]
    if len(steps) < 2 or steps[-1]["time"] <= steps[0]["time"]:
        return 0.0
    return (steps[-1]["step"] - steps[0]["step"]) / (steps[-1]["time"] - steps[0]["time"])


def straggler_job() -> dict[str, Any]:
    """stock_job's arguments for three workers of the compute-bound stock script (no
    checkpoint), the shipped defaults."""
    return {"workers": 3, "command": ["python", f"{STOCK_DIR}/{STOCK.name}", "--batches",
                                      str(BATCHES), *COMPUTE_BOUND], **SHIPPED_QUARANTINE}


def roomy_victim(job: Job) -> tuple[str, dict[str, Any]]:
    """A worker, not rank 0's, whose replacement has somewhere to go: the workers request a CPU
    and the nodes hold two each, the launcher's node none (workers_avoid_the_launcher), so three
    workers fill one node and half of another; a replacement kept off the lone worker's node
    would find no room and stay Pending (the worker then trains on, as designed: seen on
    2026-11-30). So one that shares its node."""
    rank0 = job.rank0_host()
    live = sorted(job.live_workers().items())
    nodes = [p["spec"]["nodeName"] for _, p in live]
    for name, pod in live:
        if pod["status"].get("podIP") != rank0 and nodes.count(pod["spec"]["nodeName"]) > 1:
            return name, pod
    raise AssertionError(f"no worker besides rank 0's shares a node: {nodes}")


def throttled_then_moved(job: Job, faults: PodFaults) -> dict[str, Any]:
    """Throttle a worker (`roomy_victim`) of the settled job to THROTTLE_PERCENT of a CPU:
    `slowed_then_moved`."""
    return slowed_then_moved(job, lambda pod: faults.throttle(pod, THROTTLE_PERCENT), "work")


def slowed_then_moved(job: Job, slow: Callable[[str], Any], kind: str) -> dict[str, Any]:
    """Slow a worker (`roomy_victim`) of the settled job down with `slow(pod)`; wait until it
    is said slow (for `kind`: its own "work" or its "link"), leaves, its replacement runs and
    the step rate is back within 10 % of the rate before. Return what was measured (seconds
    from the fault)."""
    job.settled(3)
    time.sleep(RATE_WINDOW_S * 2)
    now = time.time()
    before = rate_between(job.records(), now - RATE_WINDOW_S * 2, now)
    assert before > 0, "no steps before the throttle"
    victim, pod = roomy_victim(job)
    node = pod["spec"]["nodeName"]
    t0 = time.time()
    slow(victim)
    print(f"straggler: {victim} on {node} slowed ({kind}) at {t0:.2f} ({before:.1f} steps/s "
          "before)", flush=True)
    named = job.wait(f"the slowed worker said slow ({kind})", lambda: [
        e for e in job.logs_since("worker.slow", t0)
        if e.get("pod") == victim and e.get("kind") == kind], 180)
    left = job.wait("the slow worker leaving", lambda: [
        e for e in job.logs_since("worker.leaving", t0) if e.get("pod") == victim], 180)
    successor = job.successor(victim)
    placed = job.wait(f"{successor} running", lambda: (
        p := job.live_workers().get(successor)) and p["status"].get("phase") == "Running"
        and p, 120)

    def back() -> float | None:
        records = job.records()
        last = steps_of(records)[-1]
        if last["size"] != 3 or last["time"] < log_time(left[0]) + RATE_WINDOW_S:
            return None
        rate = rate_between(records, last["time"] - RATE_WINDOW_S, last["time"])
        return last["time"] if rate >= 0.9 * before else None

    recovered = job.wait("the step rate back within 10 %", back, 300)
    ip = pod["status"].get("podIP")
    earlier = [e for e in job.logs() if log_time(e) < t0]
    return {"pod": victim, "node": node, "kind": kind, "why": left[0].get("why"),
            # the healthy job's margins before the fault, as logged (in steps of 0.25 and
            # 1 ms: the widest is under the last logged plus a step), and the other hosts
            # ever suspected after it (evidence short of a verdict)
            "widest_work_before": max((e.get("factor", 0.0) for e in earlier
                                       if e.get("event") == "stragglers.widest"), default=0.0),
            "widest_link_before_ms": max((e.get("excess_ms", 0.0) for e in earlier
                                          if e.get("event") == "stragglers.widest_link"),
                                         default=0.0),
            "suspected_elsewhere": sorted({f"{e.get('host')} ({e.get('kind')}, "
                                           f"{e.get('factor')}x)"
                                           for e in job.logs_since("worker.slow_suspected", t0)
                                           if e.get("host") != ip}),
            "factor": named[0].get("factor"), "replacement_node": placed["spec"]["nodeName"],
            "rate_before": round(before, 2),
            "rate_throttled": round(rate_between(job.records(), t0 + 5, log_time(named[0])), 2),
            "detected_s": round(log_time(named[0]) - t0, 1),
            "left_s": round(log_time(left[0]) - t0, 1),
            "rate_recovered_s": round(recovered - t0, 1),
            "steps_recomputed": recomputed_since(job.records(), t0),
            "horovodrun_restarts": len(job.logs_since("horovodrun.restarting", t0)),
            "slow_elsewhere": [e.get("pod") for e in job.logs("worker.slow")
                               if e.get("pod") != victim]}


def test_a_throttled_worker_is_named_and_moved_and_the_rate_comes_back(
        make_job: MakeJob) -> None:
    """Issue 42: one of three workers given 30 % of a CPU makes every step wait for it. It is
    named slow (WorkerSlow) within the bound, moved (its replacement placed first, off its
    node, then it leaves gracefully: no step computed again, horovodrun never restarted), and
    the job's step rate is back within 10 % of its rate before. The shipped defaults, with the
    stock script keeping no checkpoint; no other worker is ever said slow (main_job's check).
    The times are measured by `python -m bench --only stragglers`, the bounds held here."""
    job, faults = make_job(**straggler_job())
    m = throttled_then_moved(job, faults)
    print(f"straggler: {m}")
    moved_within_the_bounds(job, m)


# A slow link (issue 42's second case): the stock script as its users run it (64 samples a
# batch: its steps are mostly Horovod's negotiation and the gradients' allreduce), one worker's
# link narrowed to LINK_RATE (faults.slow_link: tc's token bucket on the pod's interface; this
# kernel has no netem for a fixed delay), which makes every rank's step several times slower.
LINK_RATE = "2mbit"


def link_job() -> dict[str, Any]:
    """stock_job's arguments for three workers of the stock script (no checkpoint), the
    shipped defaults."""
    return {"workers": 3, "command": ["python", f"{STOCK_DIR}/{STOCK.name}", "--batches",
                                      str(BATCHES)], **SHIPPED_QUARANTINE}


def narrowed_then_moved(job: Job, faults: PodFaults) -> dict[str, Any]:
    """Narrow a worker's link to LINK_RATE: `slowed_then_moved`."""
    return slowed_then_moved(job, lambda pod: faults.slow_link(pod, LINK_RATE), "link")


def test_a_worker_on_a_slow_link_is_named_and_moved_and_the_rate_comes_back(
        make_job: MakeJob) -> None:
    """Issue 42: one of three workers on a slow link makes every rank wait alike, and no one's
    own work is slower. Its link is told apart by the round trips the hooks read (its every
    link is slow; each other host has a fast one), named (WorkerSlow, kind "link") within the
    bound and moved ahead off its node, and the step rate comes back within 10 %: no step
    computed again, horovodrun never restarted, no other worker said slow. Shipped defaults,
    the stock script keeping no checkpoint."""
    job, faults = make_job(**link_job())
    m = narrowed_then_moved(job, faults)
    print(f"straggler: {m}")
    moved_within_the_bounds(job, m)


def moved_within_the_bounds(job: Job, m: dict[str, Any]) -> None:
    """What `throttled_then_moved` measured meets issue 42's targets."""
    assert m["why"] == "Straggler", m
    assert m["replacement_node"] != m["node"], "the replacement was kept off the slow node"
    assert m["detected_s"] <= SLOW_NAMED_S, m
    assert m["rate_recovered_s"] <= RATE_BACK_S, m
    assert m["steps_recomputed"] == 0, "a graceful leave computes nothing again"
    assert m["horovodrun_restarts"] == 0, m
    no_restart_since(job, 0)
    check_steps(job.records())
    assert m["slow_elsewhere"] == [], f"only the throttled worker is slow: {m}"
