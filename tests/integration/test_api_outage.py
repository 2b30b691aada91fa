"""Supervisor and reflector through real kube-apiserver crashes and restarts, on a private
control plane (see conftest.restartable_control_plane): 410 Gone after etcd compaction, bounded
reconnects, and the discovery file withdrawn after the staleness bound, then restored."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.controlplane import ControlPlane
from supervisor import kube
from supervisor.actuator import Actuator
from supervisor.decide.script import CreatePod, SaveState
from supervisor.model import ActionDone, SourceState, WatchEvent
from supervisor.observe import EventType
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import Job, Reflectors, SupervisorProcess
from tests.integration.test_reflector import pod_body


@pytest.fixture(scope="module")
def api(restartable_control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    a = kube.make_api_client(str(restartable_control_plane.kubeconfig))
    yield a
    a.close()


@pytest.fixture
def ns(api: client.ApiClient) -> str:
    return make_namespace(client.CoreV1Api(api))


@pytest.fixture
def reflect(api: client.ApiClient, ns: str) -> Iterator[Reflectors]:
    factory = Reflectors(api, ns)
    yield factory
    factory.close()


def test_410_gone_relists_and_diffs(
    restartable_control_plane: ControlPlane, reflect, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    old_rv = core.list_namespaced_pod(ns).metadata.resource_version
    for i in range(3):
        core.create_namespaced_pod(ns, pod_body(f"p{i}"))
    # The restarted API server's watch cache starts after old_rv, and etcd compaction removes
    # the history below it: resuming from old_rv must get 410 Gone.
    restartable_control_plane.restart_apiserver(crash=True)
    restartable_control_plane.compact_etcd()
    # As if we had been away: an old resourceVersion and a pod that vanished meanwhile.
    r, sink = reflect(rv=old_rv)
    r.known = {"ghost": "5", "p0": "stale"}
    r.start()
    sink.wait(lambda i: isinstance(i, SourceState) and i.synced, what="relist after 410")
    broken = [i for i in sink.items if isinstance(i, SourceState) and i.broken]
    assert broken and "410 Gone" in broken[0].reason
    assert sink.names(EventType.DELETED) == {"ghost"}
    assert sink.names(EventType.ADDED) == {"p1", "p2"}
    assert sink.names(EventType.MODIFIED) == {"p0"}
    assert r.relists == 1


def test_survives_an_api_server_restart_with_bounded_reconnects(
    restartable_control_plane: ControlPlane, reflect, api: client.ApiClient, ns: str
) -> None:
    attempts: list[float] = []

    def counting(list_fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(**kw: Any) -> Any:
            if kw.get("watch"):
                attempts.append(time.monotonic())
            return list_fn(**kw)
        return wrapped

    r, sink = reflect(kube.WatchSettings(backoff_initial_s=0.2, backoff_max_s=2), wrap=counting)
    r.start()
    sink.wait(lambda i: isinstance(i, SourceState) and i.synced, what="synced")
    down_at = time.monotonic()
    restartable_control_plane.restart_apiserver(down_s=4)
    up_at = time.monotonic()
    broken = sink.wait(lambda i: isinstance(i, SourceState) and i.broken, what="broken")
    sink.wait(lambda i: isinstance(i, SourceState) and i.broken is False and i.at > broken.at,
              timeout=15, what="reconnected")
    client.CoreV1Api(api).create_namespaced_pod(ns, pod_body("after-restart"))
    sink.wait(lambda i: isinstance(i, WatchEvent)
              and i.obj["metadata"]["name"] == "after-restart", what="event after restart")
    during = [a for a in attempts if down_at < a < up_at]
    # Down for 4 s+ with backoff 0.2 s doubling to 2 s: a handful of tries, never a busy loop.
    assert 1 <= len(during) <= 10, f"{len(during)} watch attempts while the API was down"


def test_supervisor_withdraws_the_file_when_stale_then_recovers(
    restartable_control_plane: ControlPlane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    job = Job(api, ns)
    # The default leader lease (60 s: renewals may fail for 40 s) rides out the restart; the
    # harness's short one would end the run (exit 7), as it should for a longer outage.
    sup = SupervisorProcess(restartable_control_plane, ns, tmp_path, SUPERVISOR_NP="2",
                            SUPERVISOR_STALENESS_SECONDS="2",
                            SUPERVISOR_LEADER_LEASE_SECONDS="60")
    try:
        job.worker("w0", job.node("n1"))
        job.worker("w1", job.node("n2"))
        # A new node is tainted not-ready until the node-lifecycle controller clears it, and
        # after an API crash that controller lags: register the third node beforehand.
        n3 = job.node("n3")
        sup.start()
        wait_for(lambda: sup.records("start"), 30, what="horovodrun start")
        before = sup.content()
        restartable_control_plane.restart_apiserver(down_s=3, crash=True)
        sup.wait_log("discovery.withdrawn")
        failed = wait_for(lambda: [r for r in sup.records("discover") if r["rc"] != 0], 5,
                          what="a failing discovery call while stale")
        assert all(r["out"] == "" for r in failed)
        sup.wait_content(sorted(before.splitlines()), timeout=20)
        sup.wait_log("watch.connected")
        job.worker("w2", n3)
        sup.wait_content([job.line("w0"), job.line("w1"), job.line("w2")])
        assert all(r["out"].strip() for r in sup.records("discover") if r["rc"] == 0)
    finally:
        sup.close()
        job.close()


def test_actuator_retries_through_an_api_outage(restartable_control_plane: ControlPlane,
                                                api: client.ApiClient) -> None:
    # After the earlier tests' API server crashes the controller-manager is slow to create
    # a namespace's default ServiceAccount; pods only need it to exist, so create it here.
    core = client.CoreV1Api(api)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    with contextlib.suppress(ApiException):  # 409: the controller was quicker
        core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    done: queue.Queue[ActionDone] = queue.Queue()
    store = kube.StateStore(api, ns, "job1-supervisor-state", None)
    act = Actuator(kube.Pods(api, ns, request_timeout_s=5), store, resource_version=None,
                   writer="a", sink=done.put, backoff_max_s=1.0).start()

    def submit() -> None:  # while the API server is going down
        act.submit(SaveState({"n": 1}))
        act.submit(CreatePod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))

    # The restart runs on this (main) thread: the control plane's children get a parent-death
    # signal bound to the thread that started them.
    timer = threading.Timer(0.5, submit)
    try:
        timer.start()
        restartable_control_plane.restart_apiserver(down_s=3.0)
        first = done.get(timeout=30)
        assert (first.what, first.retrying) == ("save", True), first
        results = [done.get(timeout=60) for _ in range(2)]
    finally:
        timer.cancel()
        act.close()
    # Both landed, in order, once the API server was back: the save before the create.
    assert [(r.what, r.error) for r in results] == [("save", None), ("create", None)]

    def stored() -> dict | None:
        try:  # the test's own client may first hit a socket from before the restart
            return store.load()[0]
        except kube.KubeError:
            return None

    assert wait_for(stored, 30, what="the state readable again") == {"n": 1, "writer": "a"}
    assert client.CoreV1Api(api).read_namespaced_pod("p1", ns).metadata.name == "p1"

def test_a_worker_deleted_while_the_watch_was_down_is_judged_from_its_last_object(
    tmp_path: Path
) -> None:
    from localcluster.controlplane import Settings
    from tests.integration.harness import AutoKubelet
    from tests.integration.managed import running
    from tests.integration.proxy import TcpProxy

    # A control plane of its own: after the crash its controllers lag, which would slow the
    # ServiceAccounts of the other tests' namespaces.
    cp = ControlPlane(Settings(node_monitor_grace_period_s=40))
    cp.start()
    api = kube.make_api_client(str(cp.kubeconfig))
    ns = make_namespace(client.CoreV1Api(api))
    job = Job(api, ns)
    kubelet = AutoKubelet(job)
    proxy = TcpProxy(cp.ports["apiserver"]).forward()
    kubeconfig = proxy.kubeconfig(cp.kubeconfig, tmp_path / "proxied.kubeconfig")
    sup = SupervisorProcess(cp, ns, tmp_path, KUBECONFIG=str(kubeconfig),
                            SUPERVISOR_WORKER_TEMPLATE=str(job.template(tmp_path / "w.json")),
                            SUPERVISOR_LEADER_LEASE_SECONDS="60",
                            SUPERVISOR_BACKOFF_INITIAL_SECONDS="0.5")
    try:
        job.node("n1")
        sup.start()
        assert running(job, 2) == ["job1-w0-1", "job1-w1-1"]
        sup.wait_log("horovodrun.started", timeout=20)
        proxy.refuse()  # the supervisor's watches are cut
        job.core.delete_namespaced_pod("job1-w1-1", ns, grace_period_seconds=0)
        # Its history is gone too: the watch cannot resume, it must relist (410 Gone).
        cp.restart_apiserver(crash=True)
        cp.compact_etcd()
        proxy.forward()
        decision = sup.wait_log("worker.failed", timeout=60, pod="job1-w1-1")
        assert (decision["cause"], decision["slot"], decision["action"]) == (
            "PodDeleted", 1, "Restart")
        assert decision["detail"] == "deleted while the watch was down (last seen Running)"
        assert any("410" in (e.get("reason") or "") for e in sup.logs()
                   if e.get("event") == "watch.broken"), "the watch could not resume"
        assert running(job, 2, timeout=60) == ["job1-w0-1", "job1-w1-2"]
    finally:
        sup.close()
        proxy.close()
        kubelet.close()
        job.close()
        api.close()
        cp.stop()
