"""Pods built by supervisor.workers are accepted by the real API server as they are, and the
ownerReference makes the garbage collector delete them with the launcher pod."""

from __future__ import annotations

from kubernetes import client

from supervisor.workers import validate_template, worker_pod
from tests.helpers import wait_for
from tests.unit.test_workers import SELECTOR, TEMPLATE


def test_replacement_pod_is_valid_and_owned_by_the_launcher(
    core: client.CoreV1Api, namespace: str
) -> None:
    launcher = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "bert-launcher"},
        "spec": {"containers": [{"name": "launcher", "image": "launcher:1.0"}]}})
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "bert-launcher",
             "uid": launcher.metadata.uid}
    pod = worker_pod(validate_template(TEMPLATE, SELECTOR), job="bert", slot=1, incarnation=3,
                     owner=owner, avoid_node="node-x")
    created = core.create_namespaced_pod(namespace, pod)
    assert created.metadata.name == "bert-w1-3"
    listed = core.list_namespaced_pod(
        namespace, label_selector=",".join(f"{k}={v}" for k, v in SELECTOR.items()))
    assert [p.metadata.name for p in listed.items] == ["bert-w1-3"]
    term = created.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert [(f.key, f.operator, f.values) for f in term[0].preference.match_fields] == [
        ("metadata.name", "NotIn", ["node-x"])], "by the node's name, as the API stored it"

    core.delete_namespaced_pod("bert-launcher", namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(
        namespace, label_selector="elastic-supervisor/job=bert").items, 60, interval=0.5,
        what="the worker garbage-collected with its launcher")
