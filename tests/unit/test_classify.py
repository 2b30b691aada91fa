"""Failure classification over watch-event sequences captured from the real control plane
(tests/unit/shapes/capture.py), plus variations of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.decide.classify import (
    Cause,
    ClassifySettings,
    Failure,
    NodeState,
    PodMemory,
    classify,
    node_down_since,
    remember,
    uncounted_exits,
)
from supervisor.observe import EventType
from tests.unit.shapes import node, with_condition

SEQ = Path(__file__).parent / "shapes" / "sequences"
READY = node("node-a")
NODES = {"node-a": READY, "node-b": node("node-b"), "node-gone": READY}


def sequence(name: str) -> list[dict[str, Any]]:
    return json.loads((SEQ / f"{name}.json").read_text())


def first_failure(events: list[dict[str, Any]], settings: ClassifySettings | None = None,
                  nodes: dict[str, Any] | None = None) -> tuple[Failure | None, int]:
    """Feed events in order as the loop does; return the first failure and its event index."""
    memory: PodMemory | None = None
    for i, ev in enumerate(events):
        pod = ev["object"]
        nd = (NODES if nodes is None else nodes).get(pod["spec"].get("nodeName") or "")
        f = classify(pod, EventType(ev["type"]), memory, NodeState(nd),
                     settings=settings or ClassifySettings(), now=0.0)
        if f is not None:
            return f, i
        memory = remember(memory, pod)
    return None, -1


CASES = [
    ("exit137_never", Cause.EXIT_CODE, 137, "worker", 2,
     "restartPolicy Never: the terminated state carries 137"),
    ("exit1_onfailure_restart", Cause.EXIT_CODE, 1, "worker", 2,
     "OnFailure: lastState.terminated with restartCount going up"),
    ("force_delete", Cause.POD_FORCE_DELETED, None, None, 2,
     "force delete: decided on the first event with deletionTimestamp (grace 0)"),
    ("graceful_delete", Cause.POD_DELETED, None, None, 2,
     "graceful delete by someone else: decided at its first deletion event (grace 30)"),
    ("eviction_api", Cause.EVICTED, None, None, 2,
     "Eviction API: DisruptionTarget EvictionByEvictionAPI, before the delete"),
    ("pod_gc_node_deleted", Cause.NODE_NOT_READY, None, None, 2,
     "node object deleted: PodGC's DisruptionTarget counts as node loss"),
    ("kubelet_pressure_eviction", Cause.EVICTED, None, None, 2,
     "kubelet node-pressure eviction: phase Failed reason Evicted, not an exit code"),
]


@pytest.mark.parametrize(("name", "cause", "code", "container", "at"),
                         [c[:5] for c in CASES], ids=[c[5] for c in CASES])
def test_captured_sequences(name: str, cause: Cause, code: int | None, container: str | None,
                            at: int) -> None:
    events = sequence(name)
    failure, index = first_failure(events)
    pod = events[-1]["object"]["metadata"]
    assert failure == Failure(cause, pod["name"], pod["uid"],
                              events[-1]["object"]["spec"]["nodeName"], code, container,
                              failure.detail if failure else "")
    assert index == at


def test_a_supervisor_deletion_is_never_a_failure() -> None:
    for name in ("force_delete", "graceful_delete"):
        for ev in sequence(name):
            assert classify(ev["object"], EventType(ev["type"]), None, NodeState(READY),
                            settings=ClassifySettings(), now=0.0, ours=True) is None


def test_a_missed_first_deletion_event_falls_back_to_the_deleted_object() -> None:
    forced, graceful = sequence("force_delete"), sequence("graceful_delete")
    # Only ADDED/MODIFIED Running, then DELETED (the MODIFIED with deletionTimestamp was lost).
    f, _ = first_failure([forced[0], forced[1], forced[-1]])
    assert f is not None and f.cause is Cause.POD_FORCE_DELETED
    f, _ = first_failure([graceful[0], graceful[1], graceful[-1]])
    # Its DELETED object shows the container terminated (143): the exit code is the cause.
    assert f is not None and (f.cause, f.exit_code) == (Cause.EXIT_CODE, 143)


def test_onfailure_restart_counts_only_once() -> None:
    events = sequence("exit1_onfailure_restart")
    memory = None
    for ev in events:
        memory = remember(memory, ev["object"])
    replay = copy.deepcopy(events[-1]["object"])
    replay["metadata"]["resourceVersion"] = "99999"  # e.g. a later Ready flip
    assert classify(replay, EventType.MODIFIED, memory, NodeState(READY),
                    settings=ClassifySettings(), now=0.0) is None


def test_a_new_incarnation_resets_memory() -> None:
    ev = sequence("force_delete")[2]["object"]
    memory = remember(None, ev)
    assert memory.first_deletion_grace == 0 and memory.deletion_while_live
    fresh = copy.deepcopy(sequence("force_delete")[1]["object"])
    fresh["metadata"]["uid"] = "another-uid"
    # Restart counts of 0 are not kept: a container not seen before counts as 0.
    assert remember(memory, fresh) == PodMemory(uid="another-uid")


RUNNING = sequence("exit137_never")[1]["object"]  # Running, Ready, on node-a
DOWN = node("node-a", "node_unreachable")


@pytest.mark.parametrize(("down_for", "grace", "expected"), [
    pytest.param(None, 0.0, None, id="node up: healthy"),
    pytest.param(0.0, 0.0, Cause.NODE_NOT_READY, id="grace 0: at once"),
    pytest.param(5.0, 10.0, None, id="down shorter than the grace: not yet"),
    pytest.param(10.0, 10.0, Cause.NODE_NOT_READY, id="down for the grace: node lost"),
])
def test_node_not_ready_after_the_grace(down_for: float | None, grace: float,
                                        expected: Cause | None) -> None:
    now = 100.0
    since = None if down_for is None else now - down_for
    f = classify(RUNNING, EventType.MODIFIED, remember(None, RUNNING),
                 NodeState(DOWN if since is not None else READY, since),
                 settings=ClassifySettings(node_grace_s=grace), now=now)
    assert (f.cause if f else None) is expected


def test_lease_age_detects_node_loss_before_the_controller_when_enabled() -> None:
    memory = remember(None, RUNNING)
    off = classify(RUNNING, EventType.MODIFIED, memory, NodeState(READY, None, 30.0),
                   settings=ClassifySettings(), now=0.0)
    on = classify(RUNNING, EventType.MODIFIED, memory, NodeState(READY, None, 30.0),
                  settings=ClassifySettings(lease_grace_s=20.0), now=0.0)
    assert off is None
    assert on is not None and on.cause is Cause.NODE_NOT_READY and "Lease" in on.detail


def test_node_down_since_tracks_the_first_time_seen_down() -> None:
    assert node_down_since(None, READY, 5.0) is None
    assert node_down_since(None, DOWN, 5.0) == 5.0
    assert node_down_since(5.0, DOWN, 9.0) == 5.0
    assert node_down_since(5.0, READY, 9.0) is None
    assert node_down_since(None, None, 3.0) == 3.0  # the node vanished
    tainted = copy.deepcopy(READY)
    tainted["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]
    assert node_down_since(None, tainted, 1.0) == 1.0


@pytest.mark.parametrize(("reason", "cause"), [
    ("PreemptionByScheduler", Cause.PREEMPTED),
    ("DeletionByTaintManager", Cause.NODE_NOT_READY),
    ("TerminationByKubelet", Cause.EVICTED),
])
def test_other_disruption_targets(reason: str, cause: Cause) -> None:
    pod = copy.deepcopy(RUNNING)
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": reason})
    f = classify(pod, EventType.MODIFIED, None, NodeState(READY), settings=ClassifySettings(),
                 now=0.0)
    assert f is not None and f.cause is cause


def test_a_readiness_flip_is_not_a_failure() -> None:
    pod = with_condition(RUNNING, "Ready", "False")
    assert classify(pod, EventType.MODIFIED, remember(None, RUNNING), NodeState(READY),
                    settings=ClassifySettings(), now=0.0) is None


def test_the_failing_container_is_named_among_several() -> None:
    pod = copy.deepcopy(sequence("exit137_never")[2]["object"])
    ok = copy.deepcopy(pod["status"]["containerStatuses"][0])
    ok["name"], ok["state"]["terminated"]["exitCode"] = "sidecar", 0
    pod["status"]["containerStatuses"].insert(0, ok)
    f = classify(pod, EventType.MODIFIED, None, NodeState(READY), settings=ClassifySettings(),
                 now=0.0)
    assert f is not None and (f.exit_code, f.container) == (137, "worker")


def with_helper(helper_code: int, *, worker_running: bool = True,
                first: str = "worker") -> dict[str, Any]:
    """The captured pod whose worker exited 137, with a second container `helper` that ended
    with `helper_code`; the worker still running unless told; `first`: the spec's first."""
    pod = copy.deepcopy(sequence("exit137_never")[2]["object"])
    worker = pod["status"]["containerStatuses"][0]
    if worker_running:
        worker["state"] = {"running": {"startedAt": "2026-11-26T10:00:00Z"}}
    helper = copy.deepcopy(pod["status"]["containerStatuses"][0])
    helper["name"] = "helper"
    helper["state"] = {"terminated": {"exitCode": helper_code, "reason": "Completed"}}
    pod["status"]["containerStatuses"].append(helper)
    spec_worker = pod["spec"]["containers"][0]
    spec_helper = {**spec_worker, "name": "helper"}
    pod["spec"]["containers"] = ([spec_worker, spec_helper] if first == "worker"
                                 else [spec_helper, spec_worker])
    return pod


