"""The fault soak's pure parts (bench/soak.py): a seed's plan and the invariants of one sample,
on captured pod shapes."""

from __future__ import annotations

from typing import Any

import pytest

from bench.soak import (
    FAULTS,
    SLOT_LABEL,
    Sample,
    as_seen,
    braked,
    gaps,
    job_backoff,
    longest_gap,
    merged,
    plan,
    settling,
    unusable_hosts,
    view_back,
    violations,
)
from supervisor.observe import marked_not_ready
from tests.unit.shapes import load, pod, with_condition


def worker(slot: int, n: int, ip: str, node: str = "node-a", **meta: Any) -> dict[str, Any]:
    p = pod(f"elastic-train-w{slot}-{n}", ip=ip, node=node)
    p["metadata"].setdefault("labels", {})[SLOT_LABEL] = str(slot)
    p["metadata"].update(meta)
    return p


def sample(pods: list[dict[str, Any]], hosts: set[str], *,
           nodes: dict[str, float | None] | None = None,
           ledger: dict[str, Any] | None = None, held: frozenset[str] = frozenset()) -> Sample:
    return Sample(pods, nodes or {"node-a": None, "node-b": None}, frozenset(hosts),
                  ledger or {"total": 1, "perSlot": {"0": 1}}, held)


def test_a_seed_always_gives_the_same_plan_and_seeds_differ() -> None:
    assert plan(7) == plan(7)
    assert plan(7) != plan(8)
    assert len(plan(7)) == 20 and {s.fault for s in plan(7)} <= set(FAULTS)
    assert all(5 <= s.after_steps <= 80 for s in plan(7))


GOOD = [worker(0, 1, "10.244.1.5"), worker(1, 1, "10.244.2.5", node="node-b")]
DELETING = worker(0, 1, "10.244.1.5", deletionTimestamp="2026-11-25T13:00:00Z")


