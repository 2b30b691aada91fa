"""The stock-script lane: an unmodified Horovod elastic script under the real supervisor, on real
nodes.

`stock_train.py` imports nothing of this project; whatever the supervisor promises must hold for
it as it is. Each test deploys the main job of the manifests (launcher and worker images, default
settings: no Lease option, the hook on) with the training command replaced by the stock script
(given to the workers by a ConfigMap, as a user's own script would be), injects one fault on the
real nodes through `tests.faults.PodFaults`, and checks that the job ends with exit 0 at the
expected world size, that no committed batch was lost, that the survivors did not sit out the
Gloo timeout (the manifests' 60 s), and that the supervisor's Events explain what happened. The
times of recovery are measured by `make bench` (bench/e2e_stock.py), not here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.nodes import Cluster
from tests.e2e.jobs import (
    STOCK,
    STOCK_DIR,
    Job,
    check_training,
    main_job,
    step_after_reset,
    steps_of,
    stock_script,
)
from tests.faults import PodFaults

BATCHES = 600  # ~50 s at --sleep 0.05: outlasts a fault and the replacement's start (5-10 s)
GLOO_TIMEOUT_S = 60  # the manifests'; the fence must make the survivors leave long before
MakeJob = Callable[..., tuple[Job, PodFaults]]


def stock_command(batches: int, *extra: str) -> list[str]:
    return ["python", f"{STOCK_DIR}/{STOCK.name}", "--batches", str(batches),
            "--batches-per-commit", "5", "--sleep", "0.05", *extra]


@pytest.fixture
def make_job(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
             tmp_path: Path) -> Iterator[MakeJob]:
    with contextlib.ExitStack() as stack:
        def make(workers: int = 2, batches: int = BATCHES, script: tuple[str, ...] = (),
                 **env: str) -> tuple[Job, PodFaults]:
            job = stack.enter_context(main_job(
                cluster, cluster_api, tmp_path, steps=batches,
                command=stock_command(batches, *script), checkpoint=tmp_path / "checkpoint",
                transform=stock_script, env={"SUPERVISOR_WORKERS": str(workers), **env}))
            faults = PodFaults(job, STOCK.name)
            stack.callback(faults.close)
            job.wait_training(past=10, size=workers, timeout=420)
            return job, faults
        yield make


def resumed_after(job: Job, t0: float) -> dict[str, Any] | None:
    """Rank 0's first batch after a reset that came after wall time `t0`."""
    return step_after_reset(job.records(), t0)


def back_to(job: Job, t0: float, size: int, timeout: float = 240) -> dict[str, Any]:
    return job.wait(f"training back at world size {size}",
                    lambda: step_after_reset(job.records(), t0, size), timeout)


def decisions(job: Job) -> dict[str, dict[str, Any]]:
    return {d["pod"]: d for d in job.logs("worker.failed")}


def notes(job: Job, reason: str) -> list[str]:
    return job.notes(reason)


def finished(job: Job, size: int, batches: int = BATCHES) -> None:
    assert job.wait_exit(300) == 0, job.tail()
    check_training(job.records(), batches, final_size=size)


def no_gloo_timeout(job: Job, t0: float) -> float:
    """Seconds from the fault to rank 0's first batch after the reset: well under the Gloo
    timeout, or the survivors sat it out."""
    first = job.wait("a reset after the fault", lambda: resumed_after(job, t0), 120)
    took = first["time"] - t0
    assert took < GLOO_TIMEOUT_S / 2, f"resumed {took:.1f}s after the fault: not fenced?"
    return took


# ---- processes that die --------------------------------------------------------------------

@pytest.mark.parametrize("which", ["a worker", "rank 0's worker"])
def test_a_sigkilled_worker_is_replaced(make_job: MakeJob, which: str) -> None:
    job, faults = make_job()
    rank0 = job.rank0_host()
    victim = next(n for n, p in sorted(job.live_workers().items())
                  if (p["status"]["podIP"] == rank0) == (which == "rank 0's worker"))
    t0 = time.time()
    faults.kill(victim)
    no_gloo_timeout(job, t0)
    back_to(job, t0, 2)
    finished(job, 2)
    d = decisions(job)[victim]
    assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
    assert any(victim in n and "ExitCode 137" in n for n in notes(job, "WorkerRestarting"))


