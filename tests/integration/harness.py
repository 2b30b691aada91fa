"""Test harness: worker pods and nodes on the real control plane, and a real supervisor process.

`Job` creates nodes (with renewed Leases) and worker pods whose status is written the way a
kubelet would. `SupervisorProcess` runs `python -m supervisor run -- ...` as a subprocess with
the stand-in horovodrun, and reads back its JSON logs and what the stand-in recorded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.controlplane import ControlPlane
from localcluster.kubelet import Heartbeats, pod_status_running
from supervisor import kube
from supervisor.model import SourceState, WatchEvent
from supervisor.observe import EventType, Kind
from tests.helpers import wait_for

STANDIN = Path(__file__).resolve().parent.parent / "standin" / "fake_horovodrun.py"
_ips = itertools.count(1)


def next_ip() -> str:
    """A pod IP never handed out before in this test session."""
    n = next(_ips)
    return f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"


class Job:
    """Worker pods of one job in `namespace`, on nodes named after the namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str = "job1") -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.core = client.CoreV1Api(api)
        self.heartbeats = Heartbeats(api)
        self.ips: dict[str, str] = {}
        self.kubelet: AutoKubelet | None = None  # set by tests that let a stand-in start pods

    def node(self, suffix: str, hostname: str | None = None) -> str:
        """Register a node; its hostname label is its name unless `hostname` says otherwise
        (as on clusters whose node names are FQDNs and whose hostname labels are not)."""
        name = f"{self.namespace}-{suffix}"
        labels = {NODE_LABEL: self.namespace}
        if hostname is not None:
            labels["kubernetes.io/hostname"] = hostname
        self.heartbeats.register(name, labels=labels)
        return name

    def labels(self) -> dict[str, str]:
        return {"elastic-supervisor/job": self.name, "elastic-supervisor/role": "worker"}

    def worker(self, name: str, node: str, *, running: bool = True, ready: bool = True) -> str:
        """Create worker pod `name` bound to `node`; with `running`, write a Running status."""
        self.core.create_namespaced_pod(self.namespace, {
            "metadata": {"name": name, "labels": self.labels()},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "worker", "image": "worker:local"}]},
        })
        if running:
            self.start(name, ready=ready)
        return name

    def start(self, name: str, ready: bool = True) -> str:
        ip = self.ips.setdefault(name, next_ip())
        self.core.patch_namespaced_pod_status(name, self.namespace,
                                              {"status": pod_status_running(ip, ready)})
        return ip

    def line(self, name: str, slots: int = 1) -> str:
        return f"{self.ips[name]}:{slots}"

    def terminate(self, name: str, code: int) -> None:
        """Write what a kubelet writes when the (only) container exits with `code`."""
        self.core.patch_namespaced_pod_status(name, self.namespace, {
            "status": pod_status_terminated(self.ips[name], code)})

    def template(self, path: Path) -> Path:
        """Write a worker pod template (pods land only on this job's nodes) to `path`."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"labels": self.labels()},
            "spec": {"restartPolicy": "Never", "nodeSelector": {NODE_LABEL: self.namespace},
                     "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "worker", "image": "worker:local"}]}}))
        return path

    def pods(self) -> dict[str, Any]:
        """The job's worker pods by name, as API dicts."""
        resp = self.core.list_namespaced_pod(
            self.namespace, label_selector=",".join(f"{k}={v}" for k, v in self.labels().items()),
            _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(resp.data)["items"]}

    def live(self) -> list[str]:
        """Names of worker pods not terminal and not being deleted, sorted."""
        return sorted(n for n, p in self.pods().items()
                      if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                      and not p["metadata"].get("deletionTimestamp"))

    def close(self) -> None:
        self.heartbeats.close()


NODE_LABEL = "es-test/namespace"


def pod_status_terminated(ip: str, code: int, container: str = "worker") -> dict[str, Any]:
    """The status a kubelet writes when a restartPolicy=Never pod's container exited."""
    t = dt.datetime.now(dt.UTC).isoformat()
    return {
        "phase": "Succeeded" if code == 0 else "Failed", "podIP": ip,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": t,
                        "reason": "PodCompleted" if code == 0 else "PodFailed"},
                       {"type": "ContainersReady", "status": "False",
                        "lastTransitionTime": t}],
        "containerStatuses": [{
            "name": container, "image": "worker:local", "imageID": "", "ready": False,
            "started": False, "restartCount": 0, "containerID": f"local://{ip}",
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0
                                     else "Error", "startedAt": t, "finishedAt": t,
                                     "containerID": f"local://{ip}"}}}],
    }