def ended(p: dict[str, Any], code: int = 137) -> dict[str, Any]:
    """The pod as the kubelet posts it first after its container was killed: phase still
    Running, the container terminated, Ready False (seen in the soak of seed 1)."""
    p = with_condition(p, "Ready", "False")
    p["status"]["containerStatuses"] = [
        {**cs, "ready": False, "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
        for cs in p["status"]["containerStatuses"]]
    return p


@pytest.mark.parametrize(("now", "before", "expect"), [
    (sample(GOOD, {"10.244.1.5", "10.244.2.5"}), None, []),
    # a third pod for slot 0 while the first still runs
    (sample([*GOOD, worker(0, 2, "10.244.3.5")], set()), None,
     ["slot 0 has 2 live pods: ['elastic-train-w0-1', 'elastic-train-w0-2']"]),
    # a terminating pod is not live: its replacement may run beside it
    (sample([DELETING, worker(0, 2, "10.244.3.5"), GOOD[1]], set()), None, []),
    # nor is a pod whose container ended while its phase still says Running
    (sample([ended(GOOD[0]), worker(0, 2, "10.244.3.5"), GOOD[1]], set()), None, []),
    (sample([*GOOD, worker(2, 1, "10.0.0.7"), worker(3, 1, "10.0.0.8")], set()), None,
     ["4 live workers, max 3"]),
    # a host whose pod is gone, twice in a row
    (sample(GOOD[1:], {"10.244.1.5"}), sample(GOOD[1:], {"10.244.1.5"}),
     ["the file lists unusable hosts ['10.244.1.5']"]),
    # once only: the file and the API were read one after the other
    (sample(GOOD[1:], {"10.244.1.5"}), sample(GOOD, {"10.244.1.5"}), []),
    (sample(GOOD, set(), ledger={"total": 0, "perSlot": {"0": 0}}), sample(GOOD, set()),
     ["ledger total went back: 1 -> 0", "ledger of slot 0 went back: 1 -> 0"]),
])
def test_violations(now: Sample, before: Sample | None, expect: list[str]) -> None:
    assert violations(now, before, max_workers=3) == expect


READY = {"node-a": None, "node-b": None}


@pytest.mark.parametrize(("pods", "nodes", "unusable"), [
    (GOOD, READY, set()),
    ([DELETING, GOOD[1]], READY, {"10.244.1.5"}),
    ([with_condition(GOOD[0], "Ready", "False"), GOOD[1]], READY, {"10.244.1.5"}),
    (GOOD, {"node-a": 60.0, "node-b": None}, {"10.244.1.5"}),
    ([{**GOOD[0], "status": {**GOOD[0]["status"], "phase": "Failed"}}, GOOD[1]], READY,
     {"10.244.1.5"}),
    # NotReady for less than the node grace (the node controller marks its pods not Ready
    # too): its heartbeating hosts are kept listed by design (issue 27, item 12).
    ([with_condition(GOOD[0], "Ready", "False"), GOOD[1]], {"node-a": 4.0, "node-b": None},
     set()),
    ([DELETING, GOOD[1]], {"node-a": 4.0, "node-b": None}, {"10.244.1.5"}),
    (GOOD, {"node-a": 16.0, "node-b": None}, {"10.244.1.5"}),
])
def test_a_listed_host_is_usable_only_if_its_pod_runs_ready_on_a_node_not_notready(
        pods: list[dict[str, Any]], nodes: dict[str, float | None], unusable: set[str]) -> None:
    assert unusable_hosts(sample(pods, {"10.244.1.5", "10.244.2.5"}, nodes=nodes)) == unusable


def test_hosts_the_disruption_brake_holds_stay_usable() -> None:
    # After an API outage the node controller marks both nodes of the job NotReady: the brake
    # holds them (the supervisor keeps their heartbeating hosts), and a node grace after it.
    down = {"node-a": 40.0, "node-b": 40.0}
    pods = [with_condition(p, "Ready", "False") for p in GOOD]
    assert braked(pods, down) == {"node-a", "node-b"}
    assert braked(pods, {"node-a": 40.0, "node-b": None}) == frozenset()  # one of two: no brake
    listed = {"10.244.1.5", "10.244.2.5"}
    assert unusable_hosts(sample(pods, listed, nodes=down)) == listed
    assert unusable_hosts(sample(pods, listed, nodes=down, held=frozenset(down))) == set()
    assert unusable_hosts(sample(pods, listed, nodes=down, held=frozenset({"node-b"}))) == {
        "10.244.1.5"}


def test_a_node_back_ready_keeps_its_not_ready_pods_usable_for_a_node_grace() -> None:
    """Seen in the soak of seed 1 (2026-11-29): the node came back Ready after an API outage,
    its pod stayed Ready=False (the node controller's mark) for 13 s more, until its kubelet
    posted it again, while its processes heartbeat and the supervisor kept it listed."""
    pods = [with_condition(GOOD[0], "Ready", "False"), GOOD[1]]
    listed = {"10.244.1.5", "10.244.2.5"}
    back = {"node-a": None, "node-b": None}
    assert unusable_hosts(Sample(pods, back, frozenset(listed), {}, recent=frozenset(
        {"node-a"}))) == set()
    assert unusable_hosts(Sample(pods, back, frozenset(listed), {})) == {"10.244.1.5"}


BACK = 1_000.0  # when the supervisor's view came back after an outage (view_back)


@pytest.mark.parametrize(("now", "quiet", "held"), [
    pytest.param(BACK + 20, frozenset(), {"node-a"},
                 id="down within a minute of the API's return, its worker heartbeats: held"),
    pytest.param(BACK + 74, frozenset(), {"node-a"},
                 id="still held at the window's end (60 s, and 15 s for the file to follow)"),
    pytest.param(BACK + 76, frozenset(), set(), id="not after it"),
    pytest.param(BACK + 20, frozenset({"elastic-train-w0-1"}), set(),
                 id="its worker frozen or partitioned by the plan (no heartbeat): not held"),
])
def test_the_settling_hold_keeps_a_down_nodes_heartbeating_hosts_usable(
        now: float, quiet: frozenset[str], held: set[str]) -> None:
    """Seen in the soak of seed 2 (2026-11-29): a kubelet stopped right as an API outage ended;
    the supervisor held its node (node.settling) and the worker trained on at full size, and the
    checker, which did not model that hold, counted 84 samples of "unusable hosts"."""
    pods = [with_condition(GOOD[0], "Ready", "False"), GOOD[1]]
    down = {"node-a": 30.0, "node-b": None}
    listed = {"10.244.1.5", "10.244.2.5"}
    assert settling(pods, down, now, BACK, quiet) == held
    s = Sample(pods, down, frozenset(listed), {},
               settling=settling(pods, down, now, BACK, quiet))
    assert unusable_hosts(s) == (set() if held else {"10.244.1.5"})


def connected(kind: str, broken_s: float, at: str) -> dict[str, Any]:
    return {"event": "watch.connected", "kind": kind, "broken_s": broken_s,
            "timestamp": f"2026-11-29T{at}Z"}


def test_the_supervisors_view_comes_back_with_its_node_watch_after_an_outage() -> None:
    """Seed 2, 2026-11-29: the API server was back at 18:19:45, the supervisor's watches at
    18:20:35 (through the `kubernetes` Service, which kube-proxy routes again only once its own
    watch is back); a reconnect after a routine break (0.02 s) is no outage's end."""
    records = [connected("pod", 429.5, "18:20:35.458"), connected("node", 429.9, "18:20:35.897"),
               connected("node", 0.019, "18:20:35.919"), {"event": "worker.created"}]
    back = view_back(records)
    assert back is not None and abs(back - view_back([records[1]])) < 1e-9
    assert view_back(records[2:]) is None
    # A node the node controller marked NotReady 45 s before: the supervisor has seen it down
    # for as long as its view has been back (its node grace counts from there).
    assert as_seen({"node-a": 45.0, "node-b": None}, back + 5, back) == {"node-a": 5.0,
                                                                         "node-b": None}
    assert as_seen({"node-a": 3.0}, back + 5, back) == {"node-a": 3.0}
    assert as_seen({"node-a": 45.0}, back + 5, None) == {"node-a": 45.0}


def test_no_settling_hold_without_an_outage_nor_for_a_node_without_live_workers() -> None:
    pods = [with_condition(GOOD[0], "Ready", "False"), GOOD[1]]
    down = {"node-a": 30.0, "node-b": None}
    assert settling(pods, down, BACK, None, frozenset()) == frozenset()
    assert settling([ended(pods[0]), GOOD[1]], down, BACK + 5, BACK, frozenset()) == frozenset()


def test_the_captured_shape_is_running_and_ready() -> None:
    # The table above relies on it.
    p = load("pod_running_ready")
    assert p["status"]["phase"] == "Running"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])


