"""Pools of the local cluster with real nodes (localcluster.nodes, localcluster.job.on_pool):
which pool a node is in, a job kept on its pool, and what another process attaches to. The
clusters themselves run in tests/e2e (`make test-e2e-nodes NODES_BESIDE=...`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.controlplane import ControlPlane
from localcluster.controlplane import Settings as CpSettings
from localcluster.job import on_pool
from localcluster.nodes import POOL_LABEL, Cluster, ClusterError, ClusterSettings, Node, NodeSpec


@pytest.mark.parametrize(("nodes", "pools", "expected"), [
    (3, 1, "aaa"),
    (6, 2, "aaabbb"),
    (4, 2, "aabb"),
])
def test_each_node_is_in_one_pool_of_equal_size(nodes: int, pools: int, expected: str) -> None:
    s = ClusterSettings(nodes=nodes, pools=pools)
    assert "".join(s.pool_of(i) for i in range(1, nodes + 1)) == expected


@pytest.mark.parametrize(("nodes", "pools"), [(5, 2), (3, 0), (18, 9)])
def test_nodes_that_do_not_split_evenly_are_refused(nodes: int, pools: int) -> None:
    with pytest.raises(ClusterError, match=f"{nodes} nodes do not split into {pools} pools"):
        ClusterSettings(nodes=nodes, pools=pools).pool_of(1)


TEMPLATE = {"apiVersion": "v1", "kind": "Pod",
            "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "worker"}]}}
DOCS: list[dict[str, Any]] = [
    {"kind": "Job", "metadata": {"name": "elastic-train"},
     "spec": {"template": {"spec": {"containers": [{"name": "launcher"}]}}}},
    {"kind": "ConfigMap", "metadata": {"name": "elastic-train-config"},
     "data": {"worker-template.yaml": yaml.safe_dump(TEMPLATE)}},
    {"kind": "ConfigMap", "metadata": {"name": "other"}, "data": {"x": "y"}},
]


def test_a_pooled_job_keeps_its_launcher_and_workers_on_the_pool_and_their_own_selectors(
        ) -> None:
    docs = copy.deepcopy(DOCS)
    on_pool(docs, "b")
    assert docs[0]["spec"]["template"]["spec"]["nodeSelector"] == {POOL_LABEL: "b"}
    template = yaml.safe_load(docs[1]["data"]["worker-template.yaml"])
    assert template["spec"]["nodeSelector"] == {"disk": "ssd", POOL_LABEL: "b"}
    assert docs[2] == DOCS[2]


def test_another_process_attaches_to_one_pool_of_a_shared_cluster(tmp_path: Path) -> None:
    settings = ClusterSettings(nodes=4, pools=2, images=(tmp_path / "img.tar",),
                               pause_image="pause:1", node_monitor_grace_period_s=20)
    cp = ControlPlane(CpSettings(bin_dir=tmp_path / "bin"))
    cp.kubeconfig, cp.workdir = tmp_path / "admin.kubeconfig", tmp_path / "control-plane"
    nodes = [Node(NodeSpec.of(i, 10250 + i, settings.pool_of(i)), tmp_path / f"es-node-{i}", cp,
                  settings, cp.settings.bin_dir) for i in range(1, 5)]
    owner = Cluster(settings=settings, workdir=tmp_path, cp=cp, nodes=nodes)

    record = owner.share(tmp_path / "cluster.json")
    attached = Cluster.attach(record, "b")
    assert [n.name for n in attached.nodes] == ["es-node-3", "es-node-4"]
    assert [n.spec for n in attached.nodes] == [n.spec for n in nodes[2:]]
    assert [n.dir for n in attached.nodes] == [n.dir for n in nodes[2:]]
    assert attached.kubeconfig == cp.kubeconfig and attached.settings == settings
    assert attached.pool == "b" and not attached.owner
    assert attached.nodes[0].kubelet.detached, "a kubelet it starts again outlives it"
    assert attached.stop() == [], "an attached cluster stops nothing"
    view = owner.view("a")
    assert [n.name for n in view.nodes] == ["es-node-1", "es-node-2"] and not view.owner
    with pytest.raises(ClusterError, match="no node in pool 'c'"):
        Cluster.attach(record, "c")
    assert json.loads(record.read_text())["settings"]["pools"] == 2
