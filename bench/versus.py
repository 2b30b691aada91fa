"""Side by side: the supervisor and the 5 s poller baseline (bench/baseline.py) on the same
worker pods in the same run, each keeping its own host file, each file watched by inotify.
Every change is applied once, to the API, and both files are judged on it.

Changes, in a shuffled order with random (exponential) gaps so that they land at random phases
of the poll period:
- seen by both (latency samples for both; the speedup is computed on these only):
  a pod goes Failed (exit 1: the supervisor's default policy drops it, nothing is replaced),
  a pod is deleted (grace 0: what the kubelet's final delete does), a new pod goes
  Pending -> Running (Ready).
- never seen by the poller (its rule keeps the host): a Ready flip while the phase stays
  Running, a graceful delete (deletionTimestamp set, still Running while the kubelet stops it),
  a node going NotReady (its pods stay Running). Each is held until a poll that started after
  the write has completed, then undone; the poller "never saw" it if its file kept the host(s)
  all along. Undoing is not a sample.
t0 is taken just before the API call; t1 is the inotify time of the first rename after t0
whose content shows the change. Ours is awaited before the next change (one change in flight
for the supervisor, like bench/discovery.py); the poller's files are judged afterwards.
The API requests of both come from the apiserver's audit log (bench/audit.py).
The supervisor is kept passive: no worker template (it creates and deletes nothing) and a
node grace of a day (a NotReady node only makes its workers unusable).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes import client

from bench import audit, baseline
from bench.discovery import PODS_PER_NODE, percentiles
from bench.inotify import RenameWatcher
from localcluster.controlplane import ControlPlane, Settings
from localcluster.kubelet import pod_status_running, set_node_ready
from supervisor import kube
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import Job, SupervisorProcess

ROOT = Path(__file__).resolve().parent.parent
DRIVER_AGENT = "es-bench-driver"
PERIOD_S = 5.0
NOT_READY_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def node_tainted(core: client.CoreV1Api, node: str) -> bool:
    """Whether the node still carries the node controller's not-ready/unreachable taint."""
    taints = core.read_node(node).spec.taints or ()
    return any(t.key in NOT_READY_TAINTS for t in taints)


class Change(StrEnum):
    FAILED = "pod failed"
    DELETED = "pod deleted"
    STARTED = "pod started"
    NOT_READY = "pod not ready"
    TERMINATING = "pod terminating"
    NODE_NOT_READY = "node not ready"


