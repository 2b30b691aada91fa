"""End to end with a stock script: recovery times of unmodified Horovod training, default settings.

The stock-script lane's job (tests/e2e/stock_train.py: imports nothing of this project, given
to the workers by a ConfigMap) as the main job of the manifests on the local cluster with three
real nodes and the real images: the supervisor with its defaults (no Lease option, the hook on),
the real horovodrun, 2 PyTorch workers (kept off the launcher's node, so that a node fault never
takes the supervisor). RUNS jobs, one namespace each on one cluster, each injecting the faults of
PLAN one at a time through tests.faults.PodFaults (real: containers killed, pods force-deleted,
processes and whole nodes frozen, a pod IP partitioned with iptables), each
once the job is back at full size and has trained a little. From rank 0's step lines and the
supervisor's log:
- resumed: fault injected -> rank 0's first batch after the reset that follows it (a stuck
  rank: its main thread deadlocked through the script's --hang-file, found with the default
  SUPERVISOR_STUCK_SECONDS=auto);
- full size: fault -> the first batch at world size 2 again (the replacement's start included);
- steps computed again at each rollback after the fault (last batch before - batch after + 1);
- the longest interval between two batches over each whole job (no fault leaves training
  without a batch for long while enough workers are healthy: MIN_NP is 1 here).
All times are wall-clock differences on one machine (fault injector, supervisor and workers).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

from localcluster import demo
from localcluster.job import OVERLAY
from localcluster.nodes import Cluster
from tests.e2e.jobs import (
    CHECKPOINT_MOUNT,
    HANG_FILE,
    STOCK,
    Job,
    Transform,
    compose,
    main_job,
    step_after_reset,
    steps_of,
    stock_script_of,
    with_policy,
)
from tests.e2e.test_stock_lane import stock_command
from tests.faults import PodFaults

# The silent node comes last: its node stays frozen, and without the Lease option it is Ready
# in the API for the node grace, so a later replacement may be bound there and wait.
PLAN = ("kill", "kill rank 0", "freeze process", "stuck", "partition", "force delete",
        "stuck rank 0", "kill", "silent node")
HANGS = ("freeze process", "silent node", "partition")
STUCK = ("stuck", "stuck rank 0")  # a main thread deadlocked, its heartbeat thread running
KILLS = ("kill", "kill rank 0")
RUNS = 2


def summary(samples: list[float]) -> dict[str, Any] | None:
    if not samples:
        return None
    return {"median": round(statistics.median(samples), 2), "max": round(max(samples), 2),
            "n": len(samples), "samples": [round(x, 2) for x in samples]}


def rerun_after(job: Job, t0: float) -> list[int]:
    """Batches computed again at each rollback of rank 0's sequence after `t0`."""
    out, prev = [], None
    for s in steps_of(job.records()):
        if prev is not None and s["time"] > t0 and s["step"] <= prev:
            out.append(prev - s["step"] + 1)
        prev = s["step"]
    return out


def stop_supervisor(job: Job) -> None:
    """SIGTERM the supervisor in the launcher pod and wait for the launcher to exit (the job's
    end, as a user's signal would bring it; in sidecar mode the supervisor hands it to es-run
    with the job's exit code)."""
    launcher = job.launcher()
    assert launcher is not None, "no launcher pod"
    for pid in job.supervisors(launcher["metadata"]["name"]):
        os.kill(pid, signal.SIGTERM)
    job.wait_exit(120)


def inject(job: Job, faults: PodFaults, fault: str,
           stack: contextlib.ExitStack) -> tuple[str, float] | None:
    """Inject `fault` on a worker (never rank 0's, except for "kill rank 0"); return it and
    the wall time (None: no worker fits the fault, e.g. a silent node needs a node of its own,
    and replacements may have put both workers on one)."""
    rank0 = job.rank0_host()
    live = sorted(job.live_workers().items())
    pick = [n for n, p in live
            if (p["status"]["podIP"] == rank0) == fault.endswith("rank 0")]
    if fault == "silent node":  # a node of its own: silencing it must leave a survivor
        nodes = [p["spec"]["nodeName"] for _, p in live]
        pick = [n for n in pick if nodes.count(dict(live)[n]["spec"]["nodeName"]) == 1]
        if not pick:
            return None
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
    elif fault in STUCK:
        job.hang(pod["status"]["podIP"])
        stack.callback(job.hang, "")  # once it is gone: a later pod with its IP trains on
    return victim, t0


