"""Replacement latency at 1,000 workers: a worker's container dies (kwok, as its kubelet,
writes the terminated status) -> its replacement pod exists in the API, seen by a watch.

Runs a private local control plane (production node grace) with kwok (localcluster/kwok.py)
simulating 11 nodes of 110 pod slots each: kwok starts every pod the scheduler binds there
(Running, Ready, a pod IP), like the kubelets would. The real `elastic-supervisor run` owns
WORKERS workers from a template, with the stand-in horovodrun. Each sample asks kwok's
pod-container-running-failed chaos Stage to end one worker's container with exit code 137
(the label and exit-code annotation), on SAMPLES distinct slots so that no sample waits for a
slot's backoff (the issue's "excluding configured backoff"; the backoff is set to 1 ms). t0 is
taken just before that label write, t1 when the bench's own watch sees the replacement ADDED:
each sample includes kwok's reaction and status write, both watch deliveries, the
supervisor's decision, its state save and the create call. For context, the supervisor's own
measure (failure event received -> create call returned, from its `worker.created` log) is
reported as `supervisor_internal`, split as that log line splits it (`supervisor_split`: the pass,
queued behind the state save, the pod's call, its host key's Secret), with the mean of each kind
of write the actuator made meanwhile (`api_writes`, from its `api_write_seconds` histogram), the
garbage collector's pauses meanwhile by generation (`gc_pauses`, from its `gc_pause_seconds`
histogram: the whole process waits for each), and kwok's part (label write -> the bench's watch
sees the pod Failed) as `kwok_reaction`. Without kwok's part, as `from_failed_seen`: the bench's
watch sees the pod Failed -> it sees the replacement ADDED (both sights by the same watch; what
the API showed, not what kwok, the stand-in kubelet, took to show it: one of its reactions took
2.3 s on 2026-12-01 and made that run's p99).

At each size (1,000: `replacement_latency_ms`; 10,000: `replacement_latency_ms_10000`), before
the failures, the cost of a pass with nothing changed: the supervisor's own histogram of its
loop's passes (`elastic_supervisor_loop_pass_seconds{batch="idle"}`, scraped before and after
IDLE_S seconds with every worker running and nothing asked of kwok), as `pass_ms_idle_<N>`:
the passes counted, their mean, and the bucket bounds under which half, 99 % and all of them
fell (a histogram gives bounds, not values: the worst case is the `max` bound).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from bench.discovery import percentiles
from localcluster import kwok
from localcluster.controlplane import ControlPlane, Settings, free_ports
from supervisor import kube
from supervisor.workers import pod_name
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import NODE_LABEL, Job, SupervisorProcess, scrape

IDLE_S = 20.0
SIZES = (1000, 10000)
START_TIMEOUT_S = 3600  # the supervisor's START_TIMEOUT_SECONDS: 10,000 creates take a while here

def window(before: dict[str, float], after: dict[str, float], family: str,
           labels: str) -> tuple[list[tuple[float, float]], float, float]:
    """A histogram's observations between two scrapes of /metrics, for one label set
    (`labels`: 'batch="idle"'): (bucket bound, count up to it) in order, how many, and their
    sum (seconds)."""
    head = f"{family}_bucket{{{labels},le=\""
    counts = sorted((float(k[len(head):-2]), v - before.get(k, 0.0))
                    for k, v in after.items() if k.startswith(head))
    n = counts[-1][1] if counts else 0.0
    key = f"{family}_sum{{{labels}}}"
    return counts, n, after.get(key, 0.0) - before.get(key, 0.0)


def bound(counts: list[tuple[float, float]], share: float, n: float) -> float:
    """The bucket bound under which `share` of the `n` observations fell."""
    return next(le for le, c in counts if c >= share * n)


PASS_FAMILY = "elastic_supervisor_loop_pass_seconds"


def idle_passes(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The idle passes between two scrapes of the supervisor's /metrics: how many, their mean
    (ms), and the bucket bound (ms) under which half, 99 % and all of them fell."""
    count, n, total = window(before, after, PASS_FAMILY, 'batch="idle"')
    if not n:
        raise RuntimeError("no idle pass between the two scrapes of the loop's histogram")
    return {"n": int(n), "mean": round(total / n * 1000, 3),
            "p50_le": bound(count, 0.5, n) * 1000, "p99_le": bound(count, 0.99, n) * 1000,
            "max_le": bound(count, 1.0, n) * 1000,
            "source": "the supervisor's elastic_supervisor_loop_pass_seconds{batch=\"idle\"}"}