def test_two_workers_killed_at_once_are_both_replaced(make_job: MakeJob) -> None:
    job, faults = make_job(workers=3)
    victims = sorted(job.live_workers())[:2]
    t0 = time.time()
    faults.kill(*victims)
    no_gloo_timeout(job, t0)
    back_to(job, t0, 3, timeout=240)
    finished(job, 3)
    assert {v: decisions(job)[v]["action"] for v in victims} == dict.fromkeys(victims,
                                                                              "Restart")


def test_a_force_deleted_worker_is_replaced(make_job: MakeJob) -> None:
    job, faults = make_job()
    victim, _ = job.victim()
    t0 = time.time()
    faults.force_delete(victim)
    no_gloo_timeout(job, t0)
    back_to(job, t0, 2)
    finished(job, 2)
    assert decisions(job)[victim]["cause"] == "PodForceDeleted"
    assert "WorkerRestarting" in job.reasons()


def test_a_replacement_killed_while_it_joins_is_replaced_again(make_job: MakeJob) -> None:
    job, faults = make_job()
    victim, _ = job.victim()
    t0 = time.time()
    faults.kill(victim)
    replacement = victim[:-1] + "2"
    job.wait("the replacement's training process started",
             lambda: replacement in job.live_workers() and faults.training(replacement), 120)
    joining = not any(r.get("event") == "reset" and r["time"] > t0 and r["size"] == 2
                      for r in job.records())
    t1 = time.time()
    faults.kill(replacement)
    assert joining, "killed before training was back at size 2"
    # The survivor waited for it in the rendezvous of the new world, which Horovod 0.28 cannot
    # finish without it: horovodrun is restarted and the script resumes from its checkpoint.
    job.wait("training at size 2 again", lambda: any(
        s["time"] > t1 and s["size"] == 2 for s in steps_of(job.records())), 240)
    finished(job, 2)
    d = decisions(job)
    assert d[victim]["action"] == d[replacement]["action"] == "Restart"
    assert victim[:-1] + "3" in job.live_workers()
    broken = notes(job, "RendezvousBroken")
    ip = job.workers()[replacement]["status"]["podIP"]
    assert len(broken) == 1 and f"worker {ip} failed" in broken[0], broken
    resumed = [r for r in job.records() if r.get("event") == "resumed" and r["time"] > t1]
    assert len(resumed) == 1, "the restarted run resumed from the checkpoint"


# ---- processes that hang -------------------------------------------------------------------

def hung_then_replaced(job: Job, victim: str, t0: float) -> dict[str, Any]:
    """The checks every hang scenario shares; returns the decision."""
    took = no_gloo_timeout(job, t0)
    back_to(job, t0, 2, timeout=240)
    finished(job, 2)
    d = decisions(job)[victim]
    assert (d["cause"], d["action"]) == ("Hung", "Restart"), d
    assert job.ssh_killed(victim), "horovodrun's ssh client to it was killed"
    assert [h["pod"] for h in job.logs("worker.hung")] == [victim]
    hung = notes(job, "WorkerHung")
    assert len(hung) == 1 and victim in hung[0] and "sent no heartbeat" in hung[0], hung
    assert any(victim in n and "Hung" in n for n in notes(job, "WorkerRestarting"))
    assert victim not in job.workers(), "the hung pod was force-deleted"
    print(f"{victim}: resumed {took:.2f}s after the fault")
    return d


def test_a_frozen_process_on_a_healthy_node_is_found_by_its_silence(make_job: MakeJob) -> None:
    job, faults = make_job()
    victim, pod = job.victim()
    t0 = time.time()
    faults.freeze_training(victim)
    hung_then_replaced(job, victim, t0)
    node = job.core.read_node(pod["spec"]["nodeName"])
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True", "the node stayed healthy throughout"


def test_a_silent_node_with_a_frozen_worker_is_found_without_the_lease_option(
        make_job: MakeJob) -> None:
    job, faults = make_job()
    assert not any(e["name"] == "SUPERVISOR_NODE_LEASE_SECONDS" for e in job.launcher_env())
    victim, pod = job.victim()
    nodes = [p["spec"]["nodeName"] for p in job.live_workers().values()]
    assert nodes.count(pod["spec"]["nodeName"]) == 1, "the survivor is on another node"
    t0 = time.time()
    faults.silence_node(pod["spec"]["nodeName"])
    hung_then_replaced(job, victim, t0)
    # The replacement avoids the node that hung, but that node still says Ready in the API and
    # the scheduler may bind it there: it then never starts and is replaced again once the node
    # is NotReady. Either way the slot's worker that trains at the end runs on another node.
    slot = victim[:-1]
    final = [p for n, p in job.workers().items() if n.startswith(slot)
             and p["status"].get("phase") in ("Running", "Succeeded")
             and not p["metadata"].get("deletionTimestamp")]
    assert final and all(p["spec"]["nodeName"] != pod["spec"]["nodeName"] for p in final), final


