"""Node blips, the disruption brake and node Leases: pure decisions from real object shapes."""

from __future__ import annotations

import copy
import itertools
import sys
import threading
import time
from typing import Any

import pytest

from supervisor.decide.classify import (
    Cause,
    ClassifySettings,
    NodeState,
    classify,
    disrupted,
    held_nodes,
    remember,
)
from supervisor.model import SourceState, WatchEvent
from supervisor.nodeleases import NodeLeases
from supervisor.observe import EventType, Kind, renew_interval
from tests.unit.shapes import load, node

RUNNING = load("pod_running_ready")  # Running, Ready, on node-a
NOT_READY = node("node-a", "node_unreachable")

NODES = {f"n{i}" for i in range(1, 11)}


@pytest.mark.parametrize(("job_nodes", "down", "threshold", "held"), [
    pytest.param({"n1", "n2", "n3"}, {"n1"}, 0.55, set(), id="one of three: node loss"),
    pytest.param({"n1", "n2", "n3"}, {"n1", "n2"}, 0.55, set(),
                 id="two of three: not more than two down, node loss"),
    pytest.param({"n1", "n2", "n3"}, {"n1", "n2", "n3"}, 0.55, {"n1", "n2", "n3"},
                 id="all of three: full disruption, held"),
    pytest.param({"n1", "n2"}, {"n1", "n2"}, 0.55, {"n1", "n2"}, id="both of two: held"),
    pytest.param({"n1", "n2"}, {"n1"}, 0.55, set(), id="one of two: node loss"),
    pytest.param({"n1"}, {"n1"}, 0.55, set(),
                 id="a job on one node: nothing to compare with, node loss"),
    pytest.param(NODES, {"n1", "n2", "n3", "n4", "n5"}, 0.55, set(),
                 id="half of ten: below the threshold"),
    pytest.param(NODES, {"n1", "n2", "n3", "n4", "n5", "n6"}, 0.55,
                 {"n1", "n2", "n3", "n4", "n5", "n6"}, id="six of ten: partial disruption"),
    pytest.param(NODES, {"n1", "n2", "n3"}, 0.3, {"n1", "n2", "n3"},
                 id="a lower threshold holds three of ten"),
    pytest.param(NODES, set(NODES), None, set(), id="off: never held"),
    pytest.param({"n1", "n2", "n3"}, {"n1", "n2", "other"}, 0.55, set(),
                 id="nodes without the job's workers do not count"),
])
def test_the_disruption_brake_follows_the_node_controllers_zone_states(
        job_nodes: set[str], down: set[str], threshold: float | None, held: set[str]) -> None:
    assert disrupted(frozenset(job_nodes), frozenset(down), threshold) == held


@pytest.mark.parametrize(("job_nodes", "cluster", "down", "held"), [
    pytest.param({"n1"}, {"n1", "n2", "n3"}, {"n1", "n2", "n3"}, {"n1"},
                 id="the whole cluster down (an API outage): a job on one node is held"),
    pytest.param({"n1"}, {"n1", "n2", "n3"}, {"n1"}, set(),
                 id="its node alone down: node loss"),
    pytest.param({"n1"}, {"n1", "n2", "n3"}, {"n1", "n2"}, set(),
                 id="two of three: not more than two down, node loss"),
    pytest.param({"n1", "n2"}, NODES, {"n1", "n3", "n4", "n5", "n6", "n7"}, {"n1"},
                 id="most of the cluster down: the job's down node held, its up one not"),
    pytest.param({"n1", "n2"}, NODES, {"n1", "n2"}, {"n1", "n2"},
                 id="both of the job's two nodes: held by the job's own count"),
])
def test_a_cluster_wide_disruption_holds_the_jobs_down_nodes(
        job_nodes: set[str], cluster: set[str], down: set[str], held: set[str]) -> None:
    assert held_nodes(frozenset(job_nodes), frozenset(cluster), frozenset(down), 0.55) == held


@pytest.mark.parametrize(("down_for", "lost"), [
    pytest.param(1.0, False, id="a one-second NotReady blip"),
    pytest.param(9.9, False, id="just under the default grace"),
    pytest.param(10.0, True, id="down for the default grace: lost"),
])
def test_the_default_grace_lets_a_blip_pass(down_for: float, lost: bool) -> None:
    # The Config default (SUPERVISOR_NODE_GRACE_SECONDS=10) in the classifier's settings.
    from supervisor.config import VARIABLES
    grace = float(next(v.default for v in VARIABLES if v.name == "NODE_GRACE_SECONDS") or 0)
    now = 500.0
    f = classify(RUNNING, EventType.MODIFIED, remember(None, RUNNING),
                 NodeState(NOT_READY, now - down_for),
                 settings=ClassifySettings(node_grace_s=grace), now=now)
    assert (f is not None and f.cause is Cause.NODE_NOT_READY) is lost


def lease(name: str, renew: str, duration: int = 40) -> dict[str, Any]:
    """A kubelet's node Lease as the watch delivers it (after observe.slim)."""
    return {"kind": "Lease", "metadata": {"name": name, "resourceVersion": renew[-8:]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": duration,
                     "renewTime": renew}}


