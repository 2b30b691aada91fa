"""Real object shapes captured from the local control plane, and variations built from them.

pod_running_ready / node_ready: a worker pod with the status a kubelet writes and its Ready
node; node_unreachable: the same node after the node-lifecycle controller saw its Lease expire;
pod_deleting_graceful: the pod right after a graceful delete (deletionTimestamp, grace 30).
pod_container_creating: a worker bound to its node that has not started (Pending,
ContainerCreating); pod_waiting_reasons: the kubelet's container statuses of pods that never
start (image pulls, missing Secrets, the node authorizer after a kube-apiserver restart),
written from the kubelet's own texts, not captured: the local control plane has no kubelet.
h200_stuck_work*.jsonl.gz: the hook's datagrams from CUDA processes on an H200, one rank stuck
in a GPU kernel at a time (scripts/gpu_stuck_record.py; tests/unit/test_stuck_gpu.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def load(name: str) -> dict[str, Any]:
    """Return a fresh deep copy of the captured object `name`."""
    return json.loads((HERE / f"{name}.json").read_text())


def pod(name: str = "w-0", ip: str | None = "10.1.0.10", node: str = "node-a",
        uid: str | None = None, **status: Any) -> dict[str, Any]:
    """The captured Running+Ready worker pod, renamed, with its IP/node/status overridden."""
    p = load("pod_running_ready")
    p["metadata"]["name"] = name
    p["metadata"]["uid"] = uid or f"uid-{name}"
    p["spec"]["nodeName"] = node
    if ip is None:
        p["status"].pop("podIP", None)
        p["status"].pop("podIPs", None)
    else:
        p["status"]["podIP"] = ip
        p["status"]["podIPs"] = [{"ip": ip}]
    p["status"].update(status)
    return p


def with_condition(obj: dict[str, Any], ctype: str, value: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for c in out["status"]["conditions"]:
        if c["type"] == ctype:
            c["status"] = value
    return out


def node(name: str = "node-a", shape: str = "node_ready") -> dict[str, Any]:
    n = load(shape)
    n["metadata"]["name"] = name
    return n


def not_started(variant: str, name: str = "job1-w0-1", node: str = "node-a") -> dict[str, Any]:
    """A bound, Pending worker pod (pod_container_creating) with the kubelet's container
    statuses of `variant` (a key of pod_waiting_reasons)."""
    p = load("pod_container_creating")
    p["metadata"]["name"] = name
    p["metadata"]["uid"] = f"uid-{name}"
    p["spec"]["nodeName"] = node
    statuses = load("pod_waiting_reasons")[variant]
    p["status"].pop("containerStatuses", None)
    p["status"].update(copy.deepcopy(statuses))
    return p
