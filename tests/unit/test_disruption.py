"""disruption.py: which workers are announced to go, over the watch-event sequences captured
from the real control plane (tests/unit/shapes) and variations of them; and classify with the
graceful leave on (an announced pod is no failure while its training container runs)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from supervisor.decide.classify import Cause, ClassifySettings
from supervisor.decide.disruption import (
    Settings,
    Why,
    going_nodes,
    node_notice,
    notice,
    parse_names,
    pod_notice,
)
from supervisor.observe import Kind, slim
from tests.unit import shapes
from tests.unit.test_classify import first_failure, sequence

S = Settings()


def objects(name: str) -> list[dict[str, Any]]:
    return [slim(Kind.POD, ev["object"]) for ev in sequence(name)]


def disruption_target(reason: str) -> dict[str, Any]:
    """The captured eviction's pod, its DisruptionTarget reason replaced (no deletion yet)."""
    pod = copy.deepcopy(objects("eviction_api")[2])
    for c in pod["status"]["conditions"]:
        if c["type"] == "DisruptionTarget":
            c["reason"] = reason
    return pod


def tainted(key: str, effect: str = "NoSchedule") -> dict[str, Any]:
    n = shapes.node("node-a")
    n["spec"]["taints"] = [{"key": key, "effect": effect}]
    return n


def with_node_condition(ctype: str, status: str, reason: str = "") -> dict[str, Any]:
    n = shapes.node("node-a")
    n["status"]["conditions"].append({"type": ctype, "status": status, "reason": reason})
    return slim(Kind.NODE, n)


def cordoned() -> dict[str, Any]:
    n = shapes.node("node-a")
    n["spec"]["unschedulable"] = True
    return n


@pytest.mark.parametrize(("name", "expected"), [
    # Pending, Running, DisruptionTarget, deletion (grace 30), the kubelet's grace-0 delete,
    # DELETED: announced while it runs and nothing forces it out.
    ("eviction_api", [None, None, Why.EVICTED, Why.EVICTED, None, None]),
    # a graceful delete: announced until its container ended
    ("graceful_delete", [None, None, Why.DELETED, None, None, None]),
    ("force_delete", [None, None, None, None]),  # grace 0: the failure path
    ("kubelet_pressure_eviction", [None, None, None]),  # terminated already: a failure
    ("exit137_never", None),
])
def test_a_pod_is_announced_while_it_runs_and_is_not_forced_out(
        name: str, expected: list[Why | None] | None) -> None:
    pods = objects(name)
    found = [n.why if (n := pod_notice(p, "worker")) else None for p in pods]
    assert found == (expected if expected is not None else [None] * len(pods))


@pytest.mark.parametrize(("reason", "why"), [
    ("EvictionByEvictionAPI", Why.EVICTED),
    ("PreemptionByScheduler", Why.PREEMPTED),
    ("TerminationByKubelet", Why.SHUTDOWN),  # graceful node shutdown
    ("DeletionByTaintManager", None),  # its node is NotReady: lost, not leaving
    ("DeletionByPodGC", None),
])
def test_the_disruption_target_reason_says_whether_it_can_leave(reason: str,
                                                                why: Why | None) -> None:
    n = pod_notice(disruption_target(reason), "worker")
    assert (n.why if n else None) == why
    if n is not None:
        assert n.detail == f"DisruptionTarget {reason}" and not n.node_wide


def test_only_the_training_container_counts() -> None:
    pod = objects("eviction_api")[3]
    assert pod_notice(pod, "worker") is not None
    assert pod_notice(pod, "sidecar") is None  # no such container runs: nothing to leave


@pytest.mark.parametrize(("node", "why", "detail"), [
    (shapes.node("node-a"), None, None),
    (cordoned(), Why.CORDONED, "cordoned (spec.unschedulable)"),
    (tainted("ToBeDeletedByClusterAutoscaler"), Why.TAINTED,
     "taint ToBeDeletedByClusterAutoscaler:NoSchedule"),
    (tainted("cloud.google.com/impending-node-termination", "NoExecute"), Why.TAINTED,
     "taint cloud.google.com/impending-node-termination:NoExecute"),
    (tainted("example.com/maintenance"), None, None),  # not configured
    (with_node_condition("KernelDeadlock", "True", "AUFSUmountHung"), Why.BAD_NODE,
     "condition KernelDeadlock (AUFSUmountHung)"),
    (with_node_condition("KernelDeadlock", "False"), None, None),
    (with_node_condition("MemoryPressure", "True"), None, None),  # the kubelet evicts itself
    (shapes.node("node-a", "node_unreachable"), None, None),  # down: the failure path
    (None, None, None),
])
def test_a_node_is_announced_by_a_cordon_a_drain_taint_or_a_bad_condition(
        node: dict[str, Any] | None, why: Why | None, detail: str | None) -> None:
    n = node_notice(node, S)
    assert (n.why if n else None, n.detail if n else None) == (why, detail)
    if n is not None:
        assert n.node_wide