SPLIT = ("pass_ms", "queued_ms", "pod_ms", "secret_ms")  # worker.created's parts of the time
WRITE_FAMILY = "elastic_supervisor_api_write_seconds"


def api_writes(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The actuator's writes between two scrapes, by what it wrote: how many, and their mean
    (ms) from the first try until done (the supervisor's `api_write_seconds` histogram)."""
    out: dict[str, Any] = {}
    for key, total in after.items():
        if not key.startswith(f'{WRITE_FAMILY}_count{{what="'):
            continue
        what = key[len(f'{WRITE_FAMILY}_count{{what="'):-2]
        n = total - before.get(key, 0.0)
        sum_key = f'{WRITE_FAMILY}_sum{{what="{what}"}}'
        if n:
            out[what] = {"n": int(n), "mean_ms": round(
                (after[sum_key] - before.get(sum_key, 0.0)) / n * 1000, 2)}
    return out


GC_FAMILY = "elastic_supervisor_gc_pause_seconds"


def gc_pauses(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The garbage collector's pauses between two scrapes, by generation: how many, their
    total (ms), and the bucket bound (ms) under which the longest fell (the supervisor's
    `gc_pause_seconds` histogram, supervisor/collector.py)."""
    out: dict[str, Any] = {}
    for gen in ("0", "1", "2"):
        counts, n, total = window(before, after, GC_FAMILY, f'generation="{gen}"')
        if n:
            out[f"gen{gen}"] = {"n": int(n), "total_ms": round(total * 1000, 1),
                                "max_le_ms": bound(counts, 1.0, n) * 1000}
    return out


class Added:
    """Watches the namespace's pods: when each name was first ADDED, and first seen Failed.

    The API server closes a watch that does not keep up ("Forcing pods watcher close due to
    unresponsiveness"; at 10,000 workers this one was, during the start, twice on 2026-12-01,
    and the first sample then waited 30 s for a pod the supervisor had created in 131 ms). So
    when the watch ends it lists again and watches from there, until closed: a pod first seen
    by that list counts as seen then (`relists` says how often; a late sight, never an early
    one)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.seen: dict[str, float] = {}
        self.failed: dict[str, float] = {}
        self.relists = 0
        self._closed = threading.Event()
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, namespace), daemon=True)
        self._thread.start()

    def _saw(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "ADDED":
            self.seen.setdefault(name, now)
        if (obj.get("status") or {}).get("phase") == "Failed":
            self.failed.setdefault(name, now)

    def _run(self, core: client.CoreV1Api, namespace: str) -> None:
        # Ends when close() stops it (or the namespace goes away with the control plane: a
        # line cut off as the API server stops is a ValueError, JSONDecodeError, here).
        while not self._closed.is_set():
            with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError,
                                     ValueError):
                # Raw dicts: building client models for 10,000 pods would delay t1 itself.
                listed = json.loads(core.list_namespaced_pod(
                    namespace, _preload_content=False).data)
                now = time.monotonic()
                for obj in listed.get("items") or ():
                    self._saw("ADDED", obj, now)
                for ev in self._w.stream(core.list_namespaced_pod, namespace,
                                         resource_version=listed["metadata"]["resourceVersion"],
                                         timeout_seconds=3600, deserialize=False):
                    self._saw(ev["type"], ev["object"], time.monotonic())
            if not self._closed.wait(0.2):
                self.relists += 1

    def close(self) -> None:
        self._closed.set()
        self._w.stop()


def measure(cp: ControlPlane, api: client.ApiClient, workers: int, samples: int,
            work: Path) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    ns = make_namespace(core)
    nodes = [f"{ns}-n{i}" for i in range(-(-workers // 100) + 1)]
    kwok.add_nodes(core, nodes, labels={NODE_LABEL: ns})
    kwok.wait_nodes_ready(core, nodes)
    job = Job(api, ns)  # only its template and names: kwok is the kubelet here
    added = Added(core, ns)
    port = free_ports(1)[0]
    sup = SupervisorProcess(
        cp, ns, work, SUPERVISOR_NP=str(workers), SUPERVISOR_MAX_NP=str(workers),
        SUPERVISOR_METRICS_PORT=str(port),
        SUPERVISOR_WORKER_TEMPLATE=str(job.template(work / "worker.json")),
        SUPERVISOR_RESTART_LIMIT=str(samples + 1),
        SUPERVISOR_BACKOFF_INITIAL_SECONDS="0.001", SUPERVISOR_LOG_LEVEL="info",
        SUPERVISOR_START_TIMEOUT_SECONDS=str(START_TIMEOUT_S),
        FAKE_POLL_S="1.0").start()
    out: list[float] = []
    reaction: list[float] = []
    after_api: list[float] = []
    try:
        def all_running() -> bool:
            return sum(1 for p in job.pods().values()
                       if p.get("status", {}).get("phase") == "Running") >= workers
        t = time.monotonic()
        wait_for(all_running, START_TIMEOUT_S, interval=2, what=f"{workers} workers running")
        start_s = time.monotonic() - t
        time.sleep(5)  # the last Running pods' events, the saves after them
        before = scrape(port)
        time.sleep(IDLE_S)
        after_idle = scrape(port)
        idle = idle_passes(before, after_idle)
        for slot in random.Random(5).sample(range(workers), samples):
            name, new = pod_name("job1", slot, 1), pod_name("job1", slot, 2)
            t0 = time.monotonic()
            kwok.fail_pod(core, ns, name, 137)
            t1 = wait_for(lambda new=new: added.seen.get(new), 30,
                          interval=0.002, what=f"{new} created")
            out.append(t1 - t0)
            if name in added.failed:
                reaction.append(added.failed[name] - t0)
                after_api.append(t1 - added.failed[name])

        def created() -> list[dict[str, Any]]:
            return [e for e in sup.logs() if e.get("event") == "worker.created"
                    and e.get("replacement_latency_ms") is not None]

        # The last create's log line may come a moment after the bench's watch saw the pod.
        with contextlib.suppress(pytest.fail.Exception):
            wait_for(lambda: len(created()) >= samples, 5, what="every worker.created log")
        internal = [e["replacement_latency_ms"] / 1000 for e in created()]
        split = {part: percentiles(got) for part in SPLIT
                 if (got := [e[part] / 1000 for e in created() if part in e])}
        end = scrape(port)
        writes, pauses = api_writes(after_idle, end), gc_pauses(after_idle, end)
    except BaseException:
        # The work dir goes with the run: keep what says why it failed (as localcluster keeps
        # its clusters' logs).
        kept = Path(tempfile.gettempdir()) / f"es-bench-repl-{ns}-{sup.log_path.name}"
        with contextlib.suppress(OSError):
            shutil.copyfile(sup.log_path, kept)
            print(f"bench: kept the supervisor's log: {kept}", flush=True)
        raise
    finally:
        sup.close()
        added.close()
        job.close()
        core.delete_namespace(ns)
    return {**percentiles(out), "workers": workers, "supervisor_internal": percentiles(internal),
            "supervisor_split": split, "api_writes": writes, "gc_pauses": pauses,
            "kwok_reaction": percentiles(reaction) if reaction else None,
            "from_failed_seen": percentiles(after_api) if after_api else None,
            "bench_watch_relists": added.relists,
            "all_running_after_start_s": round(start_s, 1), "pass_ms_idle": idle}


def main(sizes: tuple[int, ...] = SIZES, samples: int = 100) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for workers in sizes:
        with (ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp, kwok.Kwok(cp),
              tempfile.TemporaryDirectory(prefix="es-bench-repl-") as tmp):
            api = kube.make_api_client(str(cp.kubeconfig))
            api.user_agent = "es-bench-driver"
            try:
                result = measure(cp, api, workers, samples, Path(tmp))
            finally:
                api.close()
        print(f"replacement latency at {workers} workers over {result['n']} failures: p50 "
              f"{result['p50']} ms, p99 {result['p99']} ms, max {result['max']} ms; inside the "
              f"supervisor (failure event received -> create returned): "
              f"{result['supervisor_internal']}, split {result['supervisor_split']}, writes "
              f"{result['api_writes']}, the collector's pauses {result['gc_pauses']}; "
              f"kwok's reaction: {result['kwok_reaction']}; from the API's Failed: "
              f"{result['from_failed_seen']}; "
              f"an idle pass: {result['pass_ms_idle']}", flush=True)
        suffix = "" if workers == 1000 else f"_{workers}"
        out[f"replacement_latency_ms{suffix}"] = result
        out[f"pass_ms_idle_{workers}"] = result["pass_ms_idle"]
    return out