def test_an_interval_without_a_step_over_the_limit_is_reported_with_the_step_before_it() -> None:
    # A restarted run resumes from its checkpoint: steps may go back, time does not.
    steps = [{"step": 1, "time": 100.0}, {"step": 2, "time": 100.2}, {"step": 3, "time": 163.4},
             {"step": 1, "time": 170.0}, {"step": 2, "time": 170.1}]
    assert gaps(steps, over=30) == [{"gap_s": 63.2, "after_step": 2}]
    assert gaps(steps, over=70) == []
    assert longest_gap(steps) == 63.2
    assert longest_gap(steps[:1]) == 0.0


def test_the_job_controllers_backoff_inside_an_interval_is_not_held_against_the_job() -> None:
    # Seed 8 (2026-11-29): the plan's second launcher exit; the Job controller waited 20 s
    # before its next launcher, which trained again 10 s later: 30.0 s without a step.
    steps = [{"step": 236, "time": 1000.0}, {"step": 237, "time": 1000.1},
             {"step": 1, "time": 1030.15}, {"step": 2, "time": 1030.2}]
    assert gaps(steps, over=30) == [{"gap_s": 30.1, "after_step": 237}]
    assert gaps(steps, over=30, backoffs=[(1001.0, 20.0)]) == []
    # A wait outside the interval excuses nothing; one inside is said with the interval.
    assert gaps(steps, over=30, backoffs=[(950.0, 20.0)]) == [{"gap_s": 30.1, "after_step": 237}]
    assert gaps(steps, over=5, backoffs=[(1001.0, 20.0)]) == [
        {"gap_s": 30.1, "after_step": 237, "job_backoff_s": 20.0}]
    # Seed 8 at b0859a2: the launcher's finishedAt (whole seconds) read 5 ms before the last
    # step it relayed: only the part of the wait inside the interval counts.
    last = [{"step": 231, "time": 1796006238.005}, {"step": 1, "time": 1796006276.694}]
    assert gaps(last, over=30, backoffs=[(1796006238.0, 22.0)]) == []
    assert gaps(last, over=16, backoffs=[(1796006238.0, 22.0)]) == [
        {"gap_s": 38.7, "after_step": 231, "job_backoff_s": 22.0}]


