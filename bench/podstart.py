"""Worker pod start and join times, the baked-in mode against the sidecar mode, on real nodes.

The stock-script job (bench/e2e_stock.py's: tests/e2e/stock_train.py, default settings, the hook
on) with WORKERS workers, in each mode (manifests/overlays/local, manifests/overlays/sidecar) in
turn on one cluster of real nodes. Every worker pod the supervisor creates, initial or
replacement, is timed by `PodClock` from a watch of the API (local arrival time of each
change) and from the node (the start time of the container's first process, /proc, 10 ms), and
its sshd by connecting to it from this host every 20 ms:
  created -> scheduled -> init container started -> init container done -> main container's
  first process -> sshd accepts -> Ready (the readiness probe, every 2 s) -> joined.
Then ROUNDS times two workers are SIGKILLed at once; joined_k = the fault -> rank 0's first
batch after a reset to a world of (survivors + k), for each replacement k (the second one may
join in a later reset than the first). All times are wall-clock differences on one machine.
The target (issue 38, item 4): the sidecar mode at full size within 1 s of the baked-in mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from bench import store
from bench.e2e_stock import on_real_nodes, summary
from localcluster.job import (
    OVERLAY,
    SIDECAR_OVERLAY,
    WORKER_SELECTOR,
    log_time,
    namespace_pid,
)
from localcluster.nodes import Cluster
from tests.e2e.jobs import Job, main_job, stock_script, with_policy
from tests.e2e.test_stock_lane import stock_command
from tests.faults import PodFaults

MODES = {"baked": OVERLAY, "sidecar": SIDECAR_OVERLAY}
WORKERS = 3
ROUNDS = 3  # two workers SIGKILLed at once, per job
RUNS = 2  # jobs per mode
SSH_PORT = 2222
# In the `podstart` block: a worker pod's start (its sandbox -> sshd listening), a replacement's
# (the fault -> sshd, -> Ready) and the replacements' joins after two kills at once.
BRIEF = ("sandbox_to_sshd_s", "fault_to_sshd_s", "fault_to_ready_s", "joined_first_s",
         "joined_last_s")
MILESTONES = ("scheduled", "sandbox_started", "init_started", "init_last_seen",
              "init_done_reported", "container_started", "sshd", "running_reported", "ready")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def process_started(pid: int, boot: float) -> float | None:
    """The wall time process `pid` started (clock ticks since boot: 10 ms); None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