class AutoKubelet:
    """The part of a kubelet the replacement tests need, for the pods of one `Job`:
    starts pods the scheduler bound to a live node of the job (Running, Ready, a fresh IP)
    and completes graceful deletions on live nodes. A silenced node's pods are left alone,
    as a dead kubelet would."""

    def __init__(self, job: Job, period_s: float = 0.05) -> None:
        self.job, self.period_s = job, period_s
        self.started: dict[str, str] = {}  # pod -> node it was started on
        self.hold: set[str] = set()  # pods never started (e.g. an image that cannot be pulled)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auto-kubelet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError):
                self._sync()

    def _sync(self) -> None:
        live = self.job.heartbeats.renewing
        for name, pod in self.job.pods().items():
            node = pod["spec"].get("nodeName")
            if node not in live:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self.job.core.delete_namespaced_pod(name, self.job.namespace,
                                                    grace_period_seconds=0)
            elif name not in self.hold and pod.get("status", {}).get("phase") in (None,
                                                                                  "Pending"):
                self.job.start(name)
                self.started[name] = node

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class SupervisorProcess:
    """A real `elastic-supervisor run` subprocess with the stand-in horovodrun."""

    def __init__(self, cp: ControlPlane, namespace: str, tmp: Path,
                 command: tuple[str, ...] = ("python", "train.py"), **env: str) -> None:
        self.tmp, self.command = tmp, command
        self.discovery_file = tmp / "edl" / "hostfile"
        self.record = tmp / f"horovodrun-{time.monotonic_ns()}.jsonl"
        self.log_path = tmp / f"supervisor-{time.monotonic_ns()}.log"
        self.env = {
            "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "KUBECONFIG": str(cp.kubeconfig),
            "SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": namespace,
            "SUPERVISOR_NP": "2", "SUPERVISOR_DISCOVERY_FILE": str(self.discovery_file),
            "SUPERVISOR_HOROVODRUN": str(STANDIN), "SUPERVISOR_METRICS_PORT": "0",
            "SUPERVISOR_LOG_FORMAT": "json", "SUPERVISOR_LOG_LEVEL": "debug",
            "SUPERVISOR_RESYNC_SECONDS": "0.2", "FAKE_RECORD": str(self.record),
            # A restart after a SIGKILL waits this out (the killed one never released it).
            "SUPERVISOR_LEADER_LEASE_SECONDS": "10",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SupervisorProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "run", "--", *self.command],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, event: str, timeout: float = 15, **match: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for entry in self.logs():
                if entry.get("event") == event and all(entry.get(k) == v
                                                       for k, v in match.items()):
                    return entry
            return None

        return self._wait(found, timeout, f"log {event} {match}")

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        rows = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [r for r in rows if event is None or r["event"] == event]

    def content(self) -> str | None:
        try:
            return self.discovery_file.read_text()
        except FileNotFoundError:
            return None

    def wait_content(self, lines: list[str], timeout: float = 10) -> None:
        want = "".join(f"{line}\n" for line in sorted(lines)) if lines else None
        self._wait(lambda: self.content() == want, timeout,
                   f"discovery file == {sorted(lines)}")

    def _wait(self, predicate: Any, timeout: float, what: str) -> Any:
        try:
            return wait_for(predicate, timeout, what=what)
        except pytest.fail.Exception:
            tail = "\n".join(self.output().splitlines()[-25:])
            pytest.fail(f"timed out after {timeout}s waiting for {what}; discovery file "
                        f"{self.content()!r}; supervisor log tail:\n{tail}")

    def wait_exit(self, timeout: float = 20) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Collector:
    """The reflector's sink: keeps everything, lets tests wait for matching items."""

    def __init__(self) -> None:
        self.items: list[WatchEvent | SourceState] = []

    def __call__(self, item: WatchEvent | SourceState) -> None:
        self.items.append(item)

    def wait(self, pred: Callable[[Any], bool], timeout: float = 10, what: str = "") -> Any:
        return wait_for(lambda: next((i for i in self.items if pred(i)), None), timeout,
                        what=what or "reflector item")

    def names(self, etype: EventType) -> set[str]:
        return {i.obj["metadata"]["name"] for i in self.items
                if isinstance(i, WatchEvent) and i.type is etype}


class Reflectors:
    """Makes pod reflectors (selector r=t in `namespace`) with a Collector sink; stops them all."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.made: list[kube.Reflector] = []

    def __call__(self, settings: kube.WatchSettings | None = None,
                 api: client.ApiClient | None = None, rv: str | None = None,
                 wrap: Callable[[Any], Any] | None = None) -> tuple[kube.Reflector, Any]:
        sink = Collector()
        list_fn = kube.lister(api or self.api, Kind.POD, self.namespace, "r=t")
        r = kube.Reflector(Kind.POD, wrap(list_fn) if wrap else list_fn, sink,
                           settings or kube.WatchSettings())
        r.resource_version = rv
        self.made.append(r)
        return r, sink

    def close(self) -> None:
        for r in self.made:
            r.stop()


def service_account_kubeconfig(cp: ControlPlane, api: client.ApiClient, namespace: str,
                               rules: list[dict[str, Any]], path: Path, *,
                               name: str = "sup") -> Path:
    """Create ServiceAccount `name` bound to a Role with `rules`; write a kubeconfig using a
    token of that ServiceAccount (so RBAC is enforced for real) and return its path."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"audiences": [], "expirationSeconds": 600}}).status.token
    return cp.write_token_kubeconfig(path, token, namespace)


def supervisor_events(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """The supervisor's Events in `namespace` (events.k8s.io dicts), oldest first."""
    items = [e for e in kube.list_events(api, namespace)
             if e.get("reportingController") == kube.REPORTING_CONTROLLER]
    return sorted(items, key=lambda e: e.get("eventTime") or "")


def event_reasons(api: client.ApiClient, namespace: str) -> list[str]:
    """Reasons of the supervisor's Events in `namespace`, oldest first."""
    return [e["reason"] for e in supervisor_events(api, namespace)]


def wait_reason(api: client.ApiClient, namespace: str, reason: str,
                timeout: float = 5) -> list[str]:
    """Wait until the supervisor has posted an Event with `reason` (Events are posted from a
    background thread, after the log line); return all reasons."""
    return wait_for(lambda: (r := event_reasons(api, namespace)) and reason in r and r,
                    timeout, what=f"a {reason} Event")


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Samples from the supervisor's /metrics endpoint, keyed by name{labels} as printed."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
        return samples(r.read().decode())


def samples(text: str) -> dict[str, float]:
    """The samples of Prometheus' text format, keyed by name{labels} as printed."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"
    return True
