"""The decisions a single trigger makes on arrival (supervisor/decide/on.py), as tables over
watch events captured from the real control plane (tests/unit/shapes): each row is the memory
before, what came, and the memory (and what is said) after."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from supervisor.decide import (
    accounting,
    admission,
    fleet,
    incidents,
    listing,
    on,
    plan,
    progress,
    regroup,
)
from supervisor.decide.beats import Beat, talking
from supervisor.decide.classify import Cause, ClassifySettings, NodeState, PodMemory
from supervisor.decide.hostlist import HostMode, Rendered
from supervisor.decide.memory import Memory
from supervisor.observe import ClusterView, EventType, Kind
from supervisor.workers import pod_name
from tests.unit.shapes import node, pod, with_condition

SEQ = Path(__file__).parent / "shapes" / "sequences"
SETTINGS = ClassifySettings()
READY = NodeState(node("node-a"))


def events(name: str) -> list[dict[str, Any]]:
    return json.loads((SEQ / f"{name}.json").read_text())


def feed(c: Memory, evs: list[dict[str, Any]], *, synced: bool = True
         ) -> tuple[Memory, PodMemory | None]:
    record = None
    for i, ev in enumerate(evs):
        c, record = on.pod_seen(c, on.PodEvent(EventType(ev["type"]), ev["object"], float(i)),
                                record, synced=synced, node=READY, settings=SETTINGS)
    return c, record


# ---- a pod's watch events ---------------------------------------------------------------------

def test_a_create_that_shows_up_is_no_longer_expected_and_is_remembered() -> None:
    p = pod("job-w0-1")
    c, record = on.pod_seen(Memory(expected={"job-w0-1": 5.0, "job-w1-1": 6.0}),
                            on.PodEvent(EventType.ADDED, p, 7.0), None, synced=True,
                            node=READY, settings=SETTINGS)
    assert c.expected == {"job-w1-1": 6.0}
    assert record is not None and record.uid == p["metadata"]["uid"]
    assert (c.failed, c.found) == (frozenset(), ())


@pytest.mark.parametrize(("sequence", "cause", "code"), [
    pytest.param("exit137_never", Cause.EXIT_CODE, 137, id="SIGKILLed, restartPolicy Never"),
    pytest.param("force_delete", Cause.POD_FORCE_DELETED, None, id="force deleted"),
    pytest.param("eviction_api", Cause.EVICTED, None, id="evicted through the API"),
])
def test_a_failure_is_found_once_per_uid(sequence: str, cause: Cause, code: int | None) -> None:
    evs = events(sequence)
    c, _ = feed(Memory(), [e for e in evs if e["type"] != "DELETED"])
    [failed] = c.found
    uid = evs[0]["object"]["metadata"]["uid"]
    assert (failed.failure.cause, failed.failure.exit_code) == (cause, code)
    assert c.failed == {uid}
    again, _ = feed(c, [e for e in evs if e["type"] != "DELETED"][-1:])
    assert again.found == c.found, "not found twice"


def test_before_the_sync_nothing_is_classified_and_a_delete_forgets_the_pod() -> None:
    evs = events("exit137_never")
    c, record = feed(Memory(), [e for e in evs if e["type"] != "DELETED"], synced=False)
    assert (c.failed, c.found) == (frozenset(), ()) and record is not None
    uid = evs[0]["object"]["metadata"]["uid"]
    gone = on.PodEvent(EventType.DELETED, evs[-1]["object"], 9.0)
    c, record = on.pod_seen(replace(c, failed=frozenset({uid, "other"})), gone, record,
                            synced=True, node=READY, settings=SETTINGS)
    assert record is None and c.failed == {"other"}, "its UID may not be judged again, it is gone"


# ---- a node's watch events --------------------------------------------------------------------

@pytest.mark.parametrize(("down_before", "seen", "down_after"), [
    pytest.param({}, with_condition(node("n1"), "Ready", "Unknown"), {"n1": 10.0},
                 id="NotReady: down since now"),
    pytest.param({"n1": 3.0}, with_condition(node("n1"), "Ready", "Unknown"), {"n1": 3.0},
                 id="still NotReady: down since the first time"),
    pytest.param({"n1": 3.0, "n2": 4.0}, node("n1"), {"n2": 4.0}, id="Ready again: up"),
    pytest.param({}, node("n1", "node_unreachable"), {"n1": 10.0},
                 id="the unreachable taint the lifecycle controller sets"),
    pytest.param({}, None, {"n1": 10.0}, id="deleted: down"),
])
def test_a_node_is_down_since_the_first_event_that_showed_it_down(
        down_before: dict[str, float], seen: dict[str, Any] | None,
        down_after: dict[str, float]) -> None:
    c = Memory(node_down=down_before)
    after = on.node_seen(c, "n1", seen, 10.0)
    assert dict(after.node_down) == down_after
    if down_after == down_before:
        assert after is c, "nothing changed: the same memory"


# ---- the outcomes of creates ------------------------------------------------------------------

def test_refusals_back_off_and_are_said_as_an_event_when_new_or_changed() -> None:
    c = Memory(expected={"job-w2-1": 1.0})
    c, first = on.create_refused(c, "job-w2-1", "quota exceeded", 10.0)
    assert "job-w2-1" not in c.expected and c.blocked["job-w2-1"].attempts == 1
    assert first.k8s is not None and first.k8s.reason == "ReplacementBlocked"
    c, same = on.create_refused(c, "job-w2-1", "quota exceeded", 20.0)
    assert c.blocked["job-w2-1"].attempts == 2 and same.k8s is None
    assert same.fields["retry_in_s"] == round(c.blocked["job-w2-1"].retry_at - 20.0, 1)
    c, other = on.create_refused(c, "job-w2-1", "denied by admission", 30.0)
    assert other.k8s is not None and "denied by admission" in other.k8s.note
    c, was = on.created(c, "job-w2-1")
    assert was is not None and was.attempts == 3 and c.blocked == {}
    assert on.created(c, "job-w2-1") == (c, None)


def test_a_create_that_failed_for_good_drops_its_slot_or_keeps_a_cordoned_worker() -> None:
    fl = fleet.initial(3)
    name = pod_name("job", 2, fl.slots[2].incarnation)
    c, notes = on.create_failed(Memory(fleet=fl, expected={name: 1.0}), name, "cannot create",
                                "job")
    assert c.fleet is not None and c.fleet.slots[2].dropped == "cannot create"
    assert [n.k8s.reason for n in notes if n.k8s] == ["WorkerCreateFailed"]
    assert name not in c.expected
    moving = Memory(fleet=fl, moving={"job-w0-1": "job-w0-2"})
    c, notes = on.create_failed(moving, "job-w0-2", "cannot create job-w0-2: refused", "job")
    assert c.staying == {"job-w0-1"} and c.fleet == fl
    assert [n.k8s.reason for n in notes if n.k8s] == ["WorkerStays"]
    assert on.create_failed(c, "job-w0-2", "again", "job") == (c, ()), "said once"
    assert on.create_failed(Memory(), name, "x", "job") == (Memory(), ()), "no fleet: not ours"


# ---- the rest ---------------------------------------------------------------------------------

def test_a_new_run_of_horovodrun_forgets_the_last_runs_failures_and_regroup() -> None:
    pending = regroup.pending([], 5.0)
    c = on.horovodrun_started(Memory(failed_at={"10.0.0.1": 5.0}, regroup=pending,
                                   held_said=True, failed=frozenset({"u"})))
    assert (c.failed_at, c.regroup, c.held_said, c.failed) == ({}, None, False, {"u"})


def test_the_host_list_keeps_what_plan_listing_decided() -> None:
    pending = regroup.pending([], 5.0)
    c = Memory(regroup=pending)
    empty = Rendered(lines=(), hosts={}, left_out={})
    same = listing.Listed(empty, pending, {}, False)
    assert on.listed(c, same) is c
    done = on.listed(c, listing.Listed(empty, None, {"10.0.0.2": (3, 9.0)}, True))
    assert (done.regroup, dict(done.reannounced), done.held_said) == (
        None, {"10.0.0.2": (3, 9.0)}, True)


def test_a_scale_request_and_a_policy_reload() -> None:
    assert on.scale_asked(Memory(), 4).scale_request == 4
    fl = fleet.initial(2)
    assert on.policy_reloaded(Memory(fleet=fl, saved=fl)).saved is None


def test_a_refusal_record_is_admissions_own() -> None:
    c, _ = on.create_refused(Memory(), "w", "r", 0.0)
    assert c.blocked["w"] == admission.refused(None, "r", 0.0)


# ---- the start gate, the watches' return, a scale request, the leadership, the accounting ------

def test_the_gate_opens_at_the_first_start_and_again_at_a_restart() -> None:
    assert on.gate_opened(Memory(gate_since=3.0), 50.0).gate_since == 50.0


@pytest.mark.parametrize(("broken_s", "back_at"), [
    pytest.param(4.9, None, id="a routine reconnect: no outage"),
    pytest.param(5.0, 100.0, id="an outage (nodes.OUTAGE_MIN_S): the settling hold counts"),
    pytest.param(180.0, 100.0, id="a three-minute outage"),
])
def test_the_node_watch_back_from_an_outage(broken_s: float, back_at: float | None) -> None:
    assert on.node_watch_back(Memory(), 100.0, broken_s).api_back_at == back_at


SCALE = plan.Settings("job", HostMode.POD_IP, min_np=1, max_np=8, slots_per_worker=2,
                      scale_out_timeout_s=300.0, scale_in_timeout_s=60.0)


def scale_map(text: str, rv: str) -> dict[str, Any]:
    """The scale request's ConfigMap as `elastic-supervisor scale` writes it (slimmed)."""
    return {"metadata": {"name": "job-scale", "resourceVersion": rv},
            "data": {fleet.SCALE_KEY: text}}


