"""The local cluster's nodes are real: kubelets, containerd, CNI and kube-proxy do what they do in
a cluster, so that the end-to-end tests built on them prove something.

Pods run the toolbox image (static busybox) so that these tests do not wait for the training
images; the training images themselves are checked in tests/e2e. A node whose kubelet is stopped
goes NotReady through the node controller in the main tour (test_main_job.py), which keeps the
checks that stood here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kubernetes import client

from tests.cluster import ClusterPods, toolbox_pod
from tests.helpers import wait_for


def netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_pods_get_their_own_ip_and_network_namespace_and_reach_each_other_across_nodes(
        cluster_pods: ClusterPods) -> None:
    pods = cluster_pods
    n1, n2 = (n.name for n in pods.cluster.nodes[:2])
    pods.create(toolbox_pod("server", "while true; do nc -l -p 8080 -e echo hello; done",
                            node=n2))
    pods.create(toolbox_pod("client", "sleep 100000", node=n1))
    server, client_pod = pods.wait_ready("server"), pods.wait_ready("client")
    ips = server["status"]["podIP"], client_pod["status"]["podIP"]
    assert ips[0].startswith("10.244.2.") and ips[1].startswith("10.244.1."), ips

    out = pods.exec("client", f"echo | nc -w 5 {ips[0]} 8080")
    assert out.strip() == "hello"

    namespaces = set()
    for name, node in (("server", n2), ("client", n1)):
        pod = pods.read(name)
        assert pod is not None
        pids = pods.cluster.node(node).pod_pids(pod["metadata"]["uid"])
        assert pids, f"no processes found for {name}"
        namespaces |= {netns_of(pid) for pid in pids}
    assert len(namespaces) == 2, "one network namespace per pod, none shared with another"
    assert netns_of(os.getpid()) not in namespaces


def test_a_container_exit_code_and_an_oom_kill_are_reported_as_a_kubelet_reports_them(
        cluster_pods: ClusterPods) -> None:
    pods = cluster_pods
    pods.create(toolbox_pod("exits", "sleep 1; exit 42"))
    body = toolbox_pod("oom", "dd if=/dev/zero of=/dev/null bs=256M count=4")
    body["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi"}}
    pods.create(body)

    state = pods.wait_terminated("exits")
    assert state["exitCode"] == 42 and state["reason"] == "Error"
    assert pods.wait("exits", "Failed", lambda p: p["status"]["phase"] == "Failed")
    state = pods.wait_terminated("oom")
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled")


def test_kubectl_exec_and_logs_reach_the_container(cluster_pods: ClusterPods) -> None:
    pods = cluster_pods
    pods.create(toolbox_pod("talker", "echo started; sleep 100000"))
    pods.wait_ready("talker")
    assert pods.exec("talker", "echo $((6 * 7)); hostname").split() == ["42", "talker"]
    logs = wait_for(lambda: pods.kubectl("logs", "talker").stdout, 10, what="logs")
    assert logs.strip() == "started"


def test_a_configmap_update_reaches_a_mounted_volume(cluster_pods: ClusterPods) -> None:
    pods = cluster_pods
    pods.core.create_namespaced_config_map(pods.namespace, {
        "metadata": {"name": "cfg"}, "data": {"value": "one"}})
    body = toolbox_pod("reader", "sleep 100000")
    body["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "cfg"}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    pods.create(body)
    pods.wait_ready("reader")
    assert pods.exec("reader", "cat /cfg/value") == "one"
    pods.core.patch_namespaced_config_map("cfg", pods.namespace, {"data": {"value": "two"}})
    # Within the kubelet's sync (syncFrequency 10 s here) plus its ConfigMap cache; how long
    # it takes is measured by `python -m bench --only configmap`, not asserted here (a sync
    # that falls right after the patch delivers it in 0.1 s).
    wait_for(lambda: pods.exec("reader", "cat /cfg/value") == "two", 120, interval=0.5,
             what="the new value in the mounted file")


def test_a_pod_reaches_the_api_through_the_kubernetes_service_with_its_service_account(
        cluster_pods: ClusterPods, cluster_api: client.ApiClient) -> None:
    pods, ns = cluster_pods, cluster_pods.namespace
    pods.core.create_namespaced_service_account(ns, {"metadata": {"name": "reader"}})
    rbac = client.RbacAuthorizationV1Api(cluster_api)
    rbac.create_namespaced_role(ns, {"metadata": {"name": "pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})
    body = toolbox_pod("api", "sleep 100000", serviceAccountName="reader")
    pods.create(body)
    pods.wait_ready("api")
    env = pods.exec("api", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT").strip()
    assert env == "10.0.0.1:443"
    get = ("wget -q -O- --no-check-certificate --header \"Authorization: Bearer "
           "$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" "
           "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT")
    listed = pods.exec("api", f"{get}/api/v1/namespaces/{ns}/pods")
    assert '"kind":"PodList"' in listed.replace(" ", "") and '"name":"api"' in listed.replace(
        " ", "")
    denied = pods.kubectl("exec", "api", "--", "sh", "-c",
                          f"{get}/api/v1/namespaces/{ns}/secrets 2>&1", check=False)
    assert "403" in denied.stdout + denied.stderr


def test_a_frozen_node_stops_every_process_and_a_partitioned_pod_is_unreachable(
        cluster_pods: ClusterPods) -> None:
    pods = cluster_pods
    n1, n2 = (n.name for n in pods.cluster.nodes[:2])
    pods.create(toolbox_pod("ticker", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; "
                            "sleep 0.1; done", node=n2))
    pods.create(toolbox_pod("peer", "sleep 100000", node=n1))
    ticker, _ = pods.wait_ready("ticker"), pods.wait_ready("peer")
    node = pods.cluster.node(n2)
    # The ticker's file, seen from the host through its shell (not the pause, not a `sleep`).
    def shell_root() -> Path | None:
        for pid in node.pod_pids(ticker["metadata"]["uid"]):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0] == b"sh" and (c := Path(f"/proc/{pid}/root/tmp/n")).exists():
                return c
        return None

    counter = wait_for(shell_root, 10, what="the ticker's counter file")

    node.freeze()
    try:
        time.sleep(0.3)
        frozen = counter.read_text()
        time.sleep(1.0)
        assert counter.read_text() == frozen, "a frozen node's container kept running"
        assert node.kubelet.alive(), "frozen, not dead"
    finally:
        node.thaw()
    wait_for(lambda: counter.read_text() != frozen, 5, what="the ticker running again")

    ip = ticker["status"]["podIP"]
    assert pods.exec("peer", f"ping -c 1 -W 2 {ip} >/dev/null && echo up").strip() == "up"
    with pods.cluster.partition(ip):
        res = pods.kubectl("exec", "peer", "--", "ping", "-c", "2", "-W", "1", ip, check=False)
        assert res.returncode != 0, "a partitioned pod answered"
    assert pods.exec("peer", f"ping -c 1 -W 2 {ip} >/dev/null && echo up").strip() == "up"


def test_a_pod_on_a_node_whose_kubelet_died_keeps_running_until_force_deleted(
        cluster_pods: ClusterPods) -> None:
    """What the supervisor's NodeNotReady handling relies on: without a kubelet a deleted pod
    stays Terminating (nobody confirms), and its containers still run; grace 0 removes the
    object at once."""
    pods = cluster_pods
    node = pods.cluster.nodes[-1]
    pods.create(toolbox_pod("orphan", "sleep 100000", node=node.name))
    orphan = pods.wait_ready("orphan")
    node.stop_kubelet()
    try:
        pods.core.delete_namespaced_pod("orphan", pods.namespace, grace_period_seconds=2)
        time.sleep(4)
        still = pods.read("orphan")
        assert still is not None and still["metadata"].get("deletionTimestamp")
        assert node.pod_pids(orphan["metadata"]["uid"]), "containers still running"
        pods.core.delete_namespaced_pod("orphan", pods.namespace, grace_period_seconds=0)
        wait_for(lambda: pods.read("orphan") is None, 10, what="force-deleted pod gone")
    finally:
        node.start_kubelet()
    # The kubelet, back, kills the containers of a pod that no longer exists.
    wait_for(lambda: not node.pod_pids(orphan["metadata"]["uid"]), 60, interval=0.5,
             what="the orphan's containers killed by the returning kubelet")