@dataclass(frozen=True)
class Plan:
    """What one comparison run does: how many workers and changes (counts), how fast."""

    workers: int = 1000
    per_sampled_kind: int = 100  # changes of each kind both can see
    not_ready: int = 40
    terminating: int = 20
    node_not_ready: int = 8
    mean_gap_s: float = 1.5  # mean of the exponential gap between two changes
    seed: int = 8

    @classmethod
    def scaled(cls, workers: int, per_sampled_kind: int) -> Plan:
        """A plan whose never-seen changes keep the default proportions (40/20/8 to 100)."""
        c = per_sampled_kind
        return cls(workers=workers, per_sampled_kind=c, not_ready=max(1, 2 * c // 5),
                   terminating=max(1, c // 5), node_not_ready=max(1, c // 12))

    def changes(self, rng: random.Random) -> list[Change]:
        """Every change of the run, shuffled; ValueError if the workers are too few."""
        plan = [k for k in SAMPLED for _ in range(self.per_sampled_kind)]
        plan += ([Change.NOT_READY] * self.not_ready + [Change.TERMINATING] * self.terminating
                 + [Change.NODE_NOT_READY] * self.node_not_ready)
        nodes = max(2, -(-self.workers // PODS_PER_NODE))
        needed = sum(1 for k in plan if k not in (Change.STARTED, Change.NODE_NOT_READY))
        if needed > self.workers * (nodes - 1) // nodes:
            raise ValueError(f"{needed} pod changes need more than {self.workers} workers")
        rng.shuffle(plan)
        return plan


SAMPLED = (Change.FAILED, Change.DELETED, Change.STARTED)
UNSEEN = (Change.NOT_READY, Change.TERMINATING, Change.NODE_NOT_READY)
Hosts = frozenset[str]


@dataclass
class Applied:
    """One change as applied: when, and how each host file shows it."""

    kind: Change
    target: str
    t0: float  # perf_counter just before the API call
    written: float  # the API call returned
    ours_s: float  # t0 -> the supervisor's rename showing it
    poller_shows: Callable[[Hosts], bool]
    hosts: int = 1  # hosts the change concerns
    undone: float | None = None  # t0 of the write that undid it (never-seen kinds)


class FileHistory:
    """Every rename of one file: (inotify time, its lines read right after), for queries."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.watcher = RenameWatcher(str(path.parent))
        self.snaps: list[tuple[float, Hosts]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def lines(self) -> Hosts:
        try:
            return frozenset(self.path.read_text().splitlines())
        except FileNotFoundError:
            return frozenset()

    def _run(self) -> None:
        while not self._stop.is_set():
            t, name = self.watcher.events.get()
            if name == self.path.name:
                lines = self.lines()
                with self._cond:
                    self.snaps.append((t, lines))
                    self._cond.notify_all()

    def first(self, after: float, pred: Callable[[Hosts], bool]) -> float | None:
        """The time of the first rename after `after` whose content satisfies `pred`."""
        with self._cond:
            return next((t for t, lines in self.snaps if t > after and pred(lines)), None)

    def wait(self, after: float, pred: Callable[[Hosts], bool], timeout: float,
             what: str) -> float:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (t := self.first(after, pred)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.path} never showed {what}")
                self._cond.wait(left)
        return t

    def close(self) -> None:
        self._stop.set()
        self.watcher.events.put((0.0, ""))
        self.watcher.close()


class Poller:
    """The baseline as a subprocess (its own session), with its poll log."""

    def __init__(self, cp: ControlPlane, namespace: str, selector: str, work: Path) -> None:
        self.file = work / "poller" / "hostfile"
        self.history = FileHistory(self.file)
        self.log = work / "poller.jsonl"
        self._offset, self.polls = 0, []
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.baseline", "--kubeconfig", str(cp.kubeconfig),
                 "--namespace", namespace, "--selector", selector, "--out", str(self.file),
                 "--period", str(PERIOD_S)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def read_polls(self) -> list[dict[str, Any]]:
        with self.log.open() as f:
            f.seek(self._offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._offset += len(line.encode())
                entry = json.loads(line)
                if entry.get("event") == "poll":
                    self.polls.append(entry)
        return self.polls

    def polled_since(self, t: float) -> bool:
        """Whether a poll that started after `t` has completed."""
        return any(p["start"] > t for p in self.read_polls())

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.history.close()


class Scenario:
    """N Running, Ready workers on ceil(N/100) nodes (at least 2), the supervisor and the
    poller. The last node is kept for node changes; pod changes use the other nodes' pods.
    If starting fails half-way, what was started is stopped again."""

    def __init__(self, cp: ControlPlane, api: client.ApiClient, *, work: Path, plan: Plan,
                 rng: random.Random) -> None:
        n = plan.workers
        self.core = client.CoreV1Api(api)
        self._stack = contextlib.ExitStack()
        with self._stack as stack:
            self.ns = make_namespace(self.core)
            stack.callback(self.core.delete_namespace, self.ns)
            self.job = Job(api, self.ns)
            stack.callback(self.job.close)
            self.nodes = [self.job.node(f"n{i}")
                          for i in range(max(2, -(-n // PODS_PER_NODE)))]
            self.node_pods: dict[str, list[str]] = {nd: [] for nd in self.nodes}
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(self._create, range(n)))
            self.free = sorted((p for nd in self.nodes[:-1] for p in self.node_pods[nd]),
                               key=lambda p: int(p[1:]))
            rng.shuffle(self.free)
            self.started = 0
            self.sup = SupervisorProcess(
                cp, self.ns, work, SUPERVISOR_NP="1",
                SUPERVISOR_MAX_NP=str(n + plan.per_sampled_kind), SUPERVISOR_LOG_LEVEL="info",
                SUPERVISOR_RESYNC_SECONDS="1", SUPERVISOR_NODE_GRACE_SECONDS="86400",
                FAKE_POLL_S="1")
            self.ours = FileHistory(self.sup.discovery_file)
            stack.callback(self.ours.close)
            selector = ",".join(f"{k}={v}" for k, v in self.job.labels().items())
            self.poller = Poller(cp, self.ns, selector, work)
            stack.callback(self.poller.close)
            self.sup_started = time.time()
            self.sup.start()
            stack.callback(self.sup.close)
            wait_for(lambda: (len(self.ours.lines()) == n
                              and len(self.poller.history.lines()) == n),
                     180, interval=0.5, what=f"{n} lines in both host files")
            self._stack = stack.pop_all()

    def _create(self, i: int) -> None:
        node = self.nodes[i % len(self.nodes)]
        self.job.worker(f"w{i}", node)
        self.node_pods[node].append(f"w{i}")

    def close(self) -> None:
        self._stack.close()


class Driver:
    """Applies changes to a Scenario, awaits the supervisor on each and undoes the never-seen
    ones once the poller had a full poll to see them."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.applied: list[Applied] = []
        self.to_undo: list[tuple[Applied, Callable[[], None]]] = []

    def idle(self, seconds: float) -> None:
        """Wait `seconds`, undoing never-seen changes as soon as they have been polled."""
        deadline = time.perf_counter() + seconds
        while True:
            for a, undo in list(self.to_undo):
                if self.s.poller.polled_since(a.written):
                    self.to_undo = [x for x in self.to_undo if x[0] is not a]
                    a.undone = time.perf_counter()
                    undo()
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            time.sleep(min(0.05, left))

    def ours_wait(self, t0: float, pred: Callable[[Hosts], bool], what: str) -> float:
        try:
            return self.s.ours.wait(t0, pred, 30, what) - t0
        except TimeoutError as e:
            tail = "\n".join(self.s.sup.output().splitlines()[-8:])
            raise TimeoutError(f"{e}; supervisor log tail:\n{tail}") from None

    def apply(self, kind: Change) -> None:
        s, core, ns = self.s, self.s.core, self.s.ns
        if kind is Change.NODE_NOT_READY:
            self._node_not_ready()
            return
        if kind is Change.STARTED:
            pod = f"s{s.started}"
            s.started += 1
            s.job.worker(pod, s.nodes[s.started % (len(s.nodes) - 1)], running=False)
        else:
            pod = s.free.pop()
        write = {
            Change.STARTED: lambda: s.job.start(pod),
            Change.FAILED: lambda: s.job.terminate(pod, 1),
            Change.DELETED: lambda: core.delete_namespaced_pod(pod, ns, grace_period_seconds=0),
            Change.NOT_READY: lambda: core.patch_namespaced_pod_status(
                pod, ns, {"status": pod_status_running(s.job.ips[pod], False)}),
            Change.TERMINATING: lambda: core.delete_namespaced_pod(pod, ns,
                                                                   grace_period_seconds=30),
        }[kind]
        added = kind is Change.STARTED
        t0 = time.perf_counter()
        write()
        written = time.perf_counter()
        line, name = s.job.line(pod), f"{pod}:1"
        ours = self.ours_wait(t0, lambda h: (line in h) == added, f"{kind} {pod}")
        a = Applied(kind, pod, t0, written, ours, lambda h: (name in h) == added)
        self.applied.append(a)
        if kind is Change.NOT_READY:
            self.to_undo.append((a, lambda: self._undo_not_ready(pod, line)))
        elif kind is Change.TERMINATING:
            self.to_undo.append((a, lambda: core.delete_namespaced_pod(
                pod, ns, grace_period_seconds=0)))

    def _undo_not_ready(self, pod: str, line: str) -> None:
        t0 = time.perf_counter()
        self.s.core.patch_namespaced_pod_status(
            pod, self.s.ns, {"status": pod_status_running(self.s.job.ips[pod], True)})
        self.ours_wait(t0, lambda h: line in h, f"{pod} ready again")

    def _node_not_ready(self) -> None:
        s = self.s
        node = s.nodes[-1]
        while any(a.target == node for a, _ in self.to_undo):
            self.idle(0.1)
        pods = s.node_pods[node]
        lines = {s.job.line(p) for p in pods}
        names = {f"{p}:1" for p in pods}
        s.job.heartbeats.silence(node)  # else its next heartbeat reports Ready again
        t0 = time.perf_counter()
        set_node_ready(s.core, node, "False")
        written = time.perf_counter()
        ours = self.ours_wait(t0, lambda h: not lines & h, f"{node} not ready")
        a = Applied(Change.NODE_NOT_READY, node, t0, written, ours,
                    lambda h: not names & h, hosts=len(pods))
        self.applied.append(a)

        def undo() -> None:
            t = time.perf_counter()
            s.job.heartbeats.resume(node)
            # The supervisor rightly keeps the node's pods out while it carries the
            # controller's not-ready taint, which the real node-lifecycle controller removes
            # on its own time (once it did not for over 30 s): wait for that first (the file
            # may change meanwhile: versions since `t` count). Undos are not measured.
            wait_for(lambda: not node_tainted(s.core, node), 180,
                     what=f"the node controller to untaint {node}")
            # A heartbeat already under way when the node was silenced can report it Ready
            # again at once: then the file has its hosts back already and no rename follows.
            if not lines <= s.ours.lines():
                self.ours_wait(t, lambda h: lines <= h, f"{node} ready again")

        self.to_undo.append((a, undo))


def judge(applied: list[Applied], poller: Poller) -> dict[str, Any]:
    """Poller latencies of the sampled kinds, and which never-seen changes it did not see."""
    polls = poller.read_polls()
    samples: dict[Change, list[float]] = {k: [] for k in Change}
    ours: dict[Change, list[float]] = {k: [] for k in Change}
    unseen: dict[str, dict[str, int]] = {
        k.value: {"changes": 0, "never_seen": 0, "seen": 0, "not_held": 0, "hosts": 0}
        for k in UNSEEN}
    missed = 0
    for a in applied:
        ours[a.kind].append(a.ours_s)
        t1 = poller.history.first(a.t0, a.poller_shows)
        if a.kind in SAMPLED:
            if t1 is None:
                missed += 1
            else:
                samples[a.kind].append(t1 - a.t0)
            continue
        u = unseen[a.kind.value]
        u["changes"] += 1
        u["hosts"] += a.hosts
        end = a.undone if a.undone is not None else float("inf")
        held = any(p["start"] > a.written and p["end"] < end and "error" not in p
                   for p in polls)
        if t1 is not None and t1 < end:
            u["seen"] += 1
        elif held:
            u["never_seen"] += 1
        else:
            u["not_held"] += 1
    both = [x for k in SAMPLED for x in samples[k]]
    ours_same = [x for k in SAMPLED for x in ours[k]]
    ok = [p for p in polls if "error" not in p]
    # Does the poller's list (the apiserver serializing every pod, on the same cores) slow the
    # supervisor? Its samples split by whether a list was in flight while they were taken.
    during: dict[bool, list[float]] = {True: [], False: []}
    for a in applied:
        if a.kind in SAMPLED:
            during[any(p["start"] < a.t0 + a.ours_s and p["end"] > a.t0 for p in ok)].append(
                a.ours_s)
    return {
        "poller": percentiles(both) if both else None,
        "ours": percentiles(ours_same) if ours_same else None,
        "per_kind": {k.value: {"ours": percentiles(ours[k]) if ours[k] else None,
                               "poller": percentiles(samples[k]) if samples[k] else None}
                     for k in Change},
        "ours_while_poller_lists": percentiles(during[True]) if during[True] else None,
        "ours_otherwise": percentiles(during[False]) if during[False] else None,
        "never_seen_by_poller": unseen,
        "poller_missed": missed,
        "poller_list_ms": percentiles([p["end"] - p["start"] for p in ok]) if ok else None,
        "poller_list_kib": round(sorted(p["bytes"] for p in ok)[len(ok) // 2] / 1024, 1)
        if ok else None,
        "poller_failed_polls": len(polls) - len(ok),
    }


def client_of(agent: str) -> str | None:
    """Who sent a request, by User-Agent: the poller, the supervisor (the Python client's
    default agent: nothing else here keeps it), or someone else (None: not counted)."""
    if agent.startswith(baseline.USER_AGENT):
        return "poller"
    if agent.startswith("OpenAPI-Generator/"):
        return "supervisor"
    return None


def request_rates(cp: audit.AuditedControlPlane, sup_started: float, since: float,
                  until: float, list_kib: float | None) -> dict[str, Any]:
    """Requests per minute of the poller and the supervisor in [since, until) (wall clock),
    what they were, and how long the supervisor's finished watches lasted."""
    reqs = audit.read(cp.audit_log)

    def count(who: str, t0: float) -> Counter[str]:
        return Counter(f"{r.verb} {r.what}" for r in reqs
                       if client_of(r.agent) == who and t0 <= r.received < until)

    minutes = (until - since) / 60
    sup, polls = count("supervisor", since), count("poller", since)
    reads = sum(v for k, v in sup.items() if k.split()[0] in ("list", "watch", "get"))
    per_min = round(polls.total() / minutes, 2)
    return {
        "poller": per_min,
        "supervisor": round(sup.total() / minutes, 2),
        "supervisor_reads": round(reads / minutes, 2),
        "window_s": round(until - since, 1),
        "poller_requests": dict(sorted(polls.items())),
        "supervisor_requests": dict(sorted(sup.items())),
        "supervisor_requests_since_start": dict(sorted(count("supervisor", sup_started).items())),
        "supervisor_watch_lifetimes_s": sorted(
            round(r.completed - r.received, 1) for r in reqs
            if client_of(r.agent) == "supervisor" and r.verb == "watch"
            and r.completed is not None),
        "poller_list_mib_per_min": round(per_min * list_kib / 1024, 1) if list_kib else None,
        "source": "kube-apiserver audit log: requests received in the window, by User-Agent",
    }


def run(cp: audit.AuditedControlPlane, api: client.ApiClient, plan: Plan,
        work: Path) -> dict[str, Any]:
    rng = random.Random(plan.seed)
    changes = plan.changes(rng)
    s = Scenario(cp, api, work=work, plan=plan, rng=rng)
    try:
        d = Driver(s)
        since = time.time()
        load: list[float] = []  # the machine's 1-min load average, at each change
        for kind in changes:
            d.idle(rng.expovariate(1 / plan.mean_gap_s))
            load.append(os.getloadavg()[0])
            d.apply(kind)
        while d.to_undo:
            d.idle(0.1)
        d.idle(PERIOD_S * 1.5)  # the poller's last samples
        until = time.time()
        out = judge(d.applied, s.poller)
        out["load_average_1min"] = {"median": round(statistics.median(load), 2),
                                    "max": round(max(load), 2), "cpus": os.cpu_count()}
        rates = request_rates(cp, s.sup_started, since, until, out["poller_list_kib"])
        # The supervisor's writes in the window are Events about these changes and undos.
        rates["changes_in_window"] = len(d.applied) + sum(a.undone is not None
                                                          for a in d.applied)
        out["api_requests_per_min"] = rates
        if s.sup.proc is not None and s.sup.proc.poll() is not None:
            raise RuntimeError(f"the supervisor exited with {s.sup.proc.returncode}")
    finally:
        s.close()
    return out


def main(plan: Plan | None = None) -> dict[str, Any]:
    """Run the comparison; return the baseline part of bench/results.json."""
    plan = plan or Plan()
    n = plan.workers
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="es-bench-poll-") as tmp,
        audit.AuditedControlPlane(Settings(node_monitor_grace_period_s=40)) as cp,
    ):
        api = kube.make_api_client(str(cp.kubeconfig))
        api.user_agent = DRIVER_AGENT
        try:
            r = run(cp, api, plan, Path(tmp))
        finally:
            api.close()
    rates = r.pop("api_requests_per_min")
    poller, ours = r["poller"], r["ours"]
    speedup = (round(poller["p99"] / ours["p99"], 1)
               if poller and ours and ours["p99"] > 0 else None)
    r.update(
        when=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        poll_period_s=PERIOD_S, sampled_kinds=[k.value for k in SAMPLED],
        never_seen_kinds=[k.value for k in UNSEEN], mean_gap_s=plan.mean_gap_s,
        wall_s=round(time.monotonic() - started, 1))
    print(f"baseline n={n}: poller {poller}, ours (same kinds) {ours}, speedup p99 {speedup}x; "
          f"never seen by the poller: {r['never_seen_by_poller']}; requests/min: poller "
          f"{rates['poller']}, supervisor {rates['supervisor']} ({r['wall_s']}s)", flush=True)
    return {
        "baseline_poll_latency_ms": {str(n): poller},
        "baseline_poll_api_requests_per_min": rates,
        "speedup_vs_poll_p99": speedup,
        "baseline_poll_details": {str(n): r},
    }