@pytest.mark.parametrize(("pod", "settings", "expected", "reported"), [
    pytest.param(with_helper(0), ClassifySettings(), None, [("helper", 0)],
                 id="a helper that exits 0 is no failure of a running worker (was ExitCode 0)"),
    pytest.param(with_helper(3), ClassifySettings(), None, [("helper", 3)],
                 id="nor one that fails, unless the policy names it"),
    pytest.param(with_helper(3), ClassifySettings(policy_containers=frozenset({"helper"})),
                 (3, "helper"), [], id="a policy rule names the helper: its exit counts"),
    pytest.param(with_helper(0, worker_running=False), ClassifySettings(), (137, "worker"),
                 [("helper", 0)], id="the training container's exit is the worker's"),
    pytest.param(with_helper(0, first="helper"), ClassifySettings(), (0, "helper"), [],
                 id="by default the first container is the training one"),
    pytest.param(with_helper(0, first="helper"),
                 ClassifySettings(training_container="worker"), None, [("helper", 0)],
                 id="SUPERVISOR_WORKER_CONTAINER names it"),
])
def test_only_the_training_container_and_those_the_policy_names_count(
        pod: dict[str, Any], settings: ClassifySettings, expected: tuple[int, str] | None,
        reported: list[tuple[str, int]]) -> None:
    f = classify(pod, EventType.MODIFIED, None, NodeState(READY), settings=settings, now=0.0)
    assert (None if f is None else (f.exit_code, f.container)) == expected
    assert uncounted_exits(pod, None, settings) == reported


def test_a_pod_deleted_while_the_watch_was_down_is_judged_from_its_last_object() -> None:
    # The relist knows only the name; the loop hands classify the last object it saw.
    f = classify(RUNNING, EventType.DELETED, remember(None, RUNNING), NodeState(READY),
                 settings=ClassifySettings(), now=0.0, relisted=True)
    assert f is not None and f.cause is Cause.POD_DELETED
    assert f.uid == RUNNING["metadata"]["uid"] and f.pod == RUNNING["metadata"]["name"]
    assert f.detail == "deleted while the watch was down (last seen Running)"
