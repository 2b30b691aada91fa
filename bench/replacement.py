"""Replacement latency: a worker's container dies (the kubelet's status write) -> its replacement
pod exists in the API, seen by a watch.

Runs a private local control plane (production node grace), nodes kept alive by lease
heartbeats, the kubelet stand-in of the tests (starts bound pods, Running with a fresh IP), and
the real `elastic-supervisor run` owning SLOTS workers from a template, with the stand-in
horovodrun. Each sample fails one slot's current pod with exit code 137, round robin over the
slots, so that no sample waits for a slot's backoff (the issue's "excluding configured backoff";
the backoff is set to 1 ms). t0 is taken just before the status write, t1 when the bench's own
watch sees the replacement ADDED: each sample includes both watch deliveries, the supervisor's
decision, its state save and the create call. For context, the supervisor's own measure
(failure event received -> create call returned, from its `worker.created` log) is reported
as `supervisor_internal`.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from bench.discovery import percentiles
from localcluster.controlplane import ControlPlane, Settings
from supervisor.workers import pod_name
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import AutoKubelet, Job, SupervisorProcess


class Added:
    """Watches the namespace's pods and records when each name was first ADDED."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.seen: dict[str, float] = {}
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, namespace), daemon=True)
        self._thread.start()

    def _run(self, core: client.CoreV1Api, namespace: str) -> None:
        # Ends when close() stops the watch (or the namespace goes away with the control plane).
        with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError):
            for ev in self._w.stream(core.list_namespaced_pod, namespace, timeout_seconds=3600):
                if ev["type"] == "ADDED":
                    self.seen.setdefault(ev["object"].metadata.name, time.monotonic())

    def close(self) -> None:
        self._w.stop()


def measure(cp: ControlPlane, api: client.ApiClient, slots: int, rounds: int,
            work: Path) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    ns = make_namespace(core)
    job = Job(api, ns)
    for i in range(2):
        job.node(f"n{i}")
    kubelet = AutoKubelet(job, period_s=0.25)  # off the measured path; keep its CPU low
    added = Added(core, ns)
    sup = SupervisorProcess(
        cp, ns, work, SUPERVISOR_NP=str(slots),
        SUPERVISOR_WORKER_TEMPLATE=str(job.template(work / "worker.json")),
        SUPERVISOR_RESTART_LIMIT=str(slots * rounds + 1),
        SUPERVISOR_BACKOFF_INITIAL_SECONDS="0.001", SUPERVISOR_LOG_LEVEL="info",
        FAKE_POLL_S="1.0").start()
    samples: list[float] = []
    try:
        def all_running() -> bool:
            pods = job.pods()
            return sum(1 for p in pods.values()
                       if p.get("status", {}).get("phase") == "Running") >= slots
        wait_for(all_running, 120, what=f"{slots} workers running")
        for r in range(1, rounds + 1):
            for slot in range(slots):
                name, new = pod_name("job1", slot, r), pod_name("job1", slot, r + 1)
                wait_for(lambda name=name: job.pods().get(name, {}).get("status", {}).get(
                    "phase") == "Running", 30, what=f"{name} running")
                t0 = time.monotonic()
                job.terminate(name, 137)
                t1 = wait_for(lambda new=new: added.seen.get(new), 30,
                              interval=0.002, what=f"{new} created")
                samples.append(t1 - t0)
        inside = [e["replacement_latency_ms"] / 1000 for e in sup.logs()
                  if e.get("event") == "worker.created" and e.get("replacement_latency_ms")
                  is not None]
    finally:
        sup.close()
        added.close()
        kubelet.close()
        job.close()
        core.delete_namespace(ns)
    return {**percentiles(samples), "supervisor_internal": percentiles(inside)}


def main(slots: int = 50, rounds: int = 2) -> dict[str, Any]:
    cp = ControlPlane(Settings(node_monitor_grace_period_s=40))
    cp.start()
    try:
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))
        with tempfile.TemporaryDirectory(prefix="es-bench-repl-") as tmp:
            result = measure(cp, api, slots, rounds, Path(tmp))
        api.close()
    finally:
        cp.stop()
    print(f"replacement latency over {result['n']} failures: p50 {result['p50']} ms, "
          f"p99 {result['p99']} ms, max {result['max']} ms; inside the supervisor (failure "
          f"event received -> create returned): {result['supervisor_internal']}")
    return {"replacement_latency_ms": result}