def renewed(name: str, at: float, renew: str, duration: int = 40) -> WatchEvent:
    return WatchEvent(Kind.LEASE, EventType.MODIFIED, lease(name, renew, duration), at)


def state(at: float, **kw: Any) -> SourceState:
    return SourceState(Kind.LEASE, at, **kw)


def test_lease_ages_count_from_the_last_renewal_seen() -> None:
    leases = NodeLeases()
    leases.submit(renewed("n1", 0.0, "2026-11-23T10:00:00.000000Z"))
    assert leases.age("n1", 5.0) is None  # not synced yet: no evidence
    leases.submit(state(0.1, synced=True, relisted=True))
    leases.submit(renewed("n1", 10.0, "2026-11-23T10:00:10.000000Z"))
    leases.submit(renewed("n1", 12.0, "2026-11-23T10:00:10.000000Z"))  # same renewTime
    assert leases.age("n1", 31.0) == pytest.approx(21.0)
    assert leases.older_than(20.0, 31.0) == {"n1"}
    assert leases.older_than(25.0, 31.0) == set()


@pytest.mark.parametrize("comeback", [
    pytest.param({"synced": True, "broken": False, "relisted": True}, id="after a relist"),
    pytest.param({"broken": False}, id="after a watch reconnected without relist"),
])
def test_the_signal_comes_back_after_a_gap_with_ages_restarted(
        comeback: dict[str, Any]) -> None:
    leases = NodeLeases()
    leases.submit(renewed("n1", 0.0, "2026-11-23T10:00:00.000000Z"))
    leases.submit(state(0.0, synced=True, relisted=True))
    leases.submit(state(5.0, broken=True, reason="connection refused"))
    assert leases.age("n1", 30.0) is None and leases.older_than(15.0, 30.0) == set()
    leases.submit(state(60.0, **comeback))
    # What was renewed during the gap is unknown: the gap is not silence.
    assert leases.age("n1", 61.0) == pytest.approx(1.0)
    assert leases.older_than(15.0, 70.0) == set()
    assert leases.older_than(15.0, 76.0) == {"n1"}  # still silent a grace after the gap


def test_a_connect_without_a_gap_does_not_restart_ages() -> None:
    leases = NodeLeases()
    leases.submit(renewed("n1", 0.0, "2026-11-23T10:00:00.000000Z"))
    leases.submit(state(0.0, synced=True, relisted=True))
    leases.submit(state(1.0, broken=False))  # the watch after the list: no gap
    assert leases.age("n1", 20.0) == pytest.approx(20.0)


@pytest.mark.parametrize(("duration", "grace", "used"), [
    pytest.param(40, 5.0, False, id="default kubelet (10 s renewals), 5 s: never used"),
    pytest.param(40, 10.0, False, id="equal to the renew interval: never used"),
    pytest.param(40, 15.0, True, id="above the interval: used"),
    pytest.param(4, 2.0, True, id="a kubelet renewing every second: 2 s is fine"),
])
def test_a_lease_grace_at_or_below_the_renew_interval_is_not_used(
        duration: int, grace: float, used: bool) -> None:
    leases = NodeLeases()
    leases.submit(renewed("n1", 0.0, "2026-11-23T10:00:00.000000Z", duration))
    leases.submit(state(0.0, synced=True, relisted=True))
    assert (leases.older_than(grace, 100.0) == {"n1"}) is used
    assert ("n1" in leases.too_short(grace)) is not used


def test_the_loop_never_reads_half_of_a_write_of_the_lease_reflector() -> None:
    """Two thousand nodes whose kubelets renew every 10 s: a 5 s grace is never used for them,
    so none is ever older than it, while the reflector's thread deletes and adds them back.
    Without the lock, a node deleted between older_than's listing of the renewals and its
    reading of the renew interval was taken for silent (about one pass in a hundred, with
    thread switches forced every microsecond)."""
    nodes = [f"n{i}" for i in range(2000)]
    leases = NodeLeases()
    for name in nodes:
        leases.submit(renewed(name, 0.0, "2026-11-23T10:00:00.000000Z"))
    leases.submit(state(0.0, synced=True, relisted=True))
    stop = threading.Event()

    def reflector() -> None:
        for k in itertools.count():
            if stop.is_set():
                return
            name = nodes[k % len(nodes)]
            gone = lease(name, "2026-11-23T10:00:00.000000Z")
            leases.submit(WatchEvent(Kind.LEASE, EventType.DELETED, gone, 1.0))
            leases.submit(renewed(name, 1.0, f"2026-11-23T10:00:{k % 60:02d}.000000Z"))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer = threading.Thread(target=reflector, name="lease-reflector")
    writer.start()
    seen: list[set[str]] = []
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            seen.append(leases.older_than(5.0, 1000.0))
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(switch)
    assert len(seen) > 50, "too few passes to race"
    assert [s for s in seen if s] == []


def test_renew_interval_is_a_quarter_of_the_lease_duration() -> None:
    kubelet = copy.deepcopy(lease("n1", "2026-11-23T10:00:00.000000Z"))
    assert renew_interval(kubelet["spec"]) == 10.0
    assert renew_interval({}) == 10.0  # the kubelet's default when the field is missing
