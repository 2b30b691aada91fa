"""quarantine.step: a node where workers of the job keep failing gets none for a while; and
core.manage keeping new workers off it and saying so."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from supervisor.decide import fleet
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.core import manage
from supervisor.decide.failures import Failed
from supervisor.decide.memory import Memory
from supervisor.decide.nodes import quarantine_signs
from supervisor.decide.plan import Leaving, Note
from supervisor.decide.quarantine import STARVED_S, Kind, Quarantine, Settings, Sign, room, step
from supervisor.decide.script import CreateWorker, DeletePod, SaveState
from supervisor.workers import not_on, pod_name
from tests.unit import shapes
from tests.unit.test_core import JOB, NOW, PODS, STEADY, WALL, died, exited, seen, worker
from tests.unit.test_core import settings as core_settings

S = Settings(failures=2, window_s=100.0, ttl_s=50.0)
LOST, HUNG, EXIT, BAD = Kind.LOST, Kind.HUNG, Kind.EXIT, Kind.CONDITION
NODES = ("n1", "n2", "n3")
ROOM = {"n1": 2, "n2": 2, "n3": 2}  # each node was seen holding two of the job's workers
_uid = iter(range(10_000))


def sign(kind: Kind, node: str, slot: int | None = 0, code: int | None = None,
         uid: str | None = None) -> Sign:
    """A worker of `slot` failed on `node` (a new pod each time unless `uid` is given)."""
    return Sign(kind, node, uid or f"uid-{next(_uid)}", slot, code)


def run(events: list[tuple[float, list[Sign]]] | list[tuple[float, list[Sign], set[str]]],
        s: Settings = S) -> list[tuple[float, tuple, tuple, dict[str, float]]]:
    """Feed signs at times (with the nodes down then); return (time, started, ended, until)
    after each."""
    q, out = Quarantine(), []
    for t, signs, *down in events:
        ch = step(q, signs, t, s, usable=NODES, placed=ROOM, need=4,
                  down=down[0] if down else ())
        q = ch.q
        out.append((t, ch.started, ch.ended, dict(q.until)))
    return out


@pytest.mark.parametrize(("events", "expected"), [
    pytest.param([(0, [sign(LOST, "n1")]), (10, [sign(LOST, "n1", 1)])],
                 [(0, (), (), {}), (10, (("n1", 2),), (), {"n1": 60.0})],
                 id="two workers lost with their node within the window: quarantined"),
    pytest.param([(0, [sign(LOST, "n1")]), (150, [sign(LOST, "n1")])],
                 [(0, (), (), {}), (150, (), (), {})],
                 id="the first slid out of the window"),
    pytest.param([(0, [sign(LOST, "n1"), sign(LOST, "n2")])], [(0, (), (), {})],
                 id="one each on two nodes"),
    # Issue 40: fault 1 SIGKILLed two containers, fault 2 a replacement while it joined; two
    # exits 137 on es-node-1 quarantined it for an hour.
    pytest.param([(0, [sign(EXIT, "n1", 0, 137)]), (20, [sign(EXIT, "n1", 1, 137)])],
                 [(0, (), (), {}), (20, (), (), {})],
                 id="the issue: two kills (137) of two slots on one node: not the node's"),
    pytest.param([(0, [sign(EXIT, "n1", 0, 143), sign(EXIT, "n1", 1, 143),
                       sign(EXIT, "n1", 2, 143)])], [(0, (), (), {})],
                 id="SIGTERMs (143) of three slots: never by themselves"),
    pytest.param([(0, [sign(EXIT, "n1", 0, 1)]), (20, [sign(EXIT, "n1", 0, 1)])],
                 [(0, (), (), {}), (20, (), (), {})],
                 id="one slot crashing twice there: its script, not the node"),
    pytest.param([(0, [sign(EXIT, "n1", 0, 134)]), (20, [sign(EXIT, "n1", 1, 134)])],
                 [(0, (), (), {}), (20, (("n1", 2),), (), {"n1": 70.0})],
                 id="two slots aborting (134) there and nowhere else: the node's"),
    pytest.param([(0, [sign(EXIT, "n1", 0, 134), sign(EXIT, "n2", 2, 134)]),
                  (20, [sign(EXIT, "n1", 1, 134)])],
                 [(0, (), (), {}), (20, (), (), {})],
                 id="the same exit on another node too: it follows the script"),
    pytest.param([(0, [sign(EXIT, "n1", 0, 134), sign(EXIT, "n1", 1, 1)])], [(0, (), (), {})],
                 id="two slots, two different exits: not the same failure"),
    pytest.param([(0, [sign(HUNG, "n1"), sign(HUNG, "n1", 1)]), (30, [])],
                 [(0, (), (), {}), (30, (), (), {})],
                 id="two hangs while the node stays Ready (SIGSTOPs): not the node's"),
    # Issue 40 fault 3: es-node-2 froze with two workers; its kubelet froze too.
    pytest.param([(0, [sign(HUNG, "n2"), sign(HUNG, "n2", 1)]), (45, [], {"n2"})],
                 [(0, (), (), {}), (45, (("n2", 2),), (), {"n2": 95.0})],
                 id="two hangs, then the node NotReady: the node's own silence, quarantined"),
    pytest.param([(0, [sign(HUNG, "n2"), sign(HUNG, "n2", 1)]), (121, [], {"n2"})],
                 [(0, (), (), {}), (121, (), (), {})],
                 id="the node down after HANG_EVIDENCE_S: another story"),
    pytest.param([(0, [sign(HUNG, "n2")], {"n2"}), (5, [sign(LOST, "n2", 1)])],
                 [(0, (), (), {}), (5, (("n2", 2),), (), {"n2": 55.0})],
                 id="a hang on a node already down counts, with a loss"),
    pytest.param([(0, [sign(LOST, "n1", uid="u1")]), (5, [sign(LOST, "n1", uid="u1")])],
                 [(0, (), (), {}), (5, (), (), {})], id="one worker counts once"),
    pytest.param([(0, [sign(BAD, "n3")]), (5, [sign(LOST, "n3", 1)])],
                 [(0, (), (), {}), (5, (("n3", 2),), (), {"n3": 55.0})],
                 id="a node-problem condition counts, with a loss"),
    pytest.param([(0, [sign(LOST, "n1"), sign(LOST, "n1", 1)]), (30, []), (50, []), (51, [])],
                 [(0, (("n1", 2),), (), {"n1": 50.0}), (30, (), (), {"n1": 50.0}),
                  (50, (), ("n1",), {}), (51, (), (), {})],
                 id="it ends by itself after the TTL"),
    pytest.param([(0, [sign(LOST, "n1"), sign(LOST, "n1")]), (10, [sign(LOST, "n1")]),
                  (60, [sign(LOST, "n1")])],
                 [(0, (("n1", 2),), (), {"n1": 50.0}), (10, (), (), {"n1": 50.0}),
                  (60, (("n1", 2),), ("n1",), {"n1": 110.0})],
                 id="failures while quarantined count for the next"),
])
def test_quarantine(events: list, expected: list) -> None:
    assert run(events) == expected


@pytest.mark.parametrize(("held", "until", "need", "spared"), [
    # Issue 40: 3 workers on 3 nodes, es-node-1 quarantined already, es-node-2 frozen: the
    # replacement had nowhere to go and the job trained at 2 of 3 for the hour.
    pytest.param({"n1": 2, "n2": 2, "n3": 1}, {"n1": 100.0}, 3, (("n2", 2, 3),),
                 id="the issue: the node left holds 2 of 3: spared"),
    pytest.param({"n1": 2, "n2": 2, "n3": 1}, {}, 3, (),
                 id="the nodes left were seen holding 2 + 1: quarantined"),
    pytest.param({"n1": 1, "n2": 1, "n3": 1}, {}, 3, (("n2", 2, 3),),
                 id="one worker per node seen: another node could take *a* worker, not all"),
    pytest.param({"n2": 2, "n3": 3}, {}, 3, (),
                 id="n3 alone was seen holding all three"),
    pytest.param({"n1": 2, "n2": 2}, {}, 3, (),
                 id="n3 never held one, but its like held two: n1 and n3 hold three"),
])
def test_a_node_is_spared_while_the_nodes_left_cannot_hold_the_job(
        held: dict[str, int], until: dict[str, float], need: int,
        spared: tuple[tuple[str, int, int], ...]) -> None:
    """Its slots would stay Pending instead of retrying where they can run: said once, and
    counted again from zero."""
    q = Quarantine(until=until, held=held)
    kind = {n: SMALL for n in NODES}  # the kind nodes are all alike
    ch = step(q, [sign(LOST, "n2"), sign(LOST, "n2", 1)], 0, S, usable=NODES, need=need,
              alike=kind)
    assert ch.spared == spared
    assert ("n2" in ch.q.until) == (not spared)
    assert step(ch.q, [], 1, S, usable=NODES, need=need, alike=kind).spared == ()


SMALL = (("cpu", "4"), ("memory", "16Gi"))
BIG = (("cpu", "16"), ("memory", "64Gi"), ("nvidia.com/gpu", "8"))


@pytest.mark.parametrize(("held", "alike", "nodes", "expected"), [
    pytest.param({"n1": 2, "n2": 2, "n3": 1}, {"n1": SMALL, "n2": SMALL, "n3": SMALL}, ["n3"], 2,
                 id="the issue's three kind nodes: n3 holds as many as its like were seen to"),
    pytest.param({"n1": 2, "n2": 2, "n3": 1}, {"n1": SMALL, "n2": SMALL, "n3": SMALL},
                 ["n1", "n3"], 4, id="two nodes left of the same shape"),
    pytest.param({"n1": 8, "n3": 1}, {"n1": BIG, "n3": SMALL}, ["n3"], 1,
                 id="a big node's room says nothing of a small one"),
    pytest.param({"n1": 2}, {"n1": SMALL, "n4": SMALL}, ["n4"], 2,
                 id="a new node of a shape seen: as many"),
    pytest.param({"n1": 2}, {"n1": SMALL}, ["n5"], 0, id="a node of no known shape: none"),
])
def test_the_room_of_the_nodes_left(held: dict[str, int], alike: dict[str, tuple],
                                    nodes: list[str], expected: int) -> None:
    assert room(held, alike, nodes) == expected


def test_the_room_a_node_was_seen_with_is_remembered() -> None:
    q = step(Quarantine(), [], 0, S, placed={"n1": 2, "n2": 1}).q
    q = step(q, [], 1, S, placed={"n1": 1}).q
    assert q.held == {"n1": 2, "n2": 1}


def test_off() -> None:
    off = Settings(failures=0)
    assert run([(0, [sign(LOST, "n1"), sign(LOST, "n1"), sign(LOST, "n1")])], off) == [
        (0, (), (), {})]
    q = step(Quarantine(), [sign(LOST, "n1"), sign(LOST, "n1")], 0, S, usable=NODES,
             placed=ROOM).q
    ch = step(q, [], 1, off)
    assert ch.q == Quarantine() and ch.ended == ("n1",), "turned off: released"


def test_nothing_new_keeps_the_same_object() -> None:
    q = Quarantine()
    assert step(q, [], 5, S).q is q
    q = step(q, [sign(LOST, "n1")], 5, S).q
    assert step(q, [], 6, S).q is q


def lost(p: dict, found_at: float = NOW) -> Failed:
    """`p` failed with its node (NotReady), as classify says it."""
    return Failed(Failure(Cause.NODE_NOT_READY, p["metadata"]["name"], p["metadata"]["uid"],
                          p["spec"]["nodeName"], detail="node NotReady"), p, found_at)


def test_core_counts_kills_of_the_script_for_nothing() -> None:
    """Issue 40 item 2, with the shipped defaults: worker 0 SIGKILLed on node-0, then its
    replacement killed there while it joined: two exits 137 on node-0, no quarantine."""
    st = replace(core_settings(), quarantine=Settings())
    first = died(0)  # on node-0, 137
    pods = {**PODS, first.failure.pod: first.pod}
    p = manage(replace(STEADY, found=(first,), failed=frozenset({first.failure.uid})),
               seen(pods), st)
    again = exited(worker(0, 2, node="node-0"))
    f = Failure(Cause.EXIT_CODE, again["metadata"]["name"], again["metadata"]["uid"], "node-0",
                137, "worker", "container worker exited with 137")
    c = replace(p.core, found=(Failed(f, again, NOW),), failed=p.core.failed | {f.uid})
    q = manage(c, seen({**pods, f.pod: again}, wall=WALL + 10), st)
    assert not [t for t in (*p.todo, *q.todo) if isinstance(t, Note)
                and t.event.startswith("node.quarantine")]
    assert q.core.quarantine.until == {}


def test_core_keeps_new_workers_off_a_quarantined_node_and_says_so() -> None:
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    # node-1 was seen holding both workers: it can hold the job without node-0.
    steady = replace(STEADY, quarantine=Quarantine(held={"node-0": 1, "node-1": 2}))
    first = lost(worker(0))
    p = manage(replace(steady, found=(first,), failed=frozenset({first.failure.uid})),
               seen(), st)
    assert not [t for t in p.todo if isinstance(t, Note) and t.event == "node.quarantined"]
    # Its replacement is lost with the same node too: quarantined, the next one kept off it.
    again = worker(0, 2, node="node-0")
    f = lost(again)
    pods = {**PODS, f.failure.pod: again}
    c = replace(p.core, found=(f,), failed=p.core.failed | {f.failure.uid})
    q = manage(c, seen(pods, wall=WALL + 10), st)
    said = [t for t in q.todo if isinstance(t, Note) and t.event == "node.quarantined"]
    assert len(said) == 1 and said[0].k8s is not None
    assert said[0].k8s.reason == "NodeQuarantined"
    assert said[0].k8s.note.startswith("node node-0: 2 failures of the job's workers there "
                                       "pointed at the node"), said[0].k8s.note
    creates = [t for t in q.todo if isinstance(t, CreateWorker)]
    assert creates and all("node-0" in t.lost_nodes for t in creates), creates
    assert q.core.quarantine.until == {"node-0": WALL + 60}
    saved = [t for t in q.todo if isinstance(t, SaveState)]
    assert saved and saved[-1].state["quarantined"] == {"node-0": WALL + 60}
    # After the TTL: released, said, saved without it.
    r = manage(replace(q.core, found=()), seen(pods, wall=WALL + 61), st)
    assert [t.event for t in r.todo if isinstance(t, Note)] == ["node.released"]
    assert r.core.quarantine.until == {}
    assert "quarantined" not in next(t for t in r.todo if isinstance(t, SaveState)).state


def test_core_spares_a_node_the_job_cannot_do_without_and_says_why() -> None:
    """The same two losses, but node-1 was only seen holding one worker: the job of two could
    not reach its size without node-0. node-2, Ready and alike, never held one of the job's
    workers (the template's selectors may keep them off it): it counts none."""
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    a, b = lost(worker(0)), lost(worker(1, node="node-0"))
    nodes = {n: shapes.node(n) for n in ("node-0", "node-1", "node-2")}
    p = manage(replace(STEADY, found=(a, b), failed=frozenset({a.failure.uid, b.failure.uid})),
               seen(nodes=nodes), st)
    (spared,) = [t for t in p.todo if isinstance(t, Note) and t.event.startswith("node.quar")]
    assert (spared.event, spared.fields["node"], spared.fields["can_hold"],
            spared.fields["need"]) == ("node.quarantine_spared", "node-0", 1, 2)
    assert p.core.quarantine.until == {}


@pytest.mark.parametrize(("back_s", "quarantined"), [
    pytest.param(10.4, False, id="NotReady 10 s after the API server's return (soak seed 12)"),
    pytest.param(60.0, False, id="at the end of the settle window"),
    pytest.param(61.0, True, id="past it: the node's own loss"),
    pytest.param(None, True, id="no outage"),
])
def test_a_node_lost_right_after_an_api_outage_is_not_the_nodes_evidence(
        back_s: float | None, quarantined: bool) -> None:
    """Both workers of node-0 lost with it in one pass (the shipped threshold is 2): after a
    3-minute API outage the node controller marks a node NotReady whose Lease it could not
    see renewed; within the settle window that loss is not counted against the node. The
    workers are replaced either way."""
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    steady = replace(STEADY, quarantine=Quarantine(held={"node-0": 2, "node-1": 2}))
    a, b = lost(worker(0, node="node-0")), lost(worker(1, node="node-0"))
    p = manage(replace(steady, found=(a, b), failed=frozenset({a.failure.uid, b.failure.uid})),
               seen(api_back_at=None if back_s is None else NOW - back_s), st)
    assert (p.core.quarantine.until != {}) is quarantined
    assert len([t for t in p.todo if isinstance(t, CreateWorker)]) == 2


STUCK_DETAIL = "process 8 (rank 1): its main thread has not moved for 21s"


@pytest.mark.parametrize(("cause", "code", "stuck", "expected"), [
    pytest.param(Cause.NODE_NOT_READY, None, False, Kind.LOST, id="lost with its node"),
    pytest.param(Cause.EXIT_CODE, 137, False, Kind.EXIT, id="an exit, read with its code"),
    pytest.param(Cause.HUNG, None, False, Kind.HUNG, id="found silent"),
    pytest.param(Cause.HUNG, None, True, None, id="a stuck main thread: the script's"),
    pytest.param(Cause.POD_DELETED, None, False, None, id="deleted by someone else"),
    pytest.param(Cause.EVICTED, None, False, None, id="evicted"),
    pytest.param(Cause.PREEMPTED, None, False, None, id="preempted"),
    pytest.param(Cause.POD_FORCE_DELETED, None, False, None, id="force-deleted"),
])
def test_what_the_quarantine_reads_of_a_failure(cause: Cause, code: int | None, stuck: bool,
                                                expected: Kind | None) -> None:
    p = worker(1, 3, node="node-0")
    f = Failed(Failure(cause, p["metadata"]["name"], p["metadata"]["uid"], "node-0", code),
               p, NOW)
    signs = quarantine_signs([f], {}, frozenset({f.failure.pod} if stuck else ()), JOB)
    assert signs == ([] if expected is None else [
        Sign(expected, "node-0", p["metadata"]["uid"], 1, code)])


@pytest.mark.parametrize(("why", "counted"), [
    pytest.param("NodeCondition", True, id="a node-problem condition: the node's"),
    pytest.param("Evicted", False, id="a drain: someone else's decision"),
    pytest.param("NodeCordoned", False, id="a cordon: someone else's decision"),
])
def test_a_worker_leaving_counts_only_for_a_node_condition(why: str, counted: bool) -> None:
    leaving = {"w": Leaving(2, "uid-w", "node-0", WALL, why)}
    assert quarantine_signs([], leaving, frozenset(), JOB) == (
        [Sign(Kind.CONDITION, "node-0", "uid-w", 2)] if counted else [])


def _pending_kept_off_node_0(since: str) -> tuple[dict, Memory]:
    """Slot 0's replacement, kept off a quarantined node-0 and Unschedulable since `since`;
    node-0 was seen holding one of the job's workers (it could take it), node-1 two (on paper
    the job fits without node-0)."""
    pending = worker(0, 2)
    pending["spec"].pop("nodeName")
    pending["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": not_on(["node-0"])}]}}}
    pending["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "lastTransitionTime": since}]}
    pods = {pod_name(JOB, 1, 1): worker(1), pending["metadata"]["name"]: pending}
    fl = fleet.initial(2)
    fl = replace(fl, slots={**fl.slots, 0: replace(fl.slots[0], incarnation=2)})
    q = Quarantine(until={"node-0": WALL + 50}, held={"node-0": 1, "node-1": 2})
    return pods, replace(STEADY, fleet=fl, saved=fl, quarantine=q, saved_quarantine=q.until)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_replacement_kept_off_a_quarantined_node_waits_a_moment_then_the_node_is_lifted(
        ) -> None:
    """Unschedulable for less than STARVED_S: not deleted as a stale exclusion (it would be
    created again kept off the same node, over and over). Past it, with nowhere else to go,
    the quarantine is lifted early (said, an Event) and the pod created again without it:
    the job is never kept below its size by a quarantine (issue 40's stock tour: a scale-out
    to 3 stayed Pending for the hour)."""
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    pods, c = _pending_kept_off_node_0(_iso(WALL - STARVED_S + 2))
    held = manage(c, seen(pods), st)
    assert not [t for t in held.todo if isinstance(t, DeletePod)], held.todo
    assert held.core.quarantine.until == {"node-0": WALL + 50}
    later = seen(pods, wall=WALL + 2)
    lifted = manage(c, later, st)
    (said,) = [t for t in lifted.todo if isinstance(t, Note) and t.event.startswith("node.q")]
    assert (said.event, said.fields["node"], said.k8s and said.k8s.reason) == (
        "node.quarantine_lifted", "node-0", "NodeQuarantineLifted")
    assert lifted.core.quarantine.until == {}
    assert [t.name for t in lifted.todo if isinstance(t, DeletePod)] == [
        pod_name(JOB, 0, 2)], "created again without node-0"


def test_a_pending_pod_without_a_time_is_not_starved() -> None:
    """A condition whose time cannot be read never lifts a quarantine: the end does."""
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    pods, c = _pending_kept_off_node_0("")
    assert manage(c, seen(pods, wall=WALL + 40), st).core.quarantine.until == {
        "node-0": WALL + 50}
    over = manage(c, seen(pods, wall=WALL + 51), st)
    assert [t.name for t in over.todo if isinstance(t, DeletePod)] == [
        pod_name(JOB, 0, 2)], "the quarantine over: created again without it"


@pytest.mark.parametrize(("present", "expected"), [
    pytest.param({"h1", "h2"}, ("n2",),
                 id="a frozen node: its kubelet could not remove the hung pods: quarantined"),
    pytest.param({"h2"}, (),
                 id="one hung pod gone at once (SIGSTOP on a healthy node): one sign left"),
    pytest.param(set(), (),
                 id="both gone before the node went down: processes that hung alone, then an "
                    "unrelated node fault"),
])
def test_a_hang_counts_only_while_its_pod_is_still_there(present: set[str],
                                                         expected: tuple[str, ...]) -> None:
    """The issue's frozen node against two SIGSTOPs on a healthy node whose node goes down
    later (a frozen process, then a silent node in the tours): the pods the supervisor deleted
    are gone within seconds where the kubelet is alive."""
    q = step(Quarantine(), [sign(HUNG, "n2", 0, uid="h1"), sign(HUNG, "n2", 1, uid="h2")], 0, S,
             usable=NODES, placed=ROOM, need=4, present={"h1", "h2"}).q
    q = step(q, [], 10, S, usable=NODES, placed=ROOM, need=4, present=present).q
    ch = step(q, [], 45, S, usable=NODES, placed=ROOM, need=4, down={"n2"}, present=present)
    assert tuple(n for n, _ in ch.started) == expected


@pytest.mark.parametrize(("until", "need", "starved", "usable", "expected"), [
    pytest.param({"n1": 50.0}, 4, False, NODES, ((), {"n1": 50.0}),
                 id="n2 and n3 hold the four the job needs: kept"),
    pytest.param({"n1": 50.0}, 5, False, NODES, ((("n1", 4, 5),), {}),
                 id="the job grew to five: n2 and n3 hold four: lifted"),
    pytest.param({"n1": 50.0, "n2": 30.0}, 3, False, NODES, ((("n2", 2, 3),), {"n1": 50.0}),
                 id="two quarantined, one short: the one ending soonest goes, one per pass"),
    pytest.param({"n1": 50.0}, 4, True, NODES, ((("n1", 4, 4),), {}),
                 id="room on paper, but a worker found no node for a while: lifted"),
    pytest.param({"n1": 50.0}, 5, True, ("n2", "n3"), ((), {"n1": 50.0}),
                 id="n1 is down or cordoned: lifting it would place nothing"),
])
def test_a_quarantine_the_job_is_short_of_is_lifted(
        until: dict[str, float], need: int, starved: bool, usable: tuple[str, ...],
        expected: tuple) -> None:
    ch = step(Quarantine(until=until, held=ROOM), [], 10, S, usable=usable, need=need,
              starved=starved)
    assert (ch.lifted, dict(ch.q.until)) == expected


def test_a_starved_job_spares_a_node_at_the_threshold() -> None:
    ch = step(Quarantine(held=ROOM), [sign(LOST, "n1"), sign(LOST, "n1", 1)], 0, S,
              usable=NODES, need=2, starved=True)
    assert (ch.spared, dict(ch.q.until)) == ((("n1", 4, 2),), {})
