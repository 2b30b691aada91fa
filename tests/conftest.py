"""Shared fixtures: the real local control plane, the cluster with real nodes (both
session-scoped, started on first use) and per-test namespaces.

Tests marked `integration` or `e2e` get a real etcd + kube-apiserver + kube-controller-manager +
kube-scheduler; those that run pods get real nodes (kubelet + containerd each, localcluster.nodes).
There is no fallback: if the binaries are missing the tests error, they are never skipped
silently.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from localcluster import images
from localcluster.controlplane import ControlPlane, Settings
from localcluster.nodes import Cluster, ClusterError, ClusterSettings, recover_stale
from tests.cluster import ClusterPods
from tests.helpers import CLUSTER_NODE_GRACE_S, NODE_GRACE_S, wait_for

# Tests that start clusters with real nodes of their own: they run before anything starts the
# session's (one cluster with real nodes per machine at a time).
OWN_CLUSTER_FIRST = ("test_cluster_lifecycle.py",)
# What the tests with real nodes write outside the image caches (containers' layers, clusters'
# logs, jobs' checkpoints); below this they fail by the dozen, each for another reason.
TMP_FREE_GIB = 6


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Each test lives in tests/<kind>/: mark it accordingly so `-m unit` etc. select it.
    for item in items:
        kind = Path(str(item.fspath)).parent.name
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))
    items.sort(key=lambda item: Path(str(item.fspath)).name not in OWN_CLUSTER_FIRST)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop at once, with one line, when tests that run clusters lack the disk to."""
    if not any(item.get_closest_marker(k) for item in session.items
               for k in ("integration", "e2e")):
        return
    # A cluster whose owner died (a machine restarted under a test run) left gigabytes in /tmp
    # that are not this run's to lose; a live cluster (another run, a demo) is left alone.
    with contextlib.suppress(ClusterError):
        if done := recover_stale():
            print("localcluster: " + "; ".join(done), file=sys.stderr)
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    if free < TMP_FREE_GIB:
        pytest.exit(f"the integration and e2e tests need {TMP_FREE_GIB} GiB free on the "
                    f"filesystem of {tmp}, it has {free:.1f} GiB", returncode=2)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane(Settings(node_monitor_grace_period_s=NODE_GRACE_S))
    cp.start()
    yield cp
    if request.session.testsfailed:
        cp.failed = True  # keep logs and etcd data for the post-mortem
    cp.stop()


@pytest.fixture(scope="module")
def restartable_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A private control plane for tests that crash or restart kube-apiserver.

    After an API outage the controller-manager's informers back off; with the session plane's
    short node grace it would then mark every node NotReady and delay ServiceAccounts for the
    tests that follow. This one uses the production node grace (40 s) and is not shared.
    """
    cp = ControlPlane(Settings(node_monitor_grace_period_s=40))
    cp.start()
    yield cp
    if request.session.testsfailed:
        cp.failed = True
    cp.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def make_namespace(core: client.CoreV1Api) -> str:
    """Create a fresh namespace and wait for its `default` ServiceAccount (pods need it)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def default_sa_exists() -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(name).items
        )

    wait_for(default_sa_exists, 30, what=f"ServiceAccount {name}/default")
    return name


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace on the session control plane."""
    name = make_namespace(core)
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A control plane with three real nodes (kubelet + containerd each) and kube-proxy; every
    node holds the launcher and worker images (built by `make setup`, cached)."""
    tarballs = images.build(images.Settings())
    c = Cluster(ClusterSettings(nodes=3, node_monitor_grace_period_s=CLUSTER_NODE_GRACE_S,
                                images=tuple(sorted(set(tarballs.values())))))
    c.start()
    yield c
    if request.session.testsfailed:
        c.failed = True
    problems = c.stop()
    assert problems == [], f"the cluster's teardown left host state behind: {problems}"


@pytest.fixture(scope="session")
def cluster_api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def cluster_pods(cluster: Cluster, cluster_api: client.ApiClient) -> Iterator[ClusterPods]:
    """A fresh namespace on the cluster with real nodes, and helpers for its pods."""
    core = client.CoreV1Api(cluster_api)
    name = make_namespace(core)
    yield ClusterPods(cluster, core, name)
    core.delete_namespace(name)
