"""kwok against the session's control plane: its Stages play the kubelet for simulated nodes
(Ready, NotReady on its chaos label, Leases), and for their pods (Running and Ready with an IP
from the node's CIDR, a crash with a chosen exit code, the end of a graceful delete); a stop
leaves no process and no directory.
"""

from __future__ import annotations

import json
import os
import uuid

import psutil
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster import kwok
from localcluster.controlplane import ControlPlane
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _get(fn, *args) -> dict:
    return json.loads(fn(*args, _preload_content=False).data)


def _ready(obj: dict) -> str | None:
    return next((c["status"] for c in obj["status"].get("conditions") or ()
                 if c["type"] == "Ready"), None)


def test_kwok_plays_the_kubelet_of_its_nodes_and_pods(
        control_plane: ControlPlane, core: client.CoreV1Api, namespace: str) -> None:
    k = kwok.Kwok(control_plane).start()
    pid, workdir = k.pid, k.workdir
    nodes = [f"kwok-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    try:
        kwok.add_nodes(core, nodes, first_index=200)
        kwok.wait_nodes_ready(core, nodes, timeout_s=30)
        lease = client.CoordinationV1Api(core.api_client).read_namespaced_lease(
            nodes[0], "kube-node-lease")
        assert lease.spec.renew_time is not None
        for i, node in enumerate([nodes[0], nodes[0], nodes[1]]):
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": f"w{i}"},
                "spec": {"nodeName": node, "restartPolicy": "Never",
                         "containers": [{"name": "worker", "image": "worker:local"}]}})

        def running() -> list[dict]:
            pods = [_get(core.read_namespaced_pod, f"w{i}", namespace) for i in range(3)]
            return pods if all(p["status"].get("phase") == "Running" and _ready(p) == "True"
                               for p in pods) else []

        pods = wait_for(running, 30, what="kwok to start the pods")
        # Node index 200 -> 10.64.200.0/24, 201 -> 10.64.201.0/24.
        assert [p["status"]["podIP"].rsplit(".", 1)[0] for p in pods] == [
            "10.64.200", "10.64.200", "10.64.201"]
        assert len({p["status"]["podIP"] for p in pods}) == 3

        kwok.set_node_not_ready(core, nodes[1], True)
        wait_for(lambda: _ready(_get(core.read_node, nodes[1])) == "False", 15,
                 what="kwok's node-not-ready Stage")
        kwok.set_node_not_ready(core, nodes[1], False)
        wait_for(lambda: _ready(_get(core.read_node, nodes[1])) == "True", 15,
                 what="node-initialize to report Ready again")

        kwok.fail_pod(core, namespace, "w0", 137)
        failed = wait_for(lambda: (p := _get(core.read_namespaced_pod, "w0", namespace))[
            "status"]["phase"] == "Failed" and p, 15, what="the crash Stage")
        assert failed["status"]["containerStatuses"][0]["state"]["terminated"][
            "exitCode"] == 137

        core.delete_namespaced_pod("w1", namespace, grace_period_seconds=30)

        def gone() -> bool:
            try:
                core.read_namespaced_pod("w1", namespace)
            except ApiException as e:
                return e.status == 404
            return False

        wait_for(gone, 15, what="kwok to finish the graceful delete")
        k.check_alive()
    finally:
        k.stop()
        for node in nodes:
            core.delete_node(node)
    assert not psutil.pid_exists(pid)
    assert not os.path.exists(workdir)