def test_a_scale_request_is_taken_once_per_version_and_a_bad_one_refused() -> None:
    c, said = on.scale_seen(Memory(), scale_map('{"workers": 3}', "10"), SCALE)
    assert (c.scale_request, c.scale_version, said) == (3, "10", None)
    again, said = on.scale_seen(replace(c, scale_request=None), scale_map('{"workers": 3}', "10"),
                                SCALE)
    assert (again.scale_request, said) == (None, None), "the same version: not asked again"
    bad, said = on.scale_seen(c, scale_map('{"workers": 2.9}', "11"), SCALE)
    assert (bad.scale_request, bad.scale_version) == (3, "11"), "the size asked before is kept"
    assert said is not None and said.k8s is not None and said.k8s.reason == "ScaleRefused"
    assert '"workers" is 2.9, not an integer' in said.k8s.note
    assert "N an integer in [1, 4]" in said.k8s.note and said.event == "scale.invalid"
    out_of_range, said = on.scale_seen(c, scale_map('{"workers": 9}', "12"), SCALE)
    assert (out_of_range.scale_request, said) == (9, None), "the range is the pass's to check"


def test_an_exit_while_the_lease_cannot_be_renewed_is_held_until_it_is() -> None:
    c = on.leadership(Memory(), paused=True)
    c, judged, held = on.exit_seen(c, 0)
    assert (c.held_exit, judged, held) == (0, None, True)
    c, judged, held = on.exit_seen(c, None)
    assert (c.held_exit, judged, held) == (0, None, False), "said once"
    c = on.leadership(c, paused=False)
    c, judged, held = on.exit_seen(c, None)
    assert (c.held_exit, judged, held) == (None, 0, False), "judged once resumed"
    assert on.exit_seen(Memory(), 1)[1:] == (1, False), "not paused: judged at once"


