"""Capture real watch-event sequences of worker failures from the local control plane.

Run: .venv/bin/python -m tests.unit.shapes.capture   (about 90 s; rewrites sequences/*.json)

Each scenario creates a worker pod bound to a lease-renewed node, writes a Running status the
way a kubelet does, then causes one failure through the real API server and controllers, and
records every watch event (type + slimmed object) the supervisor would see. Where a kubelet
would write status (container terminated, restarts), we write it in the kubelet's format; the
deletes, the eviction and PodGC are done by the real API server and controller-manager.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from localcluster.controlplane import ControlPlane, Settings
from localcluster.kubelet import Heartbeats, now_iso, pod_status_running
from supervisor import kube
from supervisor.observe import Kind, slim
from tests.conftest import make_namespace

OUT = Path(__file__).parent / "sequences"


def terminated(code: int, reason: str = "Error", signal: int | None = None) -> dict[str, Any]:
    t = now_iso()
    state: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": t,
                             "finishedAt": t, "containerID": "local://x"}
    if signal is not None:
        state["signal"] = signal
    return {"terminated": state}


class Recorder:
    """Watches the pods of one namespace and keeps (type, slim object) per pod."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.events: queue.Queue[Any] = queue.Queue()
        self.r = kube.Reflector(Kind.POD, kube.lister(api, Kind.POD, ns, "app=worker"),
                                self.events.put, transform=slim)
        self.r.start()

    def take(self, pod: str, until: Callable[[str, dict[str, Any]], bool],
             timeout: float = 120) -> list[dict[str, Any]]:
        seq: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.events.get(timeout=1)
            except queue.Empty:
                continue
            if not hasattr(item, "obj") or item.obj["metadata"]["name"] != pod:
                continue
            seq.append({"type": item.type.value, "object": item.obj})
            if until(item.type.value, item.obj):
                return seq
        raise TimeoutError(f"{pod}: sequence did not complete: {[e['type'] for e in seq]}")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp:
        api = kube.make_api_client(str(cp.kubeconfig))
        core = client.CoreV1Api(api)
        ns = make_namespace(core)
        hb = Heartbeats(api)
        for n in ("node-a", "node-b", "node-gone"):
            hb.register(n)
        rec = Recorder(api, ns)
        ip = iter(f"10.9.0.{i}" for i in range(1, 200))

        def worker(name: str, node: str = "node-a", restart: str = "Never") -> None:
            core.create_namespaced_pod(ns, {
                "metadata": {"name": name, "labels": {"app": "worker"}},
                "spec": {"nodeName": node, "restartPolicy": restart,
                         "containers": [{"name": "worker", "image": "w"}]}})
            core.patch_namespaced_pod_status(name, ns, {"status": pod_status_running(next(ip))})

        def save(name: str, seq: list[dict[str, Any]]) -> None:
            (OUT / f"{name}.json").write_text(json.dumps(seq, indent=1) + "\n")
            print(f"{name}: {[e['type'] for e in seq]}", flush=True)

        def deleted(t: str, _o: dict[str, Any]) -> bool:
            return t == "DELETED"

        # 1. restartPolicy Never, the container is SIGKILLed (137): kubelet reports Failed.
        worker("exit137")
        core.patch_namespaced_pod_status("exit137", ns, {"status": {
            "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "worker", "image": "w", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": terminated(137)}]}})
        save("exit137_never", rec.take("exit137", lambda t, o: o["status"].get("phase") ==
                                       "Failed"))

        # 2. restartPolicy OnFailure, exit 1: kubelet restarts in place, restartCount 1.
        worker("onfail", restart="OnFailure")
        core.patch_namespaced_pod_status("onfail", ns, {"status": {"containerStatuses": [{
            "name": "worker", "image": "w", "imageID": "", "ready": True, "started": True,
            "restartCount": 1, "state": {"running": {"startedAt": now_iso()}},
            "lastState": terminated(1)}]}})
        save("exit1_onfailure_restart", rec.take("onfail", lambda t, o: (
            o["status"].get("containerStatuses") or [{}])[0].get("restartCount") == 1))

        # 3. kubectl delete --grace-period=0 --force while running.
        worker("forced")
        core.delete_namespaced_pod("forced", ns, grace_period_seconds=0)
        save("force_delete", rec.take("forced", deleted))

        # 4. graceful delete by someone else: the kubelet stops the container (143), then
        #    deletes the pod for good.
        worker("graceful")
        core.delete_namespaced_pod("graceful", ns, grace_period_seconds=30)
        core.patch_namespaced_pod_status("graceful", ns, {"status": {
            "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "worker", "image": "w", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": terminated(143)}]}})
        core.delete_namespaced_pod("graceful", ns, grace_period_seconds=0)
        save("graceful_delete", rec.take("graceful", deleted))

        # 5. the Eviction API (e.g. kubectl drain): DisruptionTarget=EvictionByEvictionAPI.
        worker("evicted")
        core.create_namespaced_pod_eviction("evicted", ns, {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "evicted", "namespace": ns}})
        seq = rec.take("evicted", lambda t, o: bool(o["metadata"].get("deletionTimestamp")))
        core.delete_namespaced_pod("evicted", ns, grace_period_seconds=0)  # the kubelet's part
        seq += rec.take("evicted", deleted)
        save("eviction_api", seq)

        # 6. the node object is deleted: PodGC marks the pod (DeletionByPodGC, Failed) and
        #    force-deletes it, after its 40 s quarantine.
        worker("orphan", node="node-gone")
        hb.silence("node-gone")
        core.delete_node("node-gone")
        save("pod_gc_node_deleted", rec.take("orphan", deleted, timeout=180))

        # 7. kubelet node-pressure eviction: phase Failed, reason Evicted, no DisruptionTarget.
        worker("pressure")
        core.patch_namespaced_pod_status("pressure", ns, {"status": {
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "worker", "image": "w", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": terminated(137)}]}})
        save("kubelet_pressure_eviction", rec.take("pressure", lambda t, o: o["status"].get(
            "reason") == "Evicted"))

        rec.r.stop()
        hb.close()
        api.close()


if __name__ == "__main__":
    threading.excepthook = lambda args: print(f"thread error: {args.exc_value!r}")
    main()
