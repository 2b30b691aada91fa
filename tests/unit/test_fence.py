"""Fencing (supervisor/fence.py): when to sever, what is severed, and the endpoint.

The decision is pure (table + a fake clock); severing and the endpoint are checked on real
loopback sockets: a thread blocked in recv() on a connection, as Gloo is on a dead peer's,
returns at once when the connection is severed from another thread.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from supervisor.fence import (
    PATH,
    PORT_ENV,
    FenceServer,
    WorkerFence,
    fetch_fenced,
    sever_connections,
    should_sever,
)


@pytest.mark.parametrize(("stalled", "ring", "fenced", "expected"), [
    pytest.param(None, {"a", "b"}, {"b"}, [], id="between steps: never"),
    pytest.param(0.5, {"a", "b"}, {"b"}, [], id="a step shorter than the stall threshold"),
    pytest.param(3.0, {"a", "b"}, set(), [], id="stalled, nothing fenced: a slow step"),
    pytest.param(3.0, {"a", "b"}, {"c"}, [], id="stalled, a host outside the ring fenced"),
    pytest.param(3.0, {"a", "b"}, {"b", "c"}, ["b"], id="stalled on a fenced ring host"),
    pytest.param(1.0, {"a", "b", "c"}, {"c", "b"}, ["b", "c"], id="at the threshold, two"),
])
def test_when_to_sever(stalled: float | None, ring: set[str], fenced: set[str],
                       expected: list[str]) -> None:
    assert should_sever(stalled, 1.0, frozenset(ring), fenced) == expected


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make_fence(fenced: list[str]) -> tuple[WorkerFence, FakeClock, list[object], list[dict]]:
    clock, severed, reports = FakeClock(), [], []

    def sever(keep: object) -> int:
        severed.append(keep)
        return 3

    fence = WorkerFence("http://launcher/fenced", [("10.0.0.1", 5000)], stall_s=1.0,
                        fetch=lambda url: list(fenced), sever=sever, clock=clock,
                        report=reports.append)
    fence.ring(["10.0.0.7", "10.0.0.8"])
    return fence, clock, severed, reports


def test_a_stalled_step_on_a_fenced_host_is_severed_once() -> None:
    fence, clock, severed, reports = make_fence(["10.0.0.8"])
    assert fence.check() is None  # between steps
    with fence.step():
        clock.t += 0.5
        assert fence.check() is None and severed == []  # not stalled yet
        clock.t += 1.0
        assert fence.check() == 3
        assert severed == [(("10.0.0.1", 5000),)], "the rendezvous server is kept"
        clock.t += 5.0
        assert fence.check() is None, "the same stalled step is severed once"
    assert [r["event"] for r in reports] == ["fence.severed"]
    assert reports[0]["hosts"] == ["10.0.0.8"] and reports[0]["connections"] == 3
    with fence.step():  # the next stalled step may be severed again
        clock.t += 2.0
        assert fence.check() == 3


def test_a_stall_no_fenced_ring_host_explains_is_left_alone() -> None:
    fence, clock, severed, _ = make_fence(["10.0.0.9"])  # dead, but not in this ring
    with fence.step():
        clock.t += 30
        assert fence.check() is None
    assert severed == []


def test_an_unreachable_launcher_is_reported_once_and_severs_nothing() -> None:
    clock, reports = FakeClock(), []

    def fetch(url: str) -> list[str]:
        raise OSError("connection refused")

    fence = WorkerFence("http://launcher/fenced", [], fetch=fetch, sever=lambda k: 1 / 0,
                        clock=clock, report=reports.append)
    fence.ring(["a"])
    with fence.step():
        clock.t += 5
        assert fence.check() is None and fence.check() is None
    assert [r["event"] for r in reports] == ["fence.unreachable"]


def test_from_env_needs_the_supervisor_and_horovodrun() -> None:
    assert WorkerFence.from_env({}) is None
    assert WorkerFence.from_env({PORT_ENV: "9401"}) is None  # not launched by horovodrun
    fence = WorkerFence.from_env({PORT_ENV: "9401", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.1.2.3",
                                  "HOROVOD_GLOO_RENDEZVOUS_PORT": "4567"})
    assert fence is not None
    try:
        assert fence.url == f"http://10.1.2.3:9401{PATH}"
        assert set(fence.keep) == {("10.1.2.3", 4567), ("10.1.2.3", 9401)}
    finally:
        fence.close()


@pytest.fixture
def server() -> Iterator[FenceServer]:
    s = FenceServer(0, bind="127.0.0.1")
    yield s
    s.close()


def test_the_endpoint_serves_the_fenced_hosts(server: FenceServer) -> None:
    url = f"http://127.0.0.1:{server.port}{PATH}"
    assert fetch_fenced(url) == []
    server.add("10.0.0.8")
    server.add("10.0.0.7")
    server.add("10.0.0.8")
    assert fetch_fenced(url) == ["10.0.0.7", "10.0.0.8"]
    with pytest.raises(OSError, match="404"):
        fetch_fenced(f"http://127.0.0.1:{server.port}/other")


def connected_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_severing_wakes_a_thread_blocked_on_a_silent_peer_and_keeps_what_it_must() -> None:
    """The silent peer (`accepted`) never sends: like a frozen worker's connection."""
    listener, blocked, silent = connected_pair()
    listener2, kept, kept_peer = connected_pair()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(blocked.recv(1)), daemon=True)
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive(), "recv blocks while the peer is silent"
    keep = [kept.getpeername(), kept_peer.getpeername()]
    try:
        n = sever_connections(keep)
        reader.join(5)
        assert not reader.is_alive() and got == [b""], "recv returned: connection severed"
        assert n >= 2  # both ends of the first pair live in this process
        kept_peer.sendall(b"x")
        assert kept.recv(1) == b"x", "a kept endpoint still works"
    finally:
        for s in (listener, blocked, silent, listener2, kept, kept_peer):
            s.close()
