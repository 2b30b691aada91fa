"""End to end: announced disruptions with a stock script (issue 24), default settings.

The stock-script lane's job (tests/e2e/stock_train.py: imports nothing of this project) as the
main job of the manifests on the local cluster with three real nodes and the real images, the
supervisor with its defaults, 2 workers kept off the launcher's node. PLAN's disruptions come
one at a time, each once the job is back at full size and has trained a little, each on a
worker that does not host rank 0, each with its announcement as a real cluster makes it:
- evict: the Eviction API (what `kubectl drain` and the autoscaler call);
- drain: `kubectl drain NODE --force` (cordon, then the Eviction API; uncordoned after);
- delete: `kubectl delete pod` with the pod's grace period;
- taint: the cluster autoscaler's ToBeDeletedByClusterAutoscaler on the worker's node;
- condition: node-problem-detector's KernelDeadlock=True patched into the node's status.
From rank 0's batch lines and the supervisor's log, per disruption:
- steps_recomputed: batches computed again after it (rollbacks of rank 0's sequence);
- interruption_s: the longest interval between two batches from the announcement until the
  job trains at full size again (the leave's regroup and the replacement's join);
- announce_to_file_s: the announcement (the API call returned) -> the discovery file written
  without the worker (the supervisor's `discovery.written` after its `worker.leaving`); a
  victim that was the last of Horovod's world on its node waits until another worker joined
  (`waited_for_a_join`), by design.
All times are wall-clock differences on one machine.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.e2e_stock import on_real_nodes, rerun_after, stop_supervisor, summary
from localcluster.job import log_time
from localcluster.nodes import Cluster
from tests.e2e.jobs import Job, main_job, step_after_reset, steps_of, stock_script
from tests.e2e.test_stock_lane import stock_command

PLAN = ("evict", "drain", "delete", "taint", "condition") * 2


def announce(job: Job, kind: str, victim: str, node: str,
             undo: contextlib.ExitStack) -> float:
    """Announce that `victim` (on `node`) goes; return the wall time the call returned."""
    core = job.core
    if kind == "evict":
        job.evict(victim)
    elif kind == "drain":
        undo.callback(job.kubectl, "uncordon", node, namespaced=False)
        job.drain(node)
        # The drain returns once the pod is gone: the cordon was its announcement.
    elif kind == "delete":
        job.kubectl("delete", "pod", victim, "--wait=false")
    elif kind == "taint":
        core.patch_node(node, {"spec": {"taints": [{
            "key": "ToBeDeletedByClusterAutoscaler", "value": str(int(time.time())),
            "effect": "NoSchedule"}]}})
        undo.callback(core.patch_node, node, {"spec": {"taints": None}})
    elif kind == "condition":
        def condition(status: str) -> None:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            core.patch_node_status(node, {"status": {"conditions": [{
                "type": "KernelDeadlock", "status": status, "reason": "DockerHung",
                "message": "bench", "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        condition("True")
        undo.callback(condition, "False")
    return time.time()


def out_of_file_at(job: Job, host: str, t0: float) -> float | None:
    """When the discovery file was first written without `host` after `t0` (a deletion makes
    the pod unusable at once, so the file can go out before the supervisor's `worker.leaving`
    line: the change of the host list is what counts)."""
    removed = [log_time(e) for e in job.logs("workers.changed")
               if log_time(e) >= t0 - 0.5 and host in (e.get("removed") or ())]
    if not removed:
        return None
    written = [log_time(e) for e in job.logs("discovery.written") if log_time(e) >= removed[0]]
    return written[0] if written else None


def one_job(cluster: Cluster, api: client.ApiClient, work: Path) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    with main_job(cluster, api, work, steps=0, command=stock_command(1_000_000),
                  checkpoint=work / "checkpoint", transform=stock_script) as job:
        job.wait_training(past=20, size=2, timeout=420)
        for kind in PLAN:
            job.wait("every node Ready and schedulable", job.nodes_ready, 120)
            # The last disruption's leaves over (a node that held both workers moves them one
            # after the other): two live workers, none being deleted.
            job.wait("no leave under way", lambda: len(job.live_workers()) == 2 and not any(
                p["metadata"].get("deletionTimestamp") for p in job.workers().values()), 120)
            past = (job.last_step() or {"step": 0})["step"] + 10
            job.wait_training(past=past, size=2, timeout=240)
            rank0 = job.rank0_host()
            victim, pod = next((n, p) for n, p in sorted(job.live_workers().items())
                               if p["status"]["podIP"] != rank0)
            node = pod["spec"]["nodeName"]
            with contextlib.ExitStack() as undo:
                started = time.time()
                t0 = announce(job, kind, victim, node, undo)
                if kind == "drain":
                    t0 = started  # the cordon came first (the drain returns once it is gone)
                job.wait(f"{kind}: {victim} gone", lambda v=victim: v not in job.workers(), 120)
                full = job.wait(f"{kind}: full size",
                                lambda t0=t0: step_after_reset(job.records(), t0, 2), 240)
            filed = out_of_file_at(job, pod["status"]["podIP"], started)
            batches = [s["time"] for s in steps_of(job.records())
                       if t0 <= s["time"] <= full["time"]]
            gaps = [b - a for a, b in itertools.pairwise(batches)]
            leaving = [e for e in job.logs("worker.leaving") if e.get("pod") == victim]
            waited = [e for e in job.logs("worker.leave_waits") if e.get("pod") == victim]
            out.append({
                "disruption": kind, "victim": victim, "node": node,
                "leave": leaving[0]["why"] if leaving else None,
                "waited_for_a_join": bool(waited),
                "failed": [d["cause"] for d in job.logs("worker.failed")
                           if d.get("pod") == victim],
                "steps_recomputed": sum(rerun_after(job, t0)),
                "interruption_s": round(max(gaps, default=0.0), 2),
                "announce_to_file_s": None if filed is None else round(max(0.0, filed - t0), 3),
                "full_size_s": round(full["time"] - t0, 2)})
            print(f"bench disruptions: {out[-1]}", flush=True)
        stop_supervisor(job)
        restarts = len(job.logs("horovodrun.started")) - 1
    return {"disruptions": out, "horovodrun_restarts": restarts}


def main() -> dict[str, Any]:
    with on_real_nodes("disruptions") as (cluster, api, tmp):
        job = one_job(cluster, api, tmp)
    rows = job["disruptions"]

    def of(key: str, waited: bool | None = None) -> dict[str, Any] | None:
        s = summary([r[key] for r in rows if r[key] is not None
                     and waited in (None, r["waited_for_a_join"])])
        return None if s is None else {"median": s["median"], "max": s["max"]}

    result = {
        "steps_recomputed": of("steps_recomputed"),
        "interruption_s": of("interruption_s"),
        "announce_to_file_s": of("announce_to_file_s"),
        # the victims that did not have to wait for another worker to join first
        "announce_to_file_s_not_waiting": of("announce_to_file_s", waited=False),
        "left_gracefully": sum(1 for r in rows if r["leave"] and not r["failed"]),
        "disruptions": len(rows),
        "horovodrun_restarts": job["horovodrun_restarts"],
    }
    print(f"disruptions: {result}", flush=True)
    return {"disruptions": result, "disruptions_details": {"plan": list(PLAN), **job}}