class PodClock:
    """The milestones of every worker pod of `job`, as wall times (time.time()): from a watch
    of the API (arrival here: created, scheduled, the kubelet's reports of the init container,
    the main container running, Ready) and from the pod's processes on its node, polled every
    POLL_S (the sandbox's, the init container's and the main container's first process start,
    /proc, 10 ms; the init container's end, seen gone; sshd listening on SSH_PORT)."""

    POLL_S = 0.02

    def __init__(self, cluster: Cluster, job: Job) -> None:
        self.cluster, self.job = cluster, job
        self.pods: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._polling: set[str] = set()
        self._boot = _boot_time()
        self._threads = [threading.Thread(target=self._watch, daemon=True, name="podclock")]
        self._threads[0].start()

    def _mark(self, pod: str, key: str, at: float | None = None) -> None:
        with self._lock:
            self.pods.setdefault(pod, {}).setdefault(key, time.time() if at is None else at)

    def _watch(self) -> None:
        """List, then watch from the list's resourceVersion on (no change missed between)."""
        core = client.CoreV1Api(self.job.api)
        rv = None
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                if rv is None:
                    listed = json.loads(core.list_namespaced_pod(
                        self.job.namespace, label_selector=WORKER_SELECTOR,
                        _preload_content=False).data)
                    for pod in listed["items"]:
                        self._seen(pod)
                    rv = listed["metadata"]["resourceVersion"]
                w = watch.Watch()
                for ev in w.stream(core.list_namespaced_pod, self.job.namespace,
                                   label_selector=WORKER_SELECTOR, resource_version=rv,
                                   timeout_seconds=30, allow_watch_bookmarks=True,
                                   deserialize=False):
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    rv = ev["object"]["metadata"]["resourceVersion"]
                    if ev["type"] != "BOOKMARK":
                        self._seen(ev["object"])
                    if self._stop.is_set():
                        break
                continue
            rv = None
            time.sleep(0.1)

    def _seen(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        self._mark(name, "created")
        if spec.get("nodeName"):
            self._mark(name, "scheduled")
            if name not in self._polling:
                self._polling.add(name)
                t = threading.Thread(target=self._poll, args=(name, pod), daemon=True)
                self._threads.append(t)
                t.start()
        for s in status.get("initContainerStatuses") or ():
            state = s.get("state") or {}
            if "terminated" in state:
                self._mark(name, "init_done_reported")
        for s in status.get("containerStatuses") or ():
            if "running" in (s.get("state") or {}):
                self._mark(name, "running_reported")
        if any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or ()):
            self._mark(name, "ready")

    def _poll(self, name: str, pod: dict[str, Any]) -> None:
        """The pod's processes on its node until sshd listens (at most 120 s)."""
        node = self.cluster.node(pod["spec"]["nodeName"])
        uid = pod["metadata"]["uid"]
        seen: dict[int, str] = {}  # pid -> what it is
        end = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < end:
            pids = node.pod_pids(uid)
            for pid in pids - seen.keys():
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if argv[0].endswith(b"runc") or argv[:2] == [b"runc", b"init"]:
                        continue  # not exec'd yet: looked at again at the next poll
                    kind = ("sandbox" if argv[0] == b"/pause"
                            else "init" if b"install" in argv
                            else "container" if namespace_pid(pid) == 1 else "")
                    seen[pid] = kind
                    started = process_started(pid, self._boot)
                    if kind and started is not None:
                        self._mark(name, f"{kind}_started", started)
            if any(k == "init" for p, k in seen.items() if p in pids):
                with self._lock:  # the init container's end lies between this and the next
                    self.pods[name]["init_last_seen"] = time.time()
            if any(_listens(p, SSH_PORT) for p in pids):
                self._mark(name, "sshd")
                return
            time.sleep(self.POLL_S)

    def created(self, pod: str) -> float | None:
        """When `pod` was created: the supervisor's `worker.created` (logged once its create
        returned) or the watch's first sight of it, whichever is earlier."""
        with self._lock:
            seen = self.pods.get(pod, {}).get("created")
        logged = [log_time(r) for r in self.job.logs("worker.created") if r.get("pod") == pod]
        return min([t for t in (seen, *logged) if t], default=None)

    def since_created(self, pod: str) -> dict[str, float]:
        with self._lock:
            marks = dict(self.pods.get(pod, {}))
        t0 = self.created(pod)
        return {} if t0 is None else {k: round(v - t0, 3) for k, v in marks.items()
                                      if k != "created"}

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(6)


def _listens(pid: int, port: int) -> bool:
    """Whether a socket of `pid`'s network namespace listens on TCP `port`."""
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def joined_at(records: list[dict[str, Any]], t0: float, size: int) -> dict[str, Any] | None:
    """Rank 0's first batch after the first reset after `t0` to a world of `size` or more
    (two replacements may join in one reset)."""
    for i, r in enumerate(records):
        if r.get("event") == "reset" and r["time"] > t0 and r["size"] >= size:
            return next((s for s in records[i:] if "loss" in s), None)
    return None


@contextlib.contextmanager
def timed_job(cluster: Cluster, api: client.ApiClient, work: Path,
              overlay: Path) -> Iterator[tuple[Job, PodClock]]:
    def fast_backoff(docs: list[dict[str, Any]]) -> None:
        stock_script(docs)
        with_policy(lambda p: p.update(backoff={"initialSeconds": 1, "maxSeconds": 1}))(docs)

    with main_job(cluster, api, work, steps=0, command=stock_command(1_000_000),
                  checkpoint=work / "checkpoint", transform=fast_backoff, overlay=overlay,
                  env={"SUPERVISOR_WORKERS": str(WORKERS)}) as job:
        clock = PodClock(cluster, job)
        try:
            yield job, clock
        finally:
            clock.close()


def one_job(cluster: Cluster, api: client.ApiClient, work: Path, overlay: Path,
            rounds: int = ROUNDS) -> dict[str, Any]:
    """One job of `overlay`: its first workers' start, then `rounds` double kills."""
    with timed_job(cluster, api, work, overlay) as (job, clock):
        faults = PodFaults(job, "stock_train.py")
        try:
            job.wait_training(past=10, size=WORKERS, timeout=420)
            first = sorted(job.live_workers())
            initial = {p: clock.since_created(p) for p in first}
            kills = []
            for _ in range(rounds):
                job.settled(WORKERS)
                past = (job.last_step() or {"step": 0})["step"] + 10
                job.wait_training(past=past, size=WORKERS, timeout=240)
                victims = sorted(job.live_workers())[:2]
                t0 = time.time()
                faults.kill(*victims)
                survivors = WORKERS - len(victims)
                joined = []
                for k in range(1, len(victims) + 1):
                    step = job.wait(f"a world of {survivors + k} after the kill",
                                    lambda n=survivors + k, t0=t0: joined_at(
                                        job.records(), t0, n), 240)
                    joined.append(round(step["time"] - t0, 2))
                pods = [job.successor(v) for v in victims]
                kills.append({"victims": victims, "joined_s": joined,
                              "replacements": {p: clock.since_created(p) for p in pods},
                              "created_after_fault_s": [
                                  round(c - t0, 3) for p in pods
                                  if (c := clock.created(p)) is not None]})
                print(f"bench podstart: {kills[-1]}", flush=True)
        finally:
            faults.close()
    return {"initial": initial, "kills": kills}


