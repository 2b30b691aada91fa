"""Discovery latency: the API write that changes a worker's usability -> the discovery file's
rename, with 10, 100 and 1000 worker pods; plus the supervisor's RSS and idle CPU at 1000.

Runs a private local control plane (production node grace, 40 s), nodes kept alive by lease
heartbeats, worker pods with kubelet-style status, and the real `elastic-supervisor run` with
the stand-in horovodrun polling the discovery script once a second like horovodrun does.
Changes measured, round robin: a pod's Ready condition False then True (status updates), a
graceful pod delete, and a node's Ready condition False then True (all its pods at once).
t0 is taken just before the API call, t1 when inotify reports the rename after which the file
content shows the change, so each sample includes the API write itself and the watch delivery.
"""

from __future__ import annotations

import queue
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client

from bench.inotify import RenameWatcher
from localcluster.controlplane import ControlPlane, Settings
from localcluster.kubelet import set_node_ready, set_pod_ready
from supervisor import kube
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import Job, SupervisorProcess

PODS_PER_NODE = 100


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


class Scenario:
    """N workers on ceil(N/100) nodes (at least 2), a running supervisor, and a rename watcher."""

    def __init__(self, cp: ControlPlane, api: client.ApiClient, n: int, work: Path) -> None:
        self.cp, self.api, self.n = cp, api, n
        self.core = client.CoreV1Api(api)
        self.ns = make_namespace(self.core)
        self.job = Job(api, self.ns)
        self.nodes = [self.job.node(f"n{i}") for i in range(max(2, -(-n // PODS_PER_NODE)))]
        self.pods: dict[str, str] = {}  # pod -> node
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(self._create, range(n)))
        work.mkdir(parents=True, exist_ok=True)
        self.sup = SupervisorProcess(
            cp,
            self.ns,
            work,
            SUPERVISOR_NP="1",
            SUPERVISOR_MAX_NP=str(n),
            SUPERVISOR_LOG_LEVEL="info",
            SUPERVISOR_RESYNC_SECONDS="1",
            FAKE_POLL_S="1",
        )
        self.sup.discovery_file.parent.mkdir(parents=True, exist_ok=True)
        self.watcher = RenameWatcher(str(self.sup.discovery_file.parent))
        self.sup.start()
        wait_for(lambda: self.lines() == n, 120, interval=0.5, what=f"{n} lines")
        self.fresh = n

    def _create(self, i: int) -> None:
        node = self.nodes[i % len(self.nodes)]
        name = f"w{i}"
        self.job.worker(name, node)
        self.pods[name] = node

    def lines(self) -> int:
        content = self.sup.content()
        return 0 if content is None else len(content.splitlines())

    def measure(self, what: str, change: Callable[[], None], done: Callable[[str], bool]) -> float:
        """Seconds from just before `change()` to the rename after which `done(content)`."""
        self.watcher.drain()
        t0 = time.perf_counter()
        change()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                t1, _ = self.watcher.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if done(self.sup.content() or ""):
                return t1 - t0
        tail = "\n".join(self.sup.output().splitlines()[-8:])
        raise TimeoutError(
            f"the discovery file never showed the change ({what}); file "
            f"{self.sup.content()!r}; supervisor log tail:\n{tail}"
        )

    def close(self) -> None:
        self.sup.close()
        self.watcher.close()
        self.job.close()
        self.core.delete_namespace(self.ns)


def run_size(
    cp: ControlPlane, api: client.ApiClient, n: int, work: Path, rng: random.Random
) -> tuple[list[float], dict[str, Any]]:
    s = Scenario(cp, api, n, work)
    samples: list[float] = []
    extra: dict[str, Any] = {}
    try:
        for _ in range(100):
            pod = rng.choice(sorted(s.pods))
            line = s.job.line(pod) + "\n"
            samples.append(
                s.measure(
                    "pod not ready",
                    lambda pod=pod: set_pod_ready(s.core, s.ns, pod, False),
                    lambda c, line=line: line not in c,
                )
            )
            samples.append(
                s.measure(
                    "pod ready",
                    lambda pod=pod: set_pod_ready(s.core, s.ns, pod, True),
                    lambda c, line=line: line in c,
                )
            )
        for _ in range(min(10, n // 4)):
            pod = rng.choice(sorted(s.pods))
            line = s.job.line(pod) + "\n"
            samples.append(
                s.measure(
                    "pod deleted",
                    lambda pod=pod: s.core.delete_namespaced_pod(
                        pod, s.ns, grace_period_seconds=30
                    ),
                    lambda c, line=line: line not in c,
                )
            )
            s.pods.pop(pod)
        for _ in range(3):
            node = rng.choice(s.nodes)
            on_node = [s.job.line(p) + "\n" for p, nd in s.pods.items() if nd == node]
            samples.append(
                s.measure(
                    "node not ready",
                    lambda node=node: set_node_ready(s.core, node, "False"),
                    lambda c, on=on_node: not any(x in c for x in on),
                )
            )
            samples.append(
                s.measure(
                    "node ready",
                    lambda node=node: s.job.heartbeats.resume(node),
                    lambda c, on=on_node: all(x in c for x in on),
                )
            )
        proc = psutil.Process(s.sup.pid)
        extra["rss_mb"] = round(proc.memory_info().rss / 2**20, 1)
        proc.cpu_percent(None)
        time.sleep(10)
        extra["cpu_percent_idle"] = round(proc.cpu_percent(None), 2)
    finally:
        s.close()
    return samples, extra


def main(sizes: tuple[int, ...] = (10, 100, 1000)) -> dict[str, Any]:
    """Run every size; return the discovery part of bench/results.json."""
    rng = random.Random(7)
    out: dict[str, Any] = {"discovery_latency_ms": {}}
    with (
        tempfile.TemporaryDirectory(prefix="es-bench-") as tmp,
        ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp,
    ):
        api = kube.make_api_client(str(cp.kubeconfig))
        try:
            for n in sizes:
                t = time.monotonic()
                samples, extra = run_size(cp, api, n, Path(tmp) / str(n), rng)
                out["discovery_latency_ms"][str(n)] = percentiles(samples)
                print(
                    f"discovery n={n}: {out['discovery_latency_ms'][str(n)]} "
                    f"rss={extra['rss_mb']} MB cpu_idle={extra['cpu_percent_idle']}% "
                    f"({time.monotonic() - t:.0f}s)",
                    flush=True,
                )
                if n == 1000:
                    out["supervisor_rss_mb_1000"] = extra["rss_mb"]
                    out["supervisor_cpu_percent_idle_1000"] = extra["cpu_percent_idle"]
        finally:
            api.close()
    return out
