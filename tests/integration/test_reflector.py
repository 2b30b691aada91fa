"""The reflector against the real API server: paged list then watch, and a silently dead
connection noticed by the read timeout. API server restarts and 410: test_api_outage.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import kube
from supervisor.model import SourceState, WatchEvent
from supervisor.observe import EventType
from tests.integration.harness import Reflectors


def pod_body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"r": "t"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


@pytest.fixture
def reflect(control_plane: ControlPlane, namespace: str) -> Iterator[Reflectors]:
    api = kube.make_api_client(str(control_plane.kubeconfig))
    factory = Reflectors(api, namespace)
    yield factory
    factory.close()
    api.close()


def test_list_pages_then_watch_delivers_changes(
    reflect, core: client.CoreV1Api, namespace: str
) -> None:
    for i in range(5):
        core.create_namespaced_pod(namespace, pod_body(f"p{i}"))
    r, sink = reflect(kube.WatchSettings(page_size=2))
    r.start()
    synced = sink.wait(lambda i: isinstance(i, SourceState) and i.synced, what="synced")
    listed = sink.items[:sink.items.index(synced)]
    assert {i.obj["metadata"]["name"] for i in listed} == {f"p{i}" for i in range(5)}
    assert all(isinstance(i, WatchEvent) and i.relist for i in listed)
    core.create_namespaced_pod(namespace, pod_body("p5"))
    sink.wait(lambda i: isinstance(i, WatchEvent) and not i.relist
              and i.obj["metadata"]["name"] == "p5", what="p5 via watch")
    core.delete_namespaced_pod("p1", namespace, grace_period_seconds=0)
    sink.wait(lambda i: isinstance(i, WatchEvent) and i.type is EventType.DELETED,
              what="delete via watch")
    assert r.relists == 1


class FreezableProxy:
    """TCP proxy to the API server; `freeze()` stops forwarding on open connections without
    closing them (a dead NAT entry or partition), new connections still work."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.frozen: set[int] = set()  # generations that are frozen
        self.generation = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen.add(self.generation)
        self.generation += 1

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            self.conns += [c, u]
            gen = self.generation
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b, gen), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gen: int) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while gen in self.frozen:
                    time.sleep(0.05)  # hold the bytes forever, keep the socket open
                dst.sendall(data)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()


def test_a_silently_dead_connection_is_noticed_by_the_read_timeout(
    control_plane: ControlPlane, reflect, core: client.CoreV1Api, namespace: str
) -> None:
    proxy = FreezableProxy(control_plane.ports["apiserver"])
    api = kube.make_api_client(str(control_plane.kubeconfig))
    api.configuration.host = f"https://127.0.0.1:{proxy.port}"
    try:
        r, sink = reflect(kube.WatchSettings(read_timeout_s=2), api=api)
        r.start()
        sink.wait(lambda i: isinstance(i, SourceState) and i.synced, what="synced")
        proxy.freeze()
        frozen_at = time.monotonic()
        core.create_namespaced_pod(namespace, pod_body("during-freeze"))
        broken = sink.wait(lambda i: isinstance(i, SourceState) and i.broken, timeout=10,
                           what="read timeout")
        assert 1.5 <= broken.at - frozen_at <= 6
        # Reconnects on a fresh connection and catches up from its resourceVersion.
        sink.wait(lambda i: isinstance(i, WatchEvent)
                  and i.obj["metadata"]["name"] == "during-freeze", what="caught up")
    finally:
        r.stop()
        api.close()
        proxy.close()