def test_the_taints_and_conditions_are_configured() -> None:
    mine = Settings(drain_taints=frozenset({"example.com/maintenance"}),
                    bad_conditions=frozenset({"GPUProblem"}))
    assert node_notice(tainted("example.com/maintenance"), mine).why is Why.TAINTED  # type: ignore[union-attr]
    assert node_notice(tainted("ToBeDeletedByClusterAutoscaler"), mine) is None
    assert node_notice(with_node_condition("GPUProblem", "True"), mine).why is Why.BAD_NODE  # type: ignore[union-attr]
    off = Settings(frozenset(), frozenset())
    assert node_notice(with_node_condition("KernelDeadlock", "True"), off) is None
    assert node_notice(cordoned(), off).why is Why.CORDONED  # type: ignore[union-attr]


def test_a_worker_is_announced_by_itself_first_then_by_its_node() -> None:
    running, pending = objects("eviction_api")[1], objects("eviction_api")[0]
    evicted = objects("eviction_api")[3]
    assert notice(running, shapes.node("node-a"), "worker", S) is None
    assert notice(running, cordoned(), "worker", S).why is Why.CORDONED  # type: ignore[union-attr]
    assert notice(evicted, cordoned(), "worker", S).why is Why.EVICTED  # type: ignore[union-attr]
    assert notice(pending, cordoned(), "worker", S) is None  # nothing runs: nothing to leave
    # evicted while its node is unreachable: lost, the failure path
    assert notice(evicted, shapes.node("node-a", "node_unreachable"), "worker", S) is None


def test_going_nodes_are_the_announced_ones() -> None:
    nodes = [shapes.node("up"), {**cordoned(), "metadata": {"name": "c"}},
             {**tainted("karpenter.sh/disrupted"), "metadata": {"name": "t"}},
             shapes.node("gone", "node_unreachable")]
    assert going_nodes(nodes, S) == {"c", "t"}


def test_slim_keeps_the_node_conditions_that_hold() -> None:
    n = shapes.node("node-a")
    n["status"]["conditions"] += [
        {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung", "message": "m",
         "lastHeartbeatTime": "2026-11-27T05:00:00Z"},
        {"type": "ReadonlyFilesystem", "status": "False", "reason": "FilesystemIsNotReadOnly"}]
    kept = slim(Kind.NODE, n)["status"]["conditions"]
    assert [c["type"] for c in kept] == ["Ready", "KernelDeadlock"]
    assert kept[1] == {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}
    pod = shapes.pod()
    pod["status"]["conditions"].append({"type": "Custom", "status": "True"})
    assert "Custom" not in [c["type"] for c in slim(Kind.POD, pod)["status"]["conditions"]]


def first_cause(name: str, settings: ClassifySettings) -> tuple[Cause | None, int]:
    """The first failure of a captured sequence (test_classify's feed), by cause."""
    f, i = first_failure(sequence(name), settings)
    return (f.cause if f is not None else None), i


@pytest.mark.parametrize(("name", "before", "after"), [
    # the DisruptionTarget: a failure at once before; with the leave, only the kubelet's
    # grace-0 delete at the end would be one (the supervisor decided the leave long before)
    ("eviction_api", (Cause.EVICTED, 2), (Cause.EVICTED, 4)),
    ("graceful_delete", (Cause.POD_DELETED, 2), (Cause.EXIT_CODE, 3)),
    ("force_delete", (Cause.POD_FORCE_DELETED, 2), (Cause.POD_FORCE_DELETED, 2)),
    ("kubelet_pressure_eviction", (Cause.EVICTED, 2), (Cause.EVICTED, 2)),
])
def test_with_the_graceful_leave_an_announced_pod_is_no_failure_while_it_runs(
        name: str, before: tuple[Cause, int], after: tuple[Cause, int]) -> None:
    assert first_cause(name, ClassifySettings()) == before
    assert first_cause(name, ClassifySettings(graceful_leave=True)) == after


@pytest.mark.parametrize(("raw", "names"), [
    ("", frozenset()), ("none", frozenset()), (" a , b/c ", frozenset({"a", "b/c"})),
])
def test_names_parse(raw: str, names: frozenset[str]) -> None:
    assert parse_names(raw, "taint keys", "x") == names


@pytest.mark.parametrize("raw", ["a,,b", "a b", ","])
def test_bad_names_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"comma-separated taint keys without spaces \(e.g. x\)"):
        parse_names(raw, "taint keys", "x")
