"""End to end with a stock script: recovery times of unmodified Horovod training, default settings.

The stock-script lane's job (tests/e2e/stock_train.py: imports nothing of this project) on a
private local control plane with the node agent: the real `elastic-supervisor run` with its
defaults (no Lease option, the hook on), the real horovodrun, 2 PyTorch workers on 3 nodes.
RUNS jobs, each injecting the faults of PLAN one at a time through tests.faults.PodFaults, each
once the job is back at full size and has trained a little. From rank 0's step lines and the
supervisor's log:
- resumed: fault injected -> rank 0's first batch after the reset that follows it;
- full size: fault -> the first batch at world size 2 again (the replacement's start included);
- steps computed again at each rollback after the fault (last batch before - batch after + 1);
- the longest interval between two batches over each whole job (no fault leaves training
  without a batch for long while enough workers are healthy: MIN_NP is 1 here).
All times are wall-clock differences on one machine (fault injector, supervisor and workers).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.e2e.training import ElasticJob, elastic_job, step_after_reset, steps_of

from localcluster.controlplane import ControlPlane, Settings
from supervisor import kube
from tests.conftest import make_namespace
from tests.faults import PodFaults

STOCK = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "stock_train.py"
# The silent node comes last: its node stays dead, and without the Lease option it is Ready
# in the API for the node grace (40 s), so a later replacement may be bound there and wait.
PLAN = ("kill", "kill rank 0", "freeze process", "partition", "force delete", "kill",
        "silent node")
HANGS = ("freeze process", "silent node", "partition")
KILLS = ("kill", "kill rank 0")
RUNS = 2


def summary(samples: list[float]) -> dict[str, Any] | None:
    if not samples:
        return None
    return {"median": round(statistics.median(samples), 2), "max": round(max(samples), 2),
            "n": len(samples), "samples": [round(x, 2) for x in samples]}


def rerun_after(job: ElasticJob, t0: float) -> list[int]:
    """Batches computed again at each rollback of rank 0's sequence after `t0`."""
    out, prev = [], None
    for s in steps_of(job.records()):
        if prev is not None and s["time"] > t0 and s["step"] <= prev:
            out.append(prev - s["step"] + 1)
        prev = s["step"]
    return out


def inject(job: ElasticJob, faults: PodFaults, fault: str,
           stack: contextlib.ExitStack) -> tuple[str, float]:
    """Inject `fault` on a worker (never rank 0's, except for "kill rank 0"); return it and
    the wall time."""
    rank0 = job.rank0_host()
    live = sorted(job.live_workers().items())
    pick = [n for n, p in live if (p["status"]["podIP"] == rank0) == (fault == "kill rank 0")]
    if fault == "silent node":  # a node of its own: silencing it must leave a survivor
        nodes = [p["spec"]["nodeName"] for _, p in live]
        pick = [n for n in pick if nodes.count(dict(live)[n]["spec"]["nodeName"]) == 1]
        if not pick:
            raise SystemExit("bench e2e_stock: both workers share a node; cannot silence one")
    victim = pick[0]
    pod = dict(live)[victim]
    t0 = time.time()
    if fault.startswith("kill"):
        faults.kill(victim)
    elif fault == "force delete":
        faults.force_delete(victim)
    elif fault == "freeze process":
        faults.freeze_training(victim)
    elif fault == "silent node":
        faults.silence_node(pod["spec"]["nodeName"])
    elif fault == "partition":
        stack.enter_context(faults.partition(victim))
    return victim, t0


