"""Shared fixtures: the real local control plane, the cluster with real nodes (both
session-scoped, started on first use) and per-test namespaces.

Tests marked `integration` or `e2e` get a real etcd + kube-apiserver + kube-controller-manager +
kube-scheduler; those that run pods get real nodes (kubelet + containerd each, localcluster.nodes).
There is no fallback: if the binaries are missing the tests error, they are never skipped
silently.

Side by side: tests on real nodes mostly wait, so `make test` runs two pytest runs of them at
once on disjoint nodes of one cluster. The run that starts the cluster (its owner) reads
SIDE_ENV, the arguments of the other run: it then starts the cluster with two pools of three
nodes, keeps pool a for itself, and starts the other run on pool b (ATTACH_ENV, POOL_ENV), whose
output it prints in one piece at its end and whose failure fails it. A test that must have the
cluster alone (it stops the API server) asks for `cluster_alone`: it waits until the other run
has ended.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from localcluster import images
from localcluster.controlplane import ControlPlane, Settings
from localcluster.job import ensure_ssh_key
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


SIDE_ENV = "ES_NODES_SIDE"  # the other run's pytest arguments (whitespace-separated)
ATTACH_ENV = "ES_NODES_ATTACH"  # set for the other run: the owner's Cluster.share record
POOL_ENV = "ES_NODES_POOL"  # set for the other run: its pool
SIDE_TIMEOUT_S = 40 * 60  # the other run, at most (then killed, and failed)


@dataclass
class SideRun:
    """The other pytest run on real nodes, beside this one (see the module's docstring)."""

    args: list[str]
    record: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    took_s: float = 0.0

    def start(self) -> SideRun:
        env = {k: v for k, v in os.environ.items() if k != SIDE_ENV}
        env.update({ATTACH_ENV: str(self.record), POOL_ENV: "b"})
        self._t0 = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", *self.args, "-p", "no:cacheprovider",
                 "--basetemp", str(self.log.parent / "side-basetemp")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        return self

    def wait(self) -> int:
        """Its exit code, once it ended (killed past SIDE_TIMEOUT_S)."""
        if self.returncode is None and self.proc is not None:
            try:
                self.proc.wait(max(1.0, SIDE_TIMEOUT_S - (time.monotonic() - self._t0)))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.returncode = self.proc.returncode
            self.took_s = time.monotonic() - self._t0
        return self.returncode if self.returncode is not None else 0


SIDE = pytest.StashKey[SideRun]()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A control plane with three real nodes (kubelet + containerd each) and kube-proxy; every
    node holds the launcher and worker images (built by `make setup`, cached). Side by side
    (SIDE_ENV), six nodes in two pools: this run's tests get pool a's three."""
    if attach := os.environ.get(ATTACH_ENV):
        yield Cluster.attach(Path(attach), os.environ.get(POOL_ENV, "b"))
        return
    side = os.environ.get(SIDE_ENV, "").split()
    pools = 2 if side else 1
    tarballs = images.build(images.Settings())
    c = Cluster(ClusterSettings(nodes=3 * pools, pools=pools,
                                node_monitor_grace_period_s=CLUSTER_NODE_GRACE_S,
                                images=tuple(sorted(set(tarballs.values())))))
    c.start()
    try:
        if side:
            ensure_ssh_key()  # once, before either run makes a job
            scratch = Path(tempfile.mkdtemp(prefix="es-side-"))
            run = SideRun(side, c.share(scratch / "cluster.json"), scratch / "side.log")
            request.config.stash[SIDE] = run.start()
        yield c.view("a") if side else c
    finally:
        if (run := request.config.stash.get(SIDE, None)) is not None and run.wait() not in (0, 5):
            c.failed = True
        if request.session.testsfailed:
            c.failed = True
        problems = c.stop()
    assert problems == [], f"the cluster's teardown left host state behind: {problems}"


@pytest.fixture
def cluster_alone(request: pytest.FixtureRequest, cluster: Cluster) -> Cluster:
    """The cluster, once no other run uses it (a test that stops the API server)."""
    if (run := request.config.stash.get(SIDE, None)) is not None:
        run.wait()
    return cluster


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The other run's failure is this run's (its output: pytest_terminal_summary)."""
    run = session.config.stash.get(SIDE, None)
    # 5: nothing collected there (a -k that selects this run's tests only)
    if run is not None and run.wait() not in (0, 5) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    run = terminalreporter.config.stash.get(SIDE, None)
    if run is None:
        return
    rc = run.wait()
    terminalreporter.section(f"the run beside this one on pool b: exit {rc} after "
                             f"{run.took_s:.0f}s ({' '.join(run.args)})")
    terminalreporter.write(run.log.read_text(errors="replace"))


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
