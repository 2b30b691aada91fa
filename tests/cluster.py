"""Test helpers for pods on the real nodes of localcluster.nodes (no fixtures here).

`ClusterPods` creates, reads and waits for pods in one namespace of a `Cluster`, runs kubectl
against it, and reaches into a node for the faults a test injects (processes of a container,
the node's kubelet, its freezer cgroup, iptables). Objects are API-shaped dicts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.nodes import POOL_LABEL, Cluster, Node
from localcluster.tarimage import TOOLBOX_IMAGE
from tests.helpers import wait_for

Pod = dict[str, Any]


def toolbox_pod(name: str, command: str, *, node: str | None = None,
                restart: str = "Never", grace_s: int = 2, **spec: Any) -> Pod:
    """A pod running `command` with sh in the toolbox image (busybox), on `node` if given."""
    body: Pod = {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": grace_s,
                 "dnsPolicy": "Default", "enableServiceLinks": False,
                 "containers": [{"name": "c", "image": TOOLBOX_IMAGE,
                                 "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", command]}], **spec},
    }
    if node is not None:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def condition(pod: Pod | None, kind: str) -> str | None:
    return next((c["status"] for c in (pod or {}).get("status", {}).get("conditions") or ()
                 if c["type"] == kind), None)


def terminated(pod: Pod | None) -> dict[str, Any] | None:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
    return (statuses[0].get("state") or {}).get("terminated")


@dataclass
class ClusterPods:
    cluster: Cluster
    core: client.CoreV1Api
    namespace: str

    def create(self, body: Pod) -> Pod:
        """Create the pod; on the cluster's pool (beside other tests) unless it names a node."""
        if self.cluster.pool is not None:
            body["spec"].setdefault("nodeSelector", {}).setdefault(POOL_LABEL, self.cluster.pool)
        resp = self.core.create_namespaced_pod(self.namespace, body, _preload_content=False)
        return json.loads(resp.data)

    def read(self, name: str) -> Pod | None:
        try:
            resp = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return json.loads(resp.data)

    def wait(self, name: str, what: str, predicate: Callable[[Pod], bool],
             timeout: float = 60) -> Pod:
        def check() -> Pod | None:
            pod = self.read(name)
            return pod if pod is not None and predicate(pod) else None
        return wait_for(check, timeout, 0.2, what=f"pod {self.namespace}/{name} {what}")

    def wait_ready(self, name: str, timeout: float = 60) -> Pod:
        return self.wait(name, "Running and Ready",
                         lambda p: p["status"].get("phase") == "Running"
                         and condition(p, "Ready") == "True", timeout)

    def wait_terminated(self, name: str, timeout: float = 60) -> dict[str, Any]:
        pod = self.wait(name, "terminated", lambda p: terminated(p) is not None, timeout)
        state = terminated(pod)
        assert state is not None
        return state

    def kubectl(self, *args: str, timeout: float = 60,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.cluster.cp is not None
        kubectl = self.cluster.cp.settings.bin_dir / "kubectl"
        res = subprocess.run([str(kubectl), "--kubeconfig", str(self.cluster.kubeconfig),
                              "-n", self.namespace, *args], capture_output=True, text=True,
                             timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {res.returncode}: "
                                 f"{res.stderr.strip()}")
        return res

    def exec(self, name: str, command: str, timeout: float = 30) -> str:
        """Run `command` with sh in the pod's (first) container; return its stdout."""
        return self.kubectl("exec", name, "--", "sh", "-c", command, timeout=timeout).stdout

    def node_of(self, name: str) -> Node:
        pod = self.read(name)
        assert pod is not None and pod["spec"].get("nodeName"), f"{name} is not scheduled"
        return self.cluster.node(pod["spec"]["nodeName"])
