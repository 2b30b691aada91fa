"""What a kubelet writes to the API, for nodes and pods that have no real kubelet here.

`Heartbeats` registers Node objects (Ready, with a Lease in kube-node-lease) and renews their
Leases like a kubelet, so the real node-lifecycle controller keeps them Ready; `stop(node)`
makes a node go silent (the controller then marks it Unknown and taints it).
The pod helpers patch pod status the way a kubelet does (phase, podIP, conditions,
containerStatuses). For integration tests of the supervisor's decisions on exact object shapes
and for the discovery benchmarks' hand-timed writes; never for end-to-end tests, which run on
real nodes (localcluster/nodes.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

LEASE_NS = "kube-node-lease"
# What a registered node offers the scheduler (a node without allocatable fits no pod).
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def ready_condition(status: str = "True", reason: str = "KubeletReady") -> dict[str, str]:
    t = now_iso()
    return {"type": "Ready", "status": status, "reason": reason,
            "message": f"kubelet stand-in: Ready={status}", "lastHeartbeatTime": t,
            "lastTransitionTime": t}


class Heartbeats:
    """Registers nodes and renews their Leases every `period_s` seconds from a thread."""

    def __init__(self, api: client.ApiClient, period_s: float = 1.0) -> None:
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.period_s = period_s
        self.renewing: set[str] = set()
        self.registered: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def register(self, name: str, labels: dict[str, str] | None = None,
                 capacity: dict[str, str] | None = None) -> None:
        """Create Node `name` (Ready, with capacity so the scheduler binds pods to it) and its
        Lease, and keep renewing it."""
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name=name, labels={"kubernetes.io/hostname": name, **(labels or {})})))
        resources = capacity or NODE_CAPACITY
        self.core.patch_node_status(name, {"status": {
            "conditions": [ready_condition()], "capacity": resources,
            "allocatable": resources}})
        self.coord.create_namespaced_lease(LEASE_NS, client.V1Lease(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1LeaseSpec(holder_identity=name,
                                    # The kubelet renews every leaseDurationSeconds / 4.
                                    lease_duration_seconds=max(1, round(4 * self.period_s)),
                                    renew_time=dt.datetime.now(dt.UTC))))
        with self._lock:
            self.registered.add(name)
            self.renewing.add(name)

    def silence(self, name: str) -> None:
        """Stop renewing `name`'s Lease (a dead or partitioned kubelet)."""
        with self._lock:
            self.renewing.discard(name)

    def resume(self, name: str) -> None:
        """Renew `name`'s Lease again and report Ready (the kubelet came back)."""
        self.core.patch_node_status(name, {"status": {"conditions": [ready_condition()]}})
        with self._lock:
            self.renewing.add(name)

    def close(self, delete: bool = True) -> None:
        self._stop.set()
        self._thread.join(5)
        if delete:
            for name in self.registered:
                with contextlib.suppress(ApiException):
                    self.core.delete_node(name)
                with contextlib.suppress(ApiException):
                    self.coord.delete_namespaced_lease(name, LEASE_NS)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with self._lock:
                names = list(self.renewing)
            for name in names:
                # Like a kubelet, keep trying through API outages: never let the thread die.
                with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError):
                    self.coord.patch_namespaced_lease(name, LEASE_NS,
                                                      {"spec": {"renewTime": now_iso()}})
                    # Like the kubelet's status sync: if the node-lifecycle controller marked
                    # the node Unknown (e.g. after an API outage), report Ready again.
                    node = self.core.read_node(name)
                    ready = next((c.status for c in node.status.conditions or ()
                                  if c.type == "Ready"), None)
                    if ready != "True":
                        self.core.patch_node_status(
                            name, {"status": {"conditions": [ready_condition()]}})


def pod_status_running(ip: str, ready: bool = True, container: str = "worker") -> dict[str, Any]:
    """The status a kubelet writes for a started (and maybe Ready) single-container pod."""
    t = now_iso()
    ready_s = "True" if ready else "False"
    return {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": t,
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "Ready", "status": ready_s, "lastTransitionTime": t},
            {"type": "ContainersReady", "status": ready_s, "lastTransitionTime": t},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
        ],
        "containerStatuses": [{
            "name": container, "image": "worker:local", "imageID": "", "ready": ready,
            "started": True, "restartCount": 0, "containerID": f"local://{ip}",
            "state": {"running": {"startedAt": t}},
        }],
    }


def set_pod_ready(core: client.CoreV1Api, namespace: str, name: str, ready: bool) -> None:
    """Flip the Ready/ContainersReady conditions of a running pod."""
    pod = core.read_namespaced_pod(name, namespace)
    ip = pod.status.pod_ip
    core.patch_namespaced_pod_status(name, namespace, {"status": pod_status_running(ip, ready)})


def set_node_ready(core: client.CoreV1Api, name: str, status: str) -> None:
    """Report the node's Ready condition as `status` (True|False|Unknown)."""
    core.patch_node_status(name, {"status": {"conditions": [ready_condition(status)]}})
