"""kwok's controller against the local control plane: many simulated nodes and their pods.

`Kwok` owns one `kwok` process (built by `localcluster/build-binaries.sh`), started against a
running `ControlPlane` with the Stages below, its config and log in its own work directory; it
manages the Nodes created with `add_nodes` (annotation `kwok.x-k8s.io/node: fake`) and every pod
bound to them. Like the control plane's components it runs in its own session and dies with its
owner (PR_SET_PDEATHSIG); `stop` ends it (SIGTERM, grace, SIGKILL) and removes the directory
unless something failed.

What kwok writes, through Stages (kwok's own lifecycle model, `kwok.x-k8s.io/v1alpha1 Stage`):
- node-initialize: a new node reports Ready (conditions, addresses, allocatable), and again when
  the not-ready label is removed; node-heartbeat-with-lease: status every ~10-20 min, while kwok
  renews the node's Lease every 10 s like a kubelet (so the node-lifecycle controller keeps it);
- node-not-ready (kwok's chaos stage): the label `node-not-ready.stage.kwok.x-k8s.io=true` makes
  the node report Ready=False (a kubelet that is alive but unhealthy; the Lease stays renewed);
- pod-create / pod-ready: a bound pod gets a pod IP from its node's spec.podCIDR and turns
  Pending (ContainerCreating), then Running and Ready;
- pod-delete: a pod with a deletionTimestamp (graceful delete) is removed after
  DELETE_DELAY_MS (the kubelet stopping the containers); a forced delete needs nobody;
- pod-container-running-failed (kwok's chaos stage): the label
  `pod-container-running-failed.stage.kwok.x-k8s.io=true` ends the container with the exit code
  of the annotation `.../exit-code` (phase Failed), as a kubelet reports a crashed container.
Each Stage's selector excludes its own result, so no Stage rewrites an object in a loop, and
the selectors are disjoint: kwok picks among matching Stages at random (by weight).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from localcluster.controlplane import (
    ControlPlane,
    ControlPlaneError,
    _die_with_parent,
    free_ports,
    read_versions,
    wait_http_ok,
)

MANAGED = {"kwok.x-k8s.io/node": "fake"}  # the annotation of the nodes kwok manages
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_EXIT_CODE = f"{FAIL_LABEL}/exit-code"
DELETE_DELAY_MS = 1000
USER_AGENT_PREFIX = "kwok/"  # how kwok's requests show in the apiserver's audit log


def default_binary() -> Path:
    """Where build-binaries.sh caches kwok (ES_KWOK_BIN overrides it)."""
    if override := os.environ.get("ES_KWOK_BIN"):
        return Path(override)
    cache = Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor"))
    return cache / "kwok" / read_versions()["KWOK_VERSION"] / "bin" / "kwok"


@dataclass(frozen=True)
class KwokSettings:
    """How kwok is run. Durations in seconds."""

    binary: Path = field(default_factory=default_binary)
    lease_duration_s: int = 40  # renewed every quarter of it, like a kubelet's 40 s / 10 s
    parallelism: int = 8  # pod and node Stages played at once
    log_level: str = "WARN"  # INFO logs every patch: 30,000 lines for 10,000 pods
    start_timeout_s: float = 60.0
    stop_grace_s: float = 5.0


def _select(*exprs: tuple[str, str, list[str] | None]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": k, "operator": op, **({"values": v} if v else {})}
                                 for k, op, v in exprs]}


_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_NODE_CONDITIONS = """
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}"""


def stages() -> list[dict[str, Any]]:
    """The Stages this cluster runs (see the module docstring), as kwok config documents."""
    def stage(name: str, kind: str, selector: dict[str, Any], nxt: dict[str, Any],
              delay_ms: int | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"resourceRef": {"apiGroup": "v1", "kind": kind},
                                "selector": selector, "next": nxt}
        if delay_ms is not None:
            spec["delay"] = {"durationMilliseconds": delay_ms}
        return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
                "metadata": {"name": name}, "spec": spec}

    node_status = ("{{ $now := Now }}\n{{ $lastTransitionTime := or .metadata.creationTimestamp"
                   " $now }}" + _NODE_CONDITIONS + """
      addresses:
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      allocatable:
      {{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 110
      {{ end }}
      capacity:
      {{ with .status.capacity }}{{ YAML . 1 }}{{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 110
      {{ end }}
      nodeInfo:
        architecture: amd64
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        operatingSystem: linux
      phase: Running
""")
    not_ready = ("{{ $now := Now }}\n" + """
      conditions:
      {{ range NodeConditions }}
      {{ if eq .type "Ready" }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: "kwok: node-not-ready stage"
        reason: "KubeletNotReady"
        status: "False"
        type: "Ready"
      {{ else }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      {{ end }}
""")
    ip = ("{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or "
          ".metadata.uid \"\" ) ( or .metadata.name \"\" ) ( or .metadata.namespace \"\" ) }}\n"
          "podIP: {{ index $podIPs 0 | Quote }}\npodIPs:\n{{ range $podIPs }}\n"
          "- ip: {{ . | Quote }}\n{{ end }}\n"
          "hostIP: {{ NodeIPWith .spec.nodeName | Quote }}\n")
    containers = """containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  imageID: ""
  name: {{ .name | Quote }}
  ready: %(ready)s
  restartCount: 0
  started: %(ready)s
  state:
    %(state)s
{{ end }}
"""
    pod_conditions = """conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "%(ready)s"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "%(ready)s"
  type: ContainersReady
"""
    pod_create = ("{{ $now := Now }}\n" + pod_conditions % {"ready": "False"}
                  + containers % {"ready": "false",
                                  "state": "waiting:\n      reason: ContainerCreating"}
                  + ip + "phase: Pending\n")
    pod_ready = ("{{ $now := Now }}\n" + pod_conditions % {"ready": "True"}
                 + containers % {"ready": "true",
                                 "state": "running:\n      startedAt: {{ $now | Quote }}"}
                 + "phase: Running\nstartTime: {{ $now | Quote }}\n")
    failed = """{{ $now := Now }}
{{ $code := or ( index .metadata.annotations "EXIT_CODE" ) "1" }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: PodFailed
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  imageID: ""
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: {{ $code }}
      reason: Error
      finishedAt: {{ $now | Quote }}
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Failed
""".replace("EXIT_CODE", FAIL_EXIT_CODE)
    live = (".metadata.deletionTimestamp", "DoesNotExist", None)
    return [
        stage("node-initialize", "Node", _select(
            (_READY, "NotIn", ["True"]),
            (f'.metadata.labels["{NOT_READY_LABEL}"]', "DoesNotExist", None)),
            {"statusTemplate": node_status}),
        _with_jitter(stage("node-heartbeat-with-lease", "Node", _select(
            (".status.phase", "In", ["Running"]), (_READY, "In", ["True"]),
            (f'.metadata.labels["{NOT_READY_LABEL}"]', "DoesNotExist", None)),
            {"statusTemplate": "{{ $now := Now }}\n{{ $lastTransitionTime := or "
             ".metadata.creationTimestamp $now }}" + _NODE_CONDITIONS + "\n"},
            delay_ms=600_000), 610_000),
        stage("node-not-ready", "Node", _select(
            (f'.metadata.labels["{NOT_READY_LABEL}"]', "In", ["true"]),
            (_READY, "In", ["True"])),
            {"statusTemplate": not_ready}),
        stage("pod-create", "Pod", _select(live, (".status.podIP", "DoesNotExist", None)),
              {"statusTemplate": pod_create}),
        stage("pod-ready", "Pod", _select(
            live, (".status.phase", "In", ["Pending"]), (".status.podIP", "Exists", None)),
            {"statusTemplate": pod_ready}),
        stage("pod-delete", "Pod", _select(
            (".metadata.deletionTimestamp", "Exists", None),
            (".metadata.finalizers", "DoesNotExist", None)),
            {"delete": True}, delay_ms=DELETE_DELAY_MS),
        stage("pod-container-running-failed", "Pod", _select(
            (f'.metadata.labels["{FAIL_LABEL}"]', "In", ["true"]), live,
            (".status.phase", "In", ["Running"])),
            {"statusTemplate": failed}),
    ]


def _with_jitter(stage: dict[str, Any], jitter_ms: int) -> dict[str, Any]:
    stage["spec"]["delay"]["jitterDurationMilliseconds"] = jitter_ms
    return stage


def node_body(name: str, index: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node for kwok to manage: its own /24 of pod IPs (10.64.0.0/10, index < 16384)."""
    cidr = f"10.{64 + index // 256}.{index % 256}.0/24"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": dict(MANAGED),
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    **(labels or {})}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}


class Kwok:
    """One kwok controller process for `cp`. Use as a context manager, or start() and stop()."""

    def __init__(self, cp: ControlPlane, settings: KwokSettings | None = None,
                 workdir: Path | None = None) -> None:
        self.cp = cp
        self.settings = settings or KwokSettings()
        self._workdir = workdir
        self.workdir = Path()
        self.log = Path()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.failed = False

    def start(self) -> Kwok:
        """Start kwok and wait until it serves /healthz; raise ControlPlaneError if it cannot."""
        s = self.settings
        if not os.access(s.binary, os.X_OK):
            raise ControlPlaneError(f"kwok binary missing at {s.binary} (run: make setup)")
        self.workdir = self._workdir or Path(tempfile.mkdtemp(prefix="es-kwok-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "kwok.log"
        config = self.workdir / "kwok.yaml"
        options = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                   "options": {"podPlayStageParallelism": s.parallelism,
                               "nodePlayStageParallelism": s.parallelism,
                               "nodeLeaseParallelism": s.parallelism}}
        # JSON documents are YAML documents; kwok reads a multi-document file.
        config.write_text("\n---\n".join(json.dumps(d) for d in [options, *stages()]) + "\n")
        (self.port,) = free_ports(1)
        argv = [str(s.binary), f"--config={config}", f"--kubeconfig={self.cp.kubeconfig}",
                "--manage-nodes-with-annotation-selector=" + ",".join(
                    f"{k}={v}" for k, v in MANAGED.items()),
                f"--node-lease-duration-seconds={s.lease_duration_s}",
                f"--server-address=127.0.0.1:{self.port}", "--node-ip=10.63.255.1",
                "--cidr=10.63.0.0/24", f"--v={s.log_level}"]
        try:
            with self.log.open("ab") as log:
                # HOME: kwok would also read ~/.kwok/kwok.yaml; keep it to this directory.
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.workdir, start_new_session=True,
                    env={"PATH": os.environ.get("PATH", ""), "HOME": str(self.workdir)},
                    preexec_fn=_die_with_parent,  # noqa: PLW1509
                )
            wait_http_ok(self.proc, f"http://127.0.0.1:{self.port}/healthz",
                         s.start_timeout_s, "kwok", tail=self.tail)
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        """Raise ControlPlaneError if kwok exited on its own."""
        if self.proc is not None and self.proc.poll() is not None:
            self.failed = True
            raise ControlPlaneError(f"kwok exited with {self.proc.returncode}; log tail:\n"
                                    f"{self.tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, keep_dir: bool | None = None) -> None:
        """Stop kwok (SIGTERM, grace, SIGKILL); remove the workdir unless kept (or failed)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(self.settings.stop_grace_s)
                except subprocess.TimeoutExpired:
                    print("localcluster: kwok ignored SIGTERM, killing", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        keep = self.failed if keep_dir is None else keep_dir
        if keep:
            print(f"localcluster: kept {self.workdir} (kwok.log)", file=sys.stderr)
        elif self._workdir is None and self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Kwok:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.failed = True
        self.stop()


# ---- what the benchmarks and tests ask of kwok's nodes and pods, through the API ----------------

def add_nodes(core: client.CoreV1Api, names: list[str], first_index: int = 0,
              labels: dict[str, str] | None = None) -> None:
    """Create kwok-managed Nodes `names` (pod CIDRs from `first_index` on); kwok makes them
    Ready (see `wait_nodes_ready`)."""
    for i, name in enumerate(names):
        core.create_node(node_body(name, first_index + i, labels))


def wait_nodes_ready(core: client.CoreV1Api, names: list[str], timeout_s: float = 60) -> None:
    """Wait until every node in `names` reports Ready=True; raise TimeoutError."""
    want, deadline = set(names), time.monotonic() + timeout_s
    while True:
        ready = {n["metadata"]["name"] for n in _items(core.list_node(
            label_selector="type=kwok", _preload_content=False))
            if _ready(n) == "True"}
        if want <= ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"kwok nodes not Ready after {timeout_s:g}s: "
                               f"{sorted(want - ready)[:10]}")
        time.sleep(0.2)


def set_node_not_ready(core: client.CoreV1Api, name: str, not_ready: bool) -> None:
    """Label the node for kwok's node-not-ready Stage (it reports Ready=False), or remove the
    label (node-initialize reports Ready again)."""
    core.patch_node(name, {"metadata": {"labels": {NOT_READY_LABEL: "true" if not_ready
                                                   else None}}})


def fail_pod(core: client.CoreV1Api, namespace: str, name: str, exit_code: int) -> None:
    """Ask kwok's pod-container-running-failed Stage to end the pod's container with
    `exit_code` (phase Failed), as the kubelet would report a crash."""
    core.patch_namespaced_pod(name, namespace, {"metadata": {
        "labels": {FAIL_LABEL: "true"}, "annotations": {FAIL_EXIT_CODE: str(exit_code)}}})


def _items(resp: Any) -> list[dict[str, Any]]:
    return json.loads(resp.data).get("items") or []


def _ready(obj: dict[str, Any]) -> str | None:
    return next((c.get("status") for c in (obj.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "Ready"), None)
