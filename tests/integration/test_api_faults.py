"""API faults a restart of kube-apiserver does not make, through a loopback TCP proxy in front
of the session's real API server (tests/integration/proxy.py): an API server that is not there
when the supervisor starts, connections that stall mid-request, a state ConfigMap deleted under
a running job, a state save the API refuses for good."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import kube
from supervisor.decide.fleet import state_name
from supervisor.model import ExitCode
from tests.helpers import wait_for
from tests.integration.harness import Job
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)
from tests.integration.proxy import TcpProxy


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[TcpProxy]:
    p = TcpProxy(control_plane.ports["apiserver"])
    yield p
    p.close()


def test_an_api_server_down_at_start_is_waited_for_not_fatal(
        job: Job, supervisor, control_plane: ControlPlane, proxy: TcpProxy,
        tmp_path: Path) -> None:
    job.node("n1")
    kubeconfig = proxy.kubeconfig(control_plane.kubeconfig, tmp_path / "proxied.kubeconfig")
    sup = supervisor(KUBECONFIG=str(kubeconfig))  # nothing listens there yet: refused
    retry = sup.wait_log("start.api_retrying", timeout=10)
    assert "Connection refused" in retry["reason"] or "ConnectionRefused" in retry["reason"]
    time.sleep(2)
    assert sup.proc.poll() is None, f"exited {sup.proc.returncode} while the API was down"
    proxy.forward()
    running(job, 2)
    sup.wait_log("horovodrun.started", timeout=20)


def test_an_api_server_that_never_comes_is_a_start_timeout(
        supervisor, control_plane: ControlPlane, proxy: TcpProxy, tmp_path: Path) -> None:
    kubeconfig = proxy.kubeconfig(control_plane.kubeconfig, tmp_path / "proxied.kubeconfig")
    sup = supervisor(KUBECONFIG=str(kubeconfig), SUPERVISOR_START_TIMEOUT_SECONDS="3")
    started = time.monotonic()
    assert sup.wait_exit(30) == ExitCode.START_TIMEOUT
    assert time.monotonic() - started >= 3
    timeout = sup.wait_log("start.timeout")
    assert "Kubernetes API" in timeout["reason"]


def test_a_connection_stalled_at_start_is_given_up_and_retried(
        job: Job, supervisor, control_plane: ControlPlane, proxy: TcpProxy,
        tmp_path: Path) -> None:
    job.node("n1")
    kubeconfig = proxy.kubeconfig(control_plane.kubeconfig, tmp_path / "proxied.kubeconfig")
    proxy.forward()
    proxy.stall()  # connections are accepted and then never answered, until forward()
    sup = supervisor(KUBECONFIG=str(kubeconfig))
    wait_for(lambda: proxy.dead, 10, what="the supervisor's first connection stalled")
    time.sleep(1)
    proxy.forward()  # new connections work; the stalled ones stay stalled for good
    retry = sup.wait_log("start.api_retrying", timeout=20)
    assert "timed out" in retry["reason"].lower()
    running(job, 2)
    sup.wait_log("horovodrun.started", timeout=20)


# ---- every call has a timeout: one kept-alive connection stalls mid-request -----------------

TIMEOUT_S = 2.0


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


CALLS: dict[str, Callable[[client.ApiClient, str], Any]] = {
    "state load": lambda api, ns: kube.StateStore(api, ns, "s", None,
                                                  timeout_s=TIMEOUT_S).load(),
    "state save": lambda api, ns: kube.StateStore(api, ns, "s", None,
                                                  timeout_s=TIMEOUT_S).save({"n": 1}, None),
    "pod create": lambda api, ns: kube.Pods(api, ns, TIMEOUT_S).create(pod("p1")),
    "pod delete": lambda api, ns: kube.Pods(api, ns, TIMEOUT_S).delete("p1", None, 0),
    "pod list": lambda api, ns: kube.list_pods(api, ns, "a=b", timeout_s=TIMEOUT_S),
    "pod get": lambda api, ns: kube.pod_reference(api, ns, "p1", timeout_s=TIMEOUT_S),
    "lease get": lambda api, ns: kube.Leases(api, ns, TIMEOUT_S).get("l1"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_call_on_a_connection_that_stalls_mid_request_times_out(
        control_plane: ControlPlane, proxy: TcpProxy, namespace: str, tmp_path: Path,
        call: str) -> None:
    api = kube.make_api_client(str(proxy.kubeconfig(control_plane.kubeconfig,
                                                    tmp_path / "proxied.kubeconfig")))
    proxy.forward()
    try:
        kube.list_pods(api, namespace, "a=b")  # a kept-alive connection, TLS done
        proxy.stall()
        outcome: list[Any] = []

        def attempt() -> None:
            try:
                outcome.append(CALLS[call](api, namespace))
            except kube.KubeError as e:
                outcome.append(e)

        t = threading.Thread(target=attempt, daemon=True)
        started = time.monotonic()
        t.start()
        t.join(TIMEOUT_S + 10)
        assert not t.is_alive(), f"{call}: still waiting after {TIMEOUT_S + 10:g}s"
        [err] = outcome
        assert isinstance(err, kube.KubeError) and err.retryable, err
        assert "timed out" in str(err).lower()
        assert time.monotonic() - started < TIMEOUT_S + 5
    finally:
        api.close()


# ---- the state ConfigMap --------------------------------------------------------------------

def test_a_deleted_state_configmap_is_recreated_before_the_replacement(
        job: Job, supervisor) -> None:
    job.node("n1")
    sup = supervisor()
    running(job, 2)
    sup.wait_log("horovodrun.started")
    job.core.delete_namespaced_config_map(state_name("job1"), job.namespace)
    job.terminate("job1-w0-1", 137)
    assert running(job, 2) == ["job1-w0-2", "job1-w1-1"]
    sup.wait_log("state.recreated")

    def stored() -> dict[str, Any] | None:
        try:
            cm = job.core.read_namespaced_config_map(state_name("job1"), job.namespace)
        except client.ApiException:
            return None
        return json.loads(cm.data["state.json"])

    state = wait_for(stored, 10, what="the state ConfigMap again")
    assert state["slots"]["0"]["incarnation"] == 2 and state["ledger"]["total"] == 1
    assert sup.proc.poll() is None