def test_the_accounting_is_kept_in_the_memory() -> None:
    a = accounting.Accounted(progress.Progress(step=7), incidents.Book(next_id=3), (), (),
                             True, 12.0)
    c = on.accounted(Memory(), a)
    assert (c.progress.step, c.book.next_id, c.progress_saved_at) == (7, 3, 12.0)


def test_the_held_exit_is_the_code_horovodrun_exited_with() -> None:
    c, _, held = on.exit_seen(on.leadership(Memory(), paused=True), 137)
    assert held and c.held_exit == 137 and type(c.held_exit) is int


@pytest.mark.parametrize(("crashed", "code"), [(False, 4), (True, 70)])
def test_an_error_for_good_ends_the_run_and_the_first_one_is_kept(crashed: bool, code: int) -> None:
    # A watch refused for good (403) is KUBE_FATAL; an exception of ours (the actuator's
    # note "bug") is INTERNAL. A second error in the same batch does not replace the first.
    c = on.fatal(Memory(), "watching pods failed for good: 403 Forbidden", crashed=crashed)
    assert c.fatal == (code, "watching pods failed for good: 403 Forbidden")
    assert on.fatal(c, "create job-w0-1: 403", crashed=not crashed).fatal == c.fatal


def test_a_supervisor_starts_from_the_fleet_and_the_progress_stored_before_it() -> None:
    fl = fleet.initial(2)
    stored = {"progress": progress.to_dict(progress.Progress(step=40, redone=3)),
              "incidents": [{"id": 4, "cause": "ExitCode", "kind": "replace",
                             "phases": {"detected": 1.0}}]}
    c = on.initial(fl, stored)
    assert (c.fleet, c.progress.step, c.progress.redone, c.book.next_id) == (fl, 40, 3, 5)
    assert on.initial(None, None) == Memory()


def test_hosts_on_a_down_node_are_kept_while_they_heartbeat_and_said_when_that_changes() -> None:
    down = with_condition(node("node-a"), "Ready", "Unknown")  # the node controller's mark
    view = ClusterView()
    for kind, obj in ((Kind.NODE, down), (Kind.NODE, node("node-b")),
                      (Kind.POD, pod("w-0", ip="10.1.0.10", node="node-a")),
                      (Kind.POD, pod("w-1", ip="10.1.0.11", node="node-b"))):
        view.apply(kind, EventType.ADDED, obj)

    def beat(host: str, last_seen: float) -> Beat:
        return Beat(sender=host, host=host, pid=1, local_rank=0, first_seen=0.0,
                    last_seen=last_seen, progress_at=None)

    # The one rule: a heartbeat under silence_s (3 s) ago; exactly 3 s is silent.
    beats = (beat("10.1.0.10", 97.5), beat("10.1.0.11", 97.0))
    assert talking(beats, 100.0, 3.0) == {"10.1.0.10"}
    c, note = on.heard(Memory(), view, HostMode.POD_IP, lambda: talking(beats, 100.0, 3.0))
    assert c.kept == {"10.1.0.10"} and note is not None
    assert (note.event, note.fields, note.k8s) == (
        "workers.kept_on_down_nodes", {"hosts": ["10.1.0.10"], "released": []}, None)
    assert on.heard(c, view, HostMode.POD_IP, lambda: {"10.1.0.10"}) == (c, None)  # said once
    silent, note = on.heard(c, view, HostMode.POD_IP, frozenset)  # silent now, or no run
    assert silent.kept == frozenset() and note is not None
    assert note.fields == {"hosts": [], "released": ["10.1.0.10"]}