def one_job(cluster: Cluster, api: client.ApiClient, work: Path,
            plan: tuple[str, ...] = PLAN, *, overlay: Path = OVERLAY, stock: Path = STOCK,
            command: list[str] | None = None, transform: Transform | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """One job of `overlay` (the baked-in mode's, or the sidecar mode's) through `plan`: the
    stock script `stock` (stock_train.py, which keeps a checkpoint, by default) run by
    `command` (it reads the hang file, --hang-file), `transform` changing the objects further
    (e.g. the user's image), `env` the supervisor's (main_job's otherwise: the quarantine
    off)."""
    faults_out: list[dict[str, Any]] = []
    # Backoff capped at 1 s (in the policy file, where the manifests keep the budgets):
    # repeated faults on one slot measure recovery, not the policy.
    fast_backoff = with_policy(lambda p: p.update(backoff={"initialSeconds": 1, "maxSeconds": 1}))
    if command is None:
        command = stock_command(1_000_000, "--hang-file", f"{CHECKPOINT_MOUNT}/{HANG_FILE}")
    with main_job(cluster, api, work, steps=0, command=command,
                  checkpoint=work / "checkpoint", keeps_checkpoint=stock == STOCK,
                  transform=compose(stock_script_of(stock), fast_backoff,
                                    *([transform] if transform is not None else [])),
                  overlay=overlay, env=env) as job:
        faults = PodFaults(job, stock.name)
        try:
            job.wait_training(past=20, size=2, timeout=420)
            for fault in plan:
                past = (job.last_step() or {"step": 0})["step"] + 10
                job.wait_training(past=past, size=2, timeout=240)
                partition = contextlib.ExitStack()
                injected = inject(job, faults, fault, partition)
                if injected is None:
                    faults_out.append({"fault": fault, "skipped": "the workers share a node"})
                    print(f"bench e2e_stock: {faults_out[-1]}", flush=True)
                    continue
                victim, t0 = injected
                resumed = job.wait(f"{fault}: resumed",
                                   lambda t0=t0: step_after_reset(job.records(), t0), 120)
                # A partition ends with the pod it cut off (the supervisor deletes a hung pod):
                # its rules would otherwise catch whatever reuses its IP later.
                job.wait(f"{fault}: the victim gone",
                         lambda v=victim: v not in job.live_workers(), 60)
                partition.close()
                full = job.wait(f"{fault}: full size",
                                lambda t0=t0: step_after_reset(job.records(), t0, 2), 240)
                faults_out.append({"fault": fault, "victim": victim,
                                   "resumed_s": round(resumed["time"] - t0, 2),
                                   "full_size_s": round(full["time"] - t0, 2),
                                   "steps_rerun": rerun_after(job, t0)})
                print(f"bench e2e_stock: {faults_out[-1]}", flush=True)
            stop_supervisor(job)
        finally:
            faults.close()
        steps = steps_of(job.records())
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
        decisions = [(d["pod"], d["cause"], d["action"]) for d in job.logs("worker.failed")]
        restarts = len(job.logs("horovodrun.started")) - 1
    return {"faults": faults_out, "longest_interval_without_a_step_s": round(max(gaps), 2),
            "decisions": decisions, "horovodrun_restarts": restarts}


@contextlib.contextmanager
def on_real_nodes(name: str) -> Iterator[tuple[Cluster, client.ApiClient, Path]]:
    """The demo's cluster of real nodes, a client of it, and a directory for the logs under
    bench/out (said on stdout)."""
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-", dir=out))
    print(f"bench {name}: logs in {tmp}", flush=True)
    with demo.started_cluster() as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        try:
            yield cluster, api, tmp
        finally:
            api.close()


def main(runs: int = RUNS) -> dict[str, Any]:
    jobs = []
    with on_real_nodes("e2e_stock") as (cluster, api, tmp):
        for i in range(runs):
            work = tmp / f"run{i}"
            work.mkdir()
            print(f"bench e2e_stock: job {i + 1} of {runs}", flush=True)
            jobs.append(one_job(cluster, api, work))
    faults = [f for j in jobs for f in j["faults"]]

    def of(kinds: tuple[str, ...], key: str) -> list[float]:
        return [f[key] for f in faults if f["fault"] in kinds and key in f]

    rerun = {k: [n for f in faults if f["fault"] == k for n in f.get("steps_rerun", ())]
             for k in PLAN}
    details = {
        "plan": list(PLAN), "runs": runs, "jobs": jobs,
        "resumed_after_hang_s": summary(of(HANGS, "resumed_s")),
        "resumed_after_sigkill_s": summary(of(KILLS, "resumed_s")),
        "resumed_after_force_delete_s": summary(of(("force delete",), "resumed_s")),
        "resumed_after_stuck_s": summary(of(STUCK, "resumed_s")),
        "full_size_s": summary(of(PLAN, "full_size_s")),
        "steps_rerun_by_fault": {k: v for k, v in rerun.items() if v},
        "longest_interval_without_a_step_s": max(
            j["longest_interval_without_a_step_s"] for j in jobs),
        "commit_every": 5,
        "skipped": [f for f in faults if "skipped" in f],
    }
    hangs, kills = details["resumed_after_hang_s"], details["resumed_after_sigkill_s"]
    stuck = details["resumed_after_stuck_s"]
    e2e_stock = {
        "resumed_after_hang_s": {"median": hangs["median"], "max": hangs["max"]}
        if hangs else None,
        "resumed_after_sigkill_s": {"median": kills["median"], "max": kills["max"]}
        if kills else None,
        "resumed_after_stuck_s": {"median": stuck["median"], "max": stuck["max"]}
        if stuck else None,
        "longest_interval_without_a_step_s": details["longest_interval_without_a_step_s"],
        "steps_rerun_max": max((n for v in rerun.values() for n in v), default=0),
        "horovodrun_restarts": sum(j["horovodrun_restarts"] for j in jobs),
    }
    print(f"e2e_stock: {e2e_stock}", flush=True)
    return {"e2e_stock": e2e_stock, "e2e_stock_details": details}