def test_a_partitioned_worker_is_found_and_cut_off(make_job: MakeJob) -> None:
    job, faults = make_job()
    victim, _ = job.victim()
    with faults.partition(victim):
        t0 = time.time()
        # The partition ends with the pod (the supervisor deletes a hung one): its rules would
        # otherwise catch whatever reuses its ports later.
        job.wait("the partitioned pod deleted", lambda: victim not in job.live_workers(), 60)
    hung_then_replaced(job, victim, t0)


# ---- no false positives ----------------------------------------------------------------------

def test_a_long_checkpoint_and_a_slow_first_batch_are_not_hangs(make_job: MakeJob) -> None:
    """Rank 0 writes for 40 s (a long checkpoint) while the other waits in the next allreduce,
    and the first batch sleeps 20 s: no collective completes meanwhile, yet every process
    heartbeats, so nothing is Hung and nothing is restarted."""
    job, _ = make_job(batches=120, script=("--slow-step", "1:20:sleep",
                                           "--slow-step", "60:40:write"))
    finished(job, 2, batches=120)
    steps = steps_of(job.records())
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
    assert max(gaps) >= 40, "the long write happened between two batches"
    assert job.logs("worker.hung") == [] and job.logs("worker.failed") == []
    assert [r for r in job.records() if r.get("event") == "reset"] == []
    assert "WorkerHung" not in job.reasons() and "TrainingStalled" not in job.reasons()


def test_a_job_that_stalls_is_restarted_then_failed(make_job: MakeJob) -> None:
    """Rank 0 blocks forever (a deadlock in the script) while everybody heartbeats: after the
    stall timeout horovodrun is restarted and the script resumes from its checkpoint; it
    stalls again, and with the restart limit used up the job fails with exit 9."""
    job, _ = make_job(batches=100_000, script=("--slow-step", "20:100000:sleep"),
                      SUPERVISOR_STALL_TIMEOUT_SECONDS="15",
                      SUPERVISOR_HOROVODRUN_RESTART_LIMIT="1",
                      SUPERVISOR_SHUTDOWN_GRACE_SECONDS="5")
    assert job.wait_exit(300) == 9, job.tail()
    stalls = notes(job, "TrainingStalled")
    assert len(stalls) == 1 and "restarting horovodrun (1 of 1)" in stalls[0], stalls
    assert [f["code"] for f in job.logs("job.failing")] == [9]
    assert [r["event"] for r in job.records() if r.get("event") == "resumed"] == ["resumed"]
    assert job.logs("worker.hung") == []
    assert sum(1 for e in job.logs("horovodrun.started")) == 2


def test_without_the_worker_hook_the_job_trains_and_says_hang_detection_is_off(
        make_job: MakeJob) -> None:
    job, _ = make_job(batches=60, SUPERVISOR_WORKER_HOOK="false")
    finished(job, 2, batches=60)
    off = notes(job, "HangDetectionOff")
    assert len(off) == 1 and "SUPERVISOR_WORKER_HOOK=false" in off[0], off
    assert "DriverNotHardened" not in job.reasons(), "the driver half stays on"


def test_sigterm_reaches_a_stock_script_and_the_supervisor_exits_with_it(
        make_job: MakeJob) -> None:
    job, _ = make_job(batches=100_000)
    launcher = job.launcher()
    assert launcher is not None
    # What the kubelet does on a delete: SIGTERM to the container's main process.
    supervisor = job.processes(launcher["metadata"]["name"],
                               lambda argv: any("elastic-supervisor" in a for a in argv[:2]))
    assert supervisor, "the supervisor in the launcher container"
    for pid in supervisor:
        os.kill(pid, signal.SIGTERM)
    code = job.wait_exit(120)
    assert code != 0, "stopped, not finished"
    assert job.logs("worker.hung") == [], "workers stopped on purpose are never Hung"