def one_job(cp: ControlPlane, api: client.ApiClient, work: Path) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    ns = make_namespace(core)
    faults_out: list[dict[str, Any]] = []
    command = (sys.executable, str(STOCK), "--batches", "1000000", "--batches-per-commit", "5",
               "--checkpoint", str(work / "checkpoint.pt"), "--sleep", "0.02")
    # Backoff capped at 1 s: repeated faults on one slot measure recovery, not the policy.
    with elastic_job(cp, api, ns, work, steps=0, command=command,
                     SUPERVISOR_BACKOFF_MAX_SECONDS="1") as job:
        faults = PodFaults(job.pods, STOCK.name)
        job.start()
        job.wait_training(past=20, size=2, timeout=300)
        for fault in PLAN:
            past = (job.last_step() or {"step": 0})["step"] + 10
            job.wait_training(past=past, size=2, timeout=240)
            partition = contextlib.ExitStack()
            victim, t0 = inject(job, faults, fault, partition)
            resumed = job.wait(f"{fault}: resumed",
                               lambda t0=t0: step_after_reset(job.records(), t0), 120)
            # A partition ends with the pod it cut off (the supervisor deletes a hung pod):
            # its rules would otherwise catch whatever reuses its ports later.
            job.wait(f"{fault}: the victim gone", lambda v=victim: v not in job.live_workers(),
                     60)
            partition.close()
            full = job.wait(f"{fault}: full size",
                            lambda t0=t0: step_after_reset(job.records(), t0, 2), 240)
            faults_out.append({"fault": fault, "victim": victim,
                               "resumed_s": round(resumed["time"] - t0, 2),
                               "full_size_s": round(full["time"] - t0, 2),
                               "steps_rerun": rerun_after(job, t0)})
            print(f"bench e2e_stock: {faults_out[-1]}", flush=True)
        assert job.sup.proc is not None
        job.sup.proc.send_signal(signal.SIGTERM)
        job.wait_exit(120)
        steps = steps_of(job.records())
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
        decisions = [(d["pod"], d["cause"], d["action"]) for d in job.logs("worker.failed")]
    with contextlib.suppress(Exception):
        core.delete_namespace(ns)
    return {"faults": faults_out, "longest_interval_without_a_step_s": round(max(gaps), 2),
            "decisions": decisions}


def main(runs: int = RUNS) -> dict[str, Any]:
    jobs = []
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="e2e-stock-", dir=out)
    print(f"bench e2e_stock: logs in {tmp}", flush=True)
    with ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp:
        api = kube.make_api_client(str(cp.kubeconfig))
        try:
            for i in range(runs):
                work = Path(tmp) / f"run{i}"
                work.mkdir()
                print(f"bench e2e_stock: job {i + 1} of {runs}", flush=True)
                jobs.append(one_job(cp, api, work))
        finally:
            api.close()
    faults = [f for j in jobs for f in j["faults"]]

    def of(kinds: tuple[str, ...], key: str) -> list[float]:
        return [f[key] for f in faults if f["fault"] in kinds]

    rerun = {k: [n for f in faults if f["fault"] == k for n in f["steps_rerun"]] for k in PLAN}
    details = {
        "plan": list(PLAN), "runs": runs, "jobs": jobs,
        "resumed_after_hang_s": summary(of(HANGS, "resumed_s")),
        "resumed_after_sigkill_s": summary(of(KILLS, "resumed_s")),
        "resumed_after_force_delete_s": summary(of(("force delete",), "resumed_s")),
        "full_size_s": summary(of(PLAN, "full_size_s")),
        "steps_rerun_by_fault": {k: v for k, v in rerun.items() if v},
        "longest_interval_without_a_step_s": max(
            j["longest_interval_without_a_step_s"] for j in jobs),
        "commit_every": 5,
    }
    hangs, kills = details["resumed_after_hang_s"], details["resumed_after_sigkill_s"]
    e2e_stock = {
        "resumed_after_hang_s": {"median": hangs["median"], "max": hangs["max"]}
        if hangs else None,
        "resumed_after_sigkill_s": {"median": kills["median"], "max": kills["max"]}
        if kills else None,
        "longest_interval_without_a_step_s": details["longest_interval_without_a_step_s"],
        "steps_rerun_max": max((n for v in rerun.values() for n in v), default=0),
    }
    print(f"e2e_stock: {e2e_stock}", flush=True)
    return {"e2e_stock": e2e_stock, "e2e_stock_details": details}