def mode_summary(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every worker pod of `jobs` (one mode): its start from its sandbox (the pause
    process: an anchor on the node, untouched by API or log delays) to the init container, the
    main container's first process, sshd listening and Ready; for the replacements, the fault
    to their sandbox, sshd and Ready; the joins; and every milestone since the pod's creation
    (the supervisor's log or the watch: both can lag the API by 0.5 s on a loaded machine)."""
    pods = [m for j in jobs for m in [*j["initial"].values(),
                                      *(r for k in j["kills"] for r in k["replacements"].values())]]
    out: dict[str, Any] = {}
    for key in ("init_started", "init_last_seen", "container_started", "sshd", "ready"):
        s = summary([m[key] - m["sandbox_started"] for m in pods
                     if key in m and "sandbox_started" in m])
        if s is not None:
            out[f"sandbox_to_{key}_s"] = s
    replaced = [(m, after) for j in jobs for k in j["kills"]
                for m, after in zip(k["replacements"].values(), k["created_after_fault_s"],
                                    strict=False)]
    for key in ("sandbox_started", "sshd", "ready"):
        out[f"fault_to_{key}_s"] = summary([after + m[key] for m, after in replaced if key in m])
    out["joined_first_s"] = summary([k["joined_s"][0] for j in jobs for k in j["kills"]])
    out["joined_last_s"] = summary([k["joined_s"][-1] for j in jobs for k in j["kills"]])
    out["since_created_s"] = {key: s for key in MILESTONES
                              if (s := summary([m[key] for m in pods if key in m]))}
    return out


def brief(by_mode: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `podstart` block: median and max of BRIEF per mode."""
    return {m: {k: {"median": v["median"], "max": v["max"]} for k, v in s.items()
                if k in BRIEF and v} for m, s in by_mode.items()}


def main(runs: int = RUNS, rounds: int = ROUNDS, before: Path | None = None) -> dict[str, Any]:
    """Measure; return the `podstart` block (per mode: median and max of the pod start and
    the joins) and `podstart_details` (every sample, and `before`: the blocks an earlier run
    of this benchmark wrote with --out, e.g. at the commit before a change)."""
    jobs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    measured = store.provenance()  # the code that runs: the tree as it is now
    with on_real_nodes("podstart") as (cluster, api, tmp):
        for i in range(runs):
            for mode, overlay in MODES.items():
                work = tmp / f"{mode}{i}"
                work.mkdir()
                print(f"bench podstart: {mode} job {i + 1} of {runs}", flush=True)
                jobs[mode].append(one_job(cluster, api, work, overlay, rounds))
                (tmp / "jobs.json").write_text(json.dumps(jobs, indent=1))
    per_mode = {m: mode_summary(jobs[m]) for m in MODES}
    print(f"podstart: {json.dumps(brief(per_mode))}", flush=True)
    details: dict[str, Any] = {"provenance": measured, "workers": WORKERS,
                               "runs": runs, "rounds": rounds, "by_mode": per_mode,
                               "jobs": jobs}
    if before is not None:
        # An earlier run's samples, summed up by this code (the same rules on both sides).
        earlier = json.loads(before.read_text())["podstart_details"]
        then = {m: mode_summary(earlier["jobs"][m]) for m in MODES}
        details["before"] = {"podstart": brief(then), "provenance": earlier["provenance"],
                             "by_mode": then, "jobs": earlier["jobs"]}
    return {"podstart": brief(per_mode), "podstart_details": details}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.podstart", description=__doc__)
    parser.add_argument("--runs", type=int, default=RUNS, help="jobs per mode (%(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="double kills per job (%(default)s)")
    parser.add_argument("--before", type=Path,
                        help="the --out file of an earlier run, kept as `before`")
    parser.add_argument("--out", type=Path,
                        help="write the blocks here instead of into bench/results.json")
    args = parser.parse_args()
    blocks = main(args.runs, args.rounds, args.before)
    if args.out is not None:
        args.out.write_text(json.dumps(blocks, indent=1) + "\n")
        print(f"wrote {args.out}")
    else:
        print(f"wrote {store.record(blocks)}")
