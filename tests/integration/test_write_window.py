"""A write started just before the leader's renew deadline cannot land after it (issue 39 item
3): its client timeout ends at the deadline (kube.write_timeout), through a real connection to
the real kube-apiserver that stalls (a TCP proxy, as a partition between the launcher and the
control plane is), and none is started with less than MIN_WINDOW_S left."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import kube
from tests.conftest import make_namespace
from tests.integration.proxy import TcpProxy
from tests.integration.test_reflector import pod_body


@pytest.fixture
def proxied(control_plane: ControlPlane, tmp_path: Path
            ) -> Iterator[tuple[TcpProxy, client.ApiClient, str]]:
    proxy = TcpProxy(control_plane.ports["apiserver"]).forward()
    api = kube.make_api_client(str(proxy.kubeconfig(control_plane.kubeconfig,
                                                    tmp_path / "proxied.kubeconfig")))
    ns = make_namespace(client.CoreV1Api(api))
    yield proxy, api, ns
    api.close()
    proxy.close()


def test_a_write_gives_up_at_the_renew_deadline_not_after_its_own_timeout(
        proxied: tuple[TcpProxy, client.ApiClient, str]) -> None:
    proxy, api, ns = proxied
    deadline = time.monotonic() + 2.0
    pods = kube.Pods(api, ns, 30.0, window=lambda: deadline - time.monotonic())
    pods.create(pod_body("before"))  # while the connection works, the write goes through
    proxy.stall()
    t0 = time.monotonic()
    with pytest.raises(kube.KubeError):
        pods.create(pod_body("stalled"))
    took = time.monotonic() - t0
    assert took <= deadline - t0 + 1.0, f"gave up {took:.1f}s after it started"
    assert time.monotonic() - deadline < 1.0, "it ended at the renew deadline, not after"


def test_no_write_starts_with_too_little_left(
        proxied: tuple[TcpProxy, client.ApiClient, str]) -> None:
    proxy, api, ns = proxied
    accepted = proxy.accepted
    store = kube.StateStore(api, ns, "state", None, window=lambda: kube.MIN_WINDOW_S / 2)
    pods = kube.Pods(api, ns, window=lambda: 0.0)
    budgets = kube.Budgets(api, ns, window=lambda: 0.0)
    for write in (lambda: store.save({"a": 1}, None), lambda: pods.create(pod_body("late")),
                  lambda: pods.delete("late", None, 0),
                  lambda: budgets.keep({"metadata": {"name": "b"}, "spec": {}})):
        with pytest.raises(kube.NotLeading, match="left before the leader's renew deadline"):
            write()
    assert proxy.accepted == accepted, "a connection was opened for a write not sent"
    assert client.CoreV1Api(api).list_namespaced_pod(ns).items == []
