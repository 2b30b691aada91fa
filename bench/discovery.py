"""Discovery at scale: 10 to 10,000 workers on kwok's simulated nodes, one fresh local control
plane (with the audit log) and one kwok per size, and the real `elastic-supervisor run` with the
stand-in horovodrun polling the discovery script once a second like horovodrun does.

kwok plays the kubelets (localcluster/kwok.py): it makes the ceil(N/100) nodes (at least 2)
Ready and renews their Leases, starts every worker pod (Pending -> Running -> Ready, a pod IP
from its node's CIDR), finishes graceful deletions, and reports a node NotReady when asked
through its chaos label. Per size, in this order:
1. startup: supervisor process started -> the first discovery file with all N workers (inotify);
2. idle: RSS and CPU of the supervisor over IDLE_S seconds with nothing changing;
3. latency, one change in flight, round robin: a pod's Ready condition False then True, a
   graceful pod delete, a node NotReady then Ready again (kwok's node-not-ready Stage);
4. storm: STORM_RATE Ready flips per second for STORM_S seconds; the supervisor's CPU and peak
   RSS meanwhile, and how long after the last write its file is right again;
5. a node whose 100 workers all go at once (one DeleteCollection, graceful: kwok deletes them a
   second later), the last kind because it takes workers away for good; reported apart from
   the latency of steps 3, whose kinds (and key) are those of the earlier benchmark.
Latency: t0 just before the API call that asks for the change, t1 when inotify reports the
rename after which the file shows it, so each sample includes the API write and the watch
delivery; for a node NotReady the API call is the label write and kwok's own status write is
in the sample too. The Ready flips are written by the benchmark itself: kwok's Stages react to
what they see with a delay of their own, so the benchmark would not know when the flip was
written. API requests of the supervisor per minute come from kube-apiserver's audit log.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client

from bench import audit
from bench.inotify import RenameWatcher
from localcluster import kwok
from localcluster.controlplane import Settings
from localcluster.kubelet import pod_status_running
from supervisor import kube
from tests.conftest import make_namespace
from tests.integration.harness import SupervisorProcess

PODS_PER_NODE = 100
SIZES = (10, 100, 1000, 5000, 10000)
DRIVER_AGENT = "es-bench-driver"
IDLE_S = 20.0
STORM_RATE = 50.0  # changes per second
STORM_S = 20.0
JOB_LABELS = {"elastic-supervisor/job": "job1", "elastic-supervisor/role": "worker"}


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds (nearest-rank), and the sample count."""
    s = sorted(samples)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))] * 1000

    return {
        "p50": round(statistics.median(s) * 1000, 2),
        "p99": round(rank(99), 2),
        "max": round(s[-1] * 1000, 2),
        "n": len(s),
    }


def nodes_for(n: int) -> int:
    return max(2, -(-n // PODS_PER_NODE))


def worker_body(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(JOB_LABELS)},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "worker", "image": "worker:local"}]}}


def list_pods(core: client.CoreV1Api, ns: str) -> Iterator[dict[str, Any]]:
    """Every pod of `ns`, paged like a reflector (500 per page)."""
    token = None
    while True:
        kw: dict[str, Any] = {"limit": 500, "_preload_content": False}
        if token:
            kw["_continue"] = token
        body = json.loads(core.list_namespaced_pod(ns, **kw).data)
        yield from body.get("items") or ()
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return


def running_ready(p: dict[str, Any]) -> bool:
    st = p.get("status") or {}
    return st.get("phase") == "Running" and bool(st.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in st.get("conditions") or ())


class Sampler:
    """Samples the supervisor's RSS every `period_s` from a thread; `peak` since `reset`."""

    def __init__(self, pid: int, period_s: float = 0.5) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss / 2**20)

    def reset(self) -> None:
        self.peak = 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