def test_the_job_controllers_wait_is_from_the_launchers_end_to_its_successors_creation() -> None:
    old = load("pod_running_ready")
    old["status"]["containerStatuses"] = [
        {"name": "elastic-supervisor", "state": {"terminated": {
            "exitCode": 0, "finishedAt": "2026-11-29T12:37:01Z"}}},
        {"name": "launcher", "state": {"terminated": {
            "exitCode": 137, "finishedAt": "2026-11-29T12:37:02Z"}}}]
    new = load("pod_running_ready")
    new["metadata"]["creationTimestamp"] = "2026-11-29T12:37:22Z"
    ended, waited = job_backoff(old, new)
    assert (waited, ended % 60) == (20.0, 2.0)
    with pytest.raises(ValueError, match="no finished container"):
        job_backoff(new, new)


def test_a_run_adds_its_seeds_to_the_stored_runs_of_this_soak_and_replaces_its_own() -> None:
    old_shape = {"seed": 2, "faults": []}  # the main job's soak: no false_verdicts
    stored = [{"seed": 1, "false_verdicts": [], "when": "a"}, old_shape,
              {"seed": 8, "false_verdicts": [], "when": "a"}]
    new = [{"seed": 8, "false_verdicts": [], "when": "b"}, {"seed": 2, "false_verdicts": []}]
    assert merged(stored, new) == [stored[0], new[1], new[0]]


def test_a_pod_marked_not_ready_from_outside_whose_worker_heartbeats_stays_usable() -> None:
    """Seen in the soak of seed 1 (2026-11-30): after the API outage the pod stayed Ready=False
    (the node controller's mark) for 49 s after its node was Ready again, while its worker
    trained and the supervisor kept it listed (hostlist.kept_while_heartbeating). A pod in
    `marked` (marked_not_ready, and not one the plan froze or partitioned) is usable; one whose
    own readiness probe fails is never marked."""
    pods = [with_condition(GOOD[0], "Ready", "False"), GOOD[1]]
    listed = {"10.244.1.5", "10.244.2.5"}
    assert marked_not_ready(pods[0]), "all containers ready, the pod not: marked from outside"
    assert unusable_hosts(Sample(pods, READY, frozenset(listed), {})) == {"10.244.1.5"}
    assert unusable_hosts(Sample(pods, READY, frozenset(listed), {}, marked=frozenset(
        {"elastic-train-w0-1"}))) == set()
    probe_failed = with_condition(GOOD[0], "Ready", "False")
    probe_failed["status"]["containerStatuses"] = [
        {**cs, "ready": False} for cs in probe_failed["status"]["containerStatuses"]]
    probe_failed["spec"]["containers"] = [
        {**c, "readinessProbe": {"tcpSocket": {"port": 2222}}}
        for c in probe_failed["spec"]["containers"]]
    assert not marked_not_ready(probe_failed), "its own probe says so: not kept"
