"""Faults in the middle of recoveries (issue 23): a stock script without a checkpoint, the
shipped budgets, one job, twelve faults back to back.

The stock-script lane's script (tests/e2e/stock_train.py: imports nothing of this project)
WITHOUT its checkpoint (a horovodrun restart would start it over at its first batch), as the
main job of the manifests (their policy file: the shipped budgets) on the local cluster with
three real nodes and the real images, 3 PyTorch workers on the two nodes the launcher does not
use, MIN_NP 1. Each fault of PLAN strikes as soon as the job trains at full size again, and two
of them strike while it regroups:

- a replacement killed while it joins: a worker SIGKILLed; its replacement SIGKILLed as soon as
  its training process exists (the survivors are regrouping to take it in);
- rank 0 stopped: rank 0's training process SIGSTOPped (a hung process on a healthy node);
- a node frozen during the regroup: a worker SIGKILLed and, at once, while the survivors reset,
  the whole node of another worker frozen (kubelet, containerd, pods) for FREEZE_S, then thawed;
- a partition during the reset: a worker SIGKILLed and, at once, another worker's pod cut off
  from the network for PARTITION_S.

Each of the four three times. From rank 0's step lines and the supervisor's log, per fault:
resumed (the last blow -> rank 0's first batch after the reset that follows it), full size
(-> the first batch at size 3 again, or at the size left when the budgets dropped a slot),
the steps computed again at each rollback, and the horovodrun restarts since (each one loses
everything such a script trained). For the job: the horovodrun restarts, `RendezvousBroken`
Events, the most blows (kills, freezes, partitions) within any 240 s, whether it still trains
at the end, and the supervisor's decisions (what the budgets did).
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.e2e_stock import rerun_after, stop_supervisor, summary
from localcluster import demo
from localcluster.job import JobError
from localcluster.nodes import Cluster
from tests.e2e.jobs import STOCK, Job, main_job, step_after_reset, steps_of, stock_script
from tests.e2e.test_stock_lane import stock_command
from tests.faults import PodFaults

JOINING = "replacement killed while it joins"
RANK0 = "rank 0 stopped"
NODE = "node frozen during the regroup"
PARTITION = "partition during the reset"
PLAN = (JOINING, RANK0, NODE, PARTITION) * 3
HANGS = (RANK0, NODE, PARTITION)  # found by silence: the resume includes the 3 s timeout
FREEZE_S = PARTITION_S = 60.0
WORKERS = 3
WINDOW_S = 240.0  # "five faults within four minutes"


def _ip(pod: dict[str, Any]) -> str:
    return str(pod["status"]["podIP"])


def _slot(name: str) -> str:
    return name.rsplit("-", 1)[0]


class Sequences:
    """One job's faults; `kills` counts SIGKILLs per slot so that each strikes the slot least
    hit (the shipped per-slot limit is 5: a crash loop, which this is not meant to be)."""

    def __init__(self, job: Job, faults: PodFaults) -> None:
        self.job, self.faults = job, faults
        self.kills: dict[str, int] = {}
        self.out: list[dict[str, Any]] = []

    def others(self) -> list[tuple[str, dict[str, Any]]]:
        """Live workers that do not host rank 0, the least-killed slot first."""
        rank0 = self.job.rank0_host()
        live = [(n, p) for n, p in sorted(self.job.live_workers().items()) if _ip(p) != rank0]
        return sorted(live, key=lambda x: self.kills.get(_slot(x[0]), 0))

    def size(self) -> int:
        """The world size the job should get back to: WORKERS less the slots the supervisor
        dropped (a replacement its budgets refused: the decision's action is Ignore)."""
        dropped = [d for d in self.job.logs("worker.failed") if d.get("action") == "Ignore"]
        return WORKERS - len(dropped)

    def kill(self, name: str) -> None:
        self.kills[_slot(name)] = self.kills.get(_slot(name), 0) + 1
        self.faults.kill(name)

    def run(self, fault: str) -> dict[str, Any]:
        job = self.job
        past = (job.last_step() or {"step": 0})["step"] + 10
        job.wait_training(past=past, size=self.size(), timeout=300)
        strike: Callable[[], tuple[list[str], float, float | None]] = {
            JOINING: self.joining, RANK0: self.rank0, NODE: self.node,
            PARTITION: self.partition}[fault]
        t0 = time.time()
        started = len(job.logs("horovodrun.started"))
        victims, last_blow, ended = strike()
        resumed = job.wait(f"{fault}: resumed",
                           lambda: step_after_reset(job.records(), last_blow), 180)
        if ended is None:
            ended = last_blow
        full = job.wait(f"{fault}: full size",
                        lambda: step_after_reset(job.records(), last_blow, self.size()), 300)
        blows = [t0, last_blow] if fault != RANK0 else [t0]
        return {"fault": fault, "victims": victims, "at": round(t0, 2),
                "blows": [round(t, 2) for t in blows],
                "resumed_s": round(resumed["time"] - last_blow, 2),
                "full_size_s": round(full["time"] - t0, 2),
                "fault_lasted_s": round(ended - t0, 2),
                "steps_rerun": rerun_after(job, t0), "size": self.size(),
                "horovodrun_restarts": len(job.logs("horovodrun.started")) - started}

    def joining(self) -> tuple[list[str], float, float | None]:
        job = self.job
        victim = self.others()[0][0]
        self.kill(victim)
        replacement = job.successor(victim)
        job.wait(f"{replacement}'s training process", lambda: replacement in job.live_workers()
                 and self.faults.training(replacement), 180, interval=0.05)
        t1 = time.time()
        self.kill(replacement)
        return [victim, replacement], t1, None

    def rank0(self) -> tuple[list[str], float, float | None]:
        rank0 = self.job.rank0_host()
        victim = next(n for n, p in self.job.live_workers().items() if _ip(p) == rank0)
        t0 = time.time()
        self.faults.freeze_training(victim)
        return [victim], t0, None

    def node(self) -> tuple[list[str], float, float | None]:
        job = self.job
        rank0 = self.job.rank0_host()
        live = job.live_workers()
        rank0_node = next(p["spec"]["nodeName"] for p in live.values() if _ip(p) == rank0)
        others = self.others()
        frozen = [(n, p) for n, p in others if p["spec"]["nodeName"] != rank0_node]
        if not frozen:
            raise Skip("every worker is on rank 0's node")
        target = frozen[0][1]["spec"]["nodeName"]
        # The worker killed: one outside the node to freeze, else the other one on it (the
        # node then freezes before its kubelet reports the kill).
        killed = next((n for n, p in others if p["spec"]["nodeName"] != target),
                      next((n for n, _ in others if n != frozen[0][0]), None))
        if killed is None:
            raise Skip("no second worker besides rank 0's")
        node = job.cluster.node(target)
        self.kill(killed)
        t1 = time.time()
        job.silence_node(node)
        node.freeze()
        try:
            time.sleep(FREEZE_S)
        finally:
            node.thaw()
        return [killed, *[n for n, p in live.items() if p["spec"]["nodeName"] == target]], \
            t1, time.time()

    def partition(self) -> tuple[list[str], float, float | None]:
        others = self.others()
        if len(others) < 2:
            raise Skip("fewer than two workers besides rank 0's")
        (killed, _), (cut, _) = others[0], others[1]
        self.kill(killed)
        t1 = time.time()
        with self.faults.partition(cut):
            time.sleep(PARTITION_S)
        return [killed, cut], t1, time.time()


class Skip(Exception):
    pass


def diagnose(job: Job, work: Path) -> dict[str, Any]:
    """What a fault that did not recover left: every worker pod (node, phase, why not ready),
    the namespace's Events, and the kubelet log lines about each pod that is not Running
    (written next to the launcher's log)."""
    pods = {}
    for name, p in sorted(job.workers().items()):
        st = p.get("status", {})
        waiting = [c.get("state", {}).get("waiting", {}).get("reason")
                   for c in st.get("containerStatuses") or ()]
        pods[name] = {"node": p.get("spec", {}).get("nodeName"), "phase": st.get("phase"),
                      "deleting": bool(p["metadata"].get("deletionTimestamp")),
                      "waiting": [w for w in waiting if w],
                      "conditions": {c["type"]: c["status"] for c in st.get("conditions") or ()},
                      "created": p["metadata"].get("creationTimestamp")}
    events = [f"{e.last_timestamp or e.event_time} {e.involved_object.name} {e.reason}: "
              f"{(e.message or '')[:200]}"
              for e in job.core.list_namespaced_event(job.namespace).items]
    (work / "events.txt").write_text("\n".join(sorted(events)) + "\n")
    for name, p in pods.items():
        if p["phase"] == "Running" or not p["node"]:
            continue
        with contextlib.suppress(Exception):
            log = job.cluster.node(p["node"]).kubelet.log.read_text(errors="replace")
            lines = [ln for ln in log.splitlines() if name in ln][-60:]
            (work / f"kubelet-{name}.txt").write_text("\n".join(lines) + "\n")
    return {"pods": pods, "events": len(events)}


def most_within(times: list[float], window: float) -> int:
    """PURE: the most of `times` within any `window` seconds."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u - t <= window) for i, t in enumerate(times)),
               default=0)


def one_job(cluster: Cluster, api: client.ApiClient, work: Path) -> dict[str, Any]:
    command = stock_command(10_000_000)  # no --checkpoint: a restart starts it over
    with main_job(cluster, api, work, steps=0, command=command, transform=stock_script,
                  env={"SUPERVISOR_WORKERS": str(WORKERS), "SUPERVISOR_MIN_WORKERS": "1",
                       "SUPERVISOR_MAX_WORKERS": str(WORKERS)}) as job:
        faults = PodFaults(job, STOCK.name)
        seq = Sequences(job, faults)
        trains_at_end = False
        try:
            job.wait_training(past=20, size=WORKERS, timeout=420)
            for fault in PLAN:
                try:
                    seq.out.append(seq.run(fault))
                except Skip as e:
                    seq.out.append({"fault": fault, "skipped": str(e)})
                except JobError as e:  # the job did not recover: say so, and stop here
                    seq.out.append({"fault": fault, "failed": str(e).splitlines()[0][:300],
                                    "diagnosis": diagnose(job, work)})
                print(f"bench e2e_sequences: {seq.out[-1]}"[:3000], flush=True)
                if "failed" in seq.out[-1]:
                    break
            else:
                past = (job.last_step() or {"step": 0})["step"] + 20
                job.wait_training(past=past, size=seq.size(), timeout=300)
                trains_at_end = True
        finally:
            faults.close()
            with contextlib.suppress(Exception):  # whatever ended the sequence: say it
                stop_supervisor(job)
        steps = steps_of(job.records())
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
        decisions = [(d["pod"], d["cause"], d["action"]) for d in job.logs("worker.failed")]
        return {"faults": seq.out, "trains_at_end": trains_at_end,
                "horovodrun_restarts": len(job.logs("horovodrun.started")) - 1,
                "rendezvous_broken": len(job.notes("RendezvousBroken")),
                "first_step": steps[0]["step"] if steps else None,
                "longest_interval_without_a_step_s": round(max(gaps), 2) if gaps else None,
                "most_faults_within_240_s": most_within(
                    [t for f in seq.out for t in f.get("blows", ())], WINDOW_S),
                "kills_per_slot": seq.kills, "decisions": decisions}


def main() -> dict[str, Any]:
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="e2e-sequences-", dir=out))
    print(f"bench e2e_sequences: logs in {tmp}", flush=True)
    with demo.started_cluster() as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        try:
            job = one_job(cluster, api, tmp)
        finally:
            api.close()
    done = [f for f in job["faults"] if "resumed_s" in f]

    def of(kinds: tuple[str, ...]) -> list[float]:
        return [f["resumed_s"] for f in done if f["fault"] in kinds]

    rerun = [n for f in done for n in f["steps_rerun"]]
    hangs = summary(of(HANGS))
    sequences = {
        "faults": len(done),
        "skipped": sum(1 for f in job["faults"] if "skipped" in f),
        "failed": [f["fault"] for f in job["faults"] if "failed" in f],
        "horovodrun_restarts": job["horovodrun_restarts"],
        "rendezvous_broken": job["rendezvous_broken"],
        "resumed_after_hang_s": {"median": hangs["median"], "max": hangs["max"]}
        if hangs else None,
        "resumed_s_by_fault": {k: summary(of((k,))) for k in dict.fromkeys(PLAN)},
        "steps_rerun_max": max(rerun, default=0),
        "most_faults_within_240_s": job["most_faults_within_240_s"],
        "trains_at_end": job["trains_at_end"],
    }
    print(f"e2e_sequences: {sequences}", flush=True)
    return {"e2e_sequences": sequences, "e2e_sequences_details": job}