@dataclass
class Window:
    """CPU% and RSS of the supervisor over a stretch of wall time."""

    proc: psutil.Process
    wall0: float = 0.0
    cpu0: float = 0.0

    def start(self) -> Window:
        t = self.proc.cpu_times()
        self.wall0, self.cpu0 = time.monotonic(), t.user + t.system
        return self

    def cpu_percent(self) -> float:
        t = self.proc.cpu_times()
        return round(100 * (t.user + t.system - self.cpu0) / (time.monotonic() - self.wall0), 2)

    def rss_mb(self) -> float:
        return round(self.proc.memory_info().rss / 2**20, 1)


class Scenario:
    """N Running, Ready workers on kwok nodes, a running supervisor, and a rename watcher."""

    def __init__(self, cp: audit.AuditedControlPlane, api: client.ApiClient, n: int,
                 work: Path) -> None:
        self.cp, self.api, self.n = cp, api, n
        self.core = client.CoreV1Api(api)
        self.ns = make_namespace(self.core)
        self.nodes = [f"{self.ns}-n{i}" for i in range(nodes_for(n))]
        kwok.add_nodes(self.core, self.nodes)
        kwok.wait_nodes_ready(self.core, self.nodes)
        t = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(self._create, range(n)))
        created = time.monotonic()
        self.ips: dict[str, str] = {}  # pod -> IP (kwok's, from its node's CIDR)
        self.node_of: dict[str, str] = {}
        deadline = time.monotonic() + 300 + n / 20
        while True:
            pods = [p for p in list_pods(self.core, self.ns) if running_ready(p)]
            if len(pods) == n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(pods)} of {n} workers Running and Ready")
            time.sleep(1 if n < 5000 else 3)
        for p in pods:
            self.ips[p["metadata"]["name"]] = p["status"]["podIP"]
            self.node_of[p["metadata"]["name"]] = p["spec"]["nodeName"]
        self.setup_s = {"create_s": round(created - t, 1),
                        "kwok_ready_s": round(time.monotonic() - created, 1)}
        work.mkdir(parents=True, exist_ok=True)
        self.sup = SupervisorProcess(
            cp, self.ns, work, SUPERVISOR_NP="1", SUPERVISOR_MAX_NP=str(n),
            SUPERVISOR_LOG_LEVEL="info", SUPERVISOR_RESYNC_SECONDS="1", FAKE_POLL_S="1")
        self.sup.discovery_file.parent.mkdir(parents=True, exist_ok=True)
        self.watcher = RenameWatcher(str(self.sup.discovery_file.parent))
        self.started_wall = time.time()
        t0 = time.perf_counter()
        self.sup.start()
        self.startup_s = round(self._first_complete(t0) - t0, 3)
        self.sampler = Sampler(self.sup.pid)

    def _create(self, i: int) -> None:
        node = self.nodes[i % len(self.nodes)]
        self.core.create_namespaced_pod(self.ns, worker_body(f"w{i}", node),
                                        _preload_content=False)

    def _first_complete(self, t0: float) -> float:
        """inotify time of the first rename whose file has all N workers."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                t1, _ = self.watcher.events.get(timeout=1)
            except queue.Empty:
                if self.sup.proc is not None and self.sup.proc.poll() is not None:
                    break
                continue
            if t1 > t0 and len((self.sup.content() or "").splitlines()) == self.n:
                return t1
        tail = "\n".join(self.sup.output().splitlines()[-8:])
        raise TimeoutError(f"no discovery file with {self.n} workers; log tail:\n{tail}")

    def line(self, pod: str) -> str:
        return f"\n{self.ips[pod]}:1\n"

    def content(self) -> str:
        return "\n" + (self.sup.content() or "")

    def measure(self, what: str, change: Callable[[], None], done: Callable[[str], bool]) -> float:
        """Seconds from just before `change()` to the rename after which `done(content)`."""
        self.watcher.drain()
        t0 = time.perf_counter()
        change()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                t1, _ = self.watcher.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if done(self.content()):
                return t1 - t0
        tail = "\n".join(self.sup.output().splitlines()[-8:])
        raise TimeoutError(f"the discovery file never showed the change ({what}); supervisor "
                           f"log tail:\n{tail}")

    def set_ready(self, pod: str, ready: bool) -> None:
        self.core.patch_namespaced_pod_status(
            pod, self.ns, {"status": pod_status_running(self.ips[pod], ready)},
            _preload_content=False)

    def close(self) -> None:
        with contextlib.suppress(AttributeError):
            self.sampler.close()
        with contextlib.suppress(AttributeError):
            self.sup.close()
        with contextlib.suppress(AttributeError):
            self.watcher.close()


def latency_samples(s: Scenario, rng: random.Random) -> dict[str, list[float]]:
    """The one-at-a-time changes of step 3, by kind."""
    kinds: dict[str, list[float]] = {k: [] for k in (
        "pod not ready", "pod ready", "pod deleted (graceful)", "node not ready",
        "node ready")}
    # Node changes use the last node; pod changes the others (a deleted pod is gone for good).
    node_pods = {nd: [p for p, x in s.node_of.items() if x == nd] for nd in s.nodes}
    free = sorted((p for nd in s.nodes[:-1] for p in node_pods[nd]), key=lambda p: int(p[1:]))
    for _ in range(100):
        pod = rng.choice(free)
        kinds["pod not ready"].append(s.measure(
            "pod not ready", lambda pod=pod: s.set_ready(pod, False),
            lambda c, pod=pod: s.line(pod) not in c))
        kinds["pod ready"].append(s.measure(
            "pod ready", lambda pod=pod: s.set_ready(pod, True),
            lambda c, pod=pod: s.line(pod) in c))
    for _ in range(min(10, s.n // 4)):
        pod = free.pop(rng.randrange(len(free)))
        kinds["pod deleted (graceful)"].append(s.measure(
            "pod deleted", lambda pod=pod: s.core.delete_namespaced_pod(
                pod, s.ns, grace_period_seconds=30, _preload_content=False),
            lambda c, pod=pod: s.line(pod) not in c))
        s.node_of.pop(pod)
    node = s.nodes[-1]
    lines = [s.line(p) for p in node_pods[node]]
    for _ in range(3):
        kinds["node not ready"].append(s.measure(
            "node not ready", lambda: kwok.set_node_not_ready(s.core, node, True),
            lambda c: not any(x in c for x in lines)))
        # Back: kwok reports Ready, then the node-lifecycle controller removes its not-ready
        # taints (the supervisor keeps the node's workers out while they are there).
        kinds["node ready"].append(s.measure(
            "node ready", lambda: kwok.set_node_not_ready(s.core, node, False),
            lambda c: all(x in c for x in lines)))
    return kinds


def storm(s: Scenario, rng: random.Random, window: Window) -> dict[str, Any]:
    """STORM_RATE Ready flips per second for STORM_S seconds; the supervisor meanwhile."""
    pods = sorted(p for p, nd in s.node_of.items() if nd != s.nodes[-1])
    total = int(STORM_RATE * STORM_S)
    plan: list[tuple[str, bool]] = []
    down: list[str] = []
    for i in range(total):
        # Alternate: take a ready pod out, then bring a random one back.
        if down and i % 2 == 1:
            plan.append((down.pop(rng.randrange(len(down))), True))
        else:
            pod = rng.choice(pods)
            while pod in down:
                pod = rng.choice(pods)
            plan.append((pod, False))
            down.append(pod)
    plan += [(p, True) for p in down]  # all back at the end
    total = len(plan)
    errors = Counter[str]()
    written = [0]
    lock = threading.Lock()
    start = time.monotonic()
    writers = 4

    def writer(k: int) -> None:
        # Each pod's writes go through one writer, so they land in the planned order.
        for i, (pod, ready) in enumerate(plan):
            if hash(pod) % writers != k:
                continue
            delay = start + i / STORM_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                s.set_ready(pod, ready)
            except Exception as e:  # counted and reported, never hidden
                errors[type(e).__name__] += 1
            else:
                with lock:
                    written[0] += 1

    s.sampler.reset()
    window.start()
    logs_before = len(s.sup.logs())
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    end = time.monotonic()
    cpu = window.cpu_percent()
    want = {s.line(p) for p in s.node_of}
    t = time.monotonic()
    while not all(x in (c := s.content()) for x in want):
        if time.monotonic() - t > 60:
            missing = sorted(p for p in s.node_of if s.line(p) not in c)
            raise TimeoutError(f"the discovery file did not settle after the storm: "
                               f"{len(missing)} missing, e.g. {missing[:5]}")
        time.sleep(0.02)
    settle = time.monotonic() - end
    own = [e["latency_ms"] / 1000 for e in s.sup.logs()[logs_before:]
           if e.get("event") == "discovery.written" and e.get("latency_ms") is not None]
    return {"changes": written[0], "errors": dict(errors),
            "rate_per_s": round(written[0] / (end - start), 1), "cpu_percent": cpu,
            "rss_mb_peak": round(s.sampler.peak, 1), "settled_after_s": round(settle, 3),
            "files_written": len(own),
            "supervisor_latency_ms": percentiles(own) if own else None}


def drains(s: Scenario, rng: random.Random) -> tuple[list[float], list[float]]:
    """A node whose workers all go at once (graceful DeleteCollection), on up to 3 nodes
    other than the last one (which keeps its workers). Returns the latencies and how long the
    DeleteCollection call itself took (the API server marks the pods one by one)."""
    out, calls = [], []
    nodes = [nd for nd in s.nodes[:-1] if any(x == nd for x in s.node_of.values())]
    for node in rng.sample(nodes, min(3, len(nodes))):
        lines = [s.line(p) for p, nd in s.node_of.items() if nd == node]

        def drain(node: str = node) -> None:
            t = time.perf_counter()
            s.core.delete_collection_namespaced_pod(
                s.ns, field_selector=f"spec.nodeName={node}", grace_period_seconds=30,
                _preload_content=False)
            calls.append(time.perf_counter() - t)

        out.append(s.measure(f"{node} drained", drain,
                             lambda c, lines=lines: not any(x in c for x in lines)))
        for p in [p for p, nd in s.node_of.items() if nd == node]:
            s.node_of.pop(p)
    return out, calls


def request_rates(cp: audit.AuditedControlPlane, since: float, until: float,
                  idle: tuple[float, float]) -> dict[str, Any]:
    """The supervisor's API requests per minute (audit log, by its User-Agent): over the whole
    run from its start, and in the idle window; what they were."""
    reqs = [r for r in audit.read(cp.audit_log)
            if r.agent.startswith("OpenAPI-Generator/") and since <= r.received < until]
    idle_n = sum(1 for r in reqs if idle[0] <= r.received < idle[1])
    return {
        "per_min": round(len(reqs) / ((until - since) / 60), 1),
        "idle_per_min": round(idle_n / ((idle[1] - idle[0]) / 60), 1),
        "requests": dict(sorted(Counter(f"{r.verb} {r.what}" for r in reqs).items())),
        "window_s": round(until - since, 1),
        "source": "kube-apiserver audit log, the supervisor's User-Agent",
    }


def event_writes_per_min(rates: dict[str, Any]) -> float:
    """The supervisor's Event writes (creates and series patches, either API group) per minute
    over the whole run of one size: its start, the idle window, the latency samples, the storm
    of Ready flips and the drains (from request_rates)."""
    writes = sum(n for what, n in rates["requests"].items()
                 if what.split(" ", 1)[0] in ("create", "patch", "update")
                 and what.split(" ", 1)[1] == "events")
    return round(writes / (rates["window_s"] / 60), 1)


def run_size(n: int, work: Path, rng: random.Random) -> dict[str, Any]:
    """One size on its own control plane and kwok; its part of the results."""
    t = time.monotonic()
    with (audit.AuditedControlPlane(Settings(node_monitor_grace_period_s=40)) as cp,
          kwok.Kwok(cp) as kw):
        api = kube.make_api_client(str(cp.kubeconfig))
        api.user_agent = DRIVER_AGENT
        s = None
        load: list[float] = []
        try:
            s = Scenario(cp, api, n, work)
            proc = psutil.Process(s.sup.pid)
            time.sleep(5)  # let the start settle (first Events, the collector)
            idle0 = time.time()
            w = Window(proc).start()
            time.sleep(IDLE_S)
            idle = {"cpu_percent": w.cpu_percent(), "rss_mb": w.rss_mb()}
            idle_window = (idle0, time.time())
            load.append(os.getloadavg()[0])
            kinds = latency_samples(s, rng)
            load.append(os.getloadavg()[0])
            stormed = storm(s, rng, Window(proc))
            load.append(os.getloadavg()[0])
            drained, drain_calls = drains(s, rng)
            until = time.time()
            rss_end = Window(proc).rss_mb()
            kw.check_alive()
            cp.check_alive()
            if s.sup.proc is not None and s.sup.proc.poll() is not None:
                raise RuntimeError(f"the supervisor exited with {s.sup.proc.returncode}")
            rates = request_rates(cp, s.started_wall, until, idle_window)
            samples = [x for v in kinds.values() for x in v]
            return {
                # The kinds of the earlier benchmark (the key's meaning is unchanged); the
                # drains are reported apart: most of their time is the API server's.
                "latency_ms": percentiles(samples),
                "per_kind": {k: percentiles(v) if v else None for k, v in kinds.items()},
                "node_drained_ms": {
                    **percentiles(drained), "workers_per_node": n // len(s.nodes),
                    "delete_collection_call_ms": percentiles(drain_calls)},
                "startup_s": s.startup_s, "idle": idle, "storm": stormed, "rss_mb_end": rss_end,
                "api_requests": rates, "nodes": len(s.nodes), "setup": s.setup_s,
                "load_average_1min": {"samples": [round(x, 2) for x in load],
                                      "cpus": os.cpu_count()},
                "wall_s": round(time.monotonic() - t, 1),
            }
        finally:
            if s is not None:
                s.close()
            api.close()


def main(sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Run every size; return the discovery part of bench/results.json."""
    rng = random.Random(7)
    out: dict[str, Any] = {"discovery_latency_ms": {}, "discovery_details": {}}
    with tempfile.TemporaryDirectory(prefix="es-bench-") as tmp:
        for n in sizes:
            r = run_size(n, Path(tmp) / str(n), rng)
            out["discovery_latency_ms"][str(n)] = r["latency_ms"]
            out["discovery_details"][str(n)] = r
            print(f"discovery n={n}: {r['latency_ms']} startup {r['startup_s']} s, idle "
                  f"{r['idle']}, storm cpu {r['storm']['cpu_percent']}% rss peak "
                  f"{r['storm']['rss_mb_peak']} MB, requests/min {r['api_requests']['per_min']}"
                  f" (idle {r['api_requests']['idle_per_min']}); load {r['load_average_1min']}"
                  f" ({r['wall_s']}s)", flush=True)
            for key, value in (("supervisor_rss_mb", r["idle"]["rss_mb"]),
                               ("supervisor_cpu_percent_idle", r["idle"]["cpu_percent"]),
                               ("startup_s", r["startup_s"]),
                               ("events_per_min", event_writes_per_min(r["api_requests"]))):
                out[f"{key}_{n}"] = value
    rss = {int(k): v["idle"]["rss_mb"] for k, v in out["discovery_details"].items()}
    if len(rss) >= 2:
        xs = sorted(rss)
        mx, my = statistics.mean(xs), statistics.mean(rss[x] for x in xs)
        slope = sum((x - mx) * (rss[x] - my) for x in xs) / sum((x - mx) ** 2 for x in xs)
        out["supervisor_rss_mb_per_1000_workers"] = round(slope * 1000, 2)
    return out
