"""quarantine.step: a node where workers of the job keep failing gets none for a while; and
core.manage keeping new workers off it and saying so."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor import fleet
from supervisor.actuator import DeletePod, SaveState
from supervisor.classify import Cause, Failure
from supervisor.core import CreateWorker, manage
from supervisor.plan import Failed, Note
from supervisor.quarantine import Quarantine, Settings, step
from supervisor.workers import not_on, pod_name
from tests.unit.test_core import JOB, NOW, PODS, STEADY, WALL, died, exited, seen, worker
from tests.unit.test_core import settings as core_settings

S = Settings(failures=2, window_s=100.0, ttl_s=50.0)
EXIT, HUNG, LOST = Cause.EXIT_CODE, Cause.HUNG, Cause.NODE_NOT_READY


NODES = ("n1", "n2", "n3")


def run(events: list[tuple[float, list[tuple[Cause, str | None]]]],
        s: Settings = S) -> list[tuple[float, tuple, tuple, dict[str, float]]]:
    """Feed failures at times; return (time, started, ended, until) after each."""
    q, out = Quarantine(), []
    for t, failures in events:
        ch = step(q, failures, t, s, NODES)
        q = ch.q
        out.append((t, ch.started, ch.ended, dict(q.until)))
    return out


@pytest.mark.parametrize(("events", "expected"), [
    pytest.param([(0, [(EXIT, "n1")]), (10, [(HUNG, "n1")])],
                 [(0, (), (), {}), (10, (("n1", 2),), (), {"n1": 60.0})],
                 id="two failures within the window"),
    pytest.param([(0, [(EXIT, "n1")]), (150, [(EXIT, "n1")])],
                 [(0, (), (), {}), (150, (), (), {})],
                 id="the first slid out of the window"),
    pytest.param([(0, [(EXIT, "n1"), (EXIT, "n2")])], [(0, (), (), {})],
                 id="one each on two nodes"),
    pytest.param([(0, [(Cause.POD_DELETED, "n1"), (Cause.EVICTED, "n1"),
                       (Cause.PREEMPTED, "n1"), (Cause.POD_FORCE_DELETED, "n1")])],
                 [(0, (), (), {})], id="someone else's decisions do not count"),
    pytest.param([(0, [(LOST, "n1"), (EXIT, None)]), (1, [(LOST, "n1")])],
                 [(0, (), (), {}), (1, (("n1", 2),), (), {"n1": 51.0})],
                 id="the node's own loss counts, a failure without a node does not"),
    pytest.param([(0, [(EXIT, "n1"), (EXIT, "n1")]), (30, []), (50, []), (51, [])],
                 [(0, (("n1", 2),), (), {"n1": 50.0}), (30, (), (), {"n1": 50.0}),
                  (50, (), ("n1",), {}), (51, (), (), {})],
                 id="it ends by itself after the TTL"),
    pytest.param([(0, [(EXIT, "n1"), (EXIT, "n1")]), (10, [(EXIT, "n1")]), (60, [(EXIT, "n1")])],
                 [(0, (("n1", 2),), (), {"n1": 50.0}), (10, (), (), {"n1": 50.0}),
                  (60, (("n1", 2),), ("n1",), {"n1": 110.0})],
                 id="failures while quarantined count for the next"),
])
def test_quarantine(events: list, expected: list) -> None:
    assert run(events) == expected


def test_a_node_is_spared_while_no_other_could_take_a_worker() -> None:
    """Its slots would stay Pending instead of retrying where they can run: said once, and
    counted again from zero."""
    ch = step(Quarantine(), [(EXIT, "n1")] * 2, 0, S, ["n1"])
    assert (ch.started, ch.spared, ch.q.until) == ((), ("n1",), {})
    assert step(ch.q, [], 1, S, ["n1"]).spared == ()
    # n2 is quarantined already: n1 is spared too; with n3 usable, n1 goes.
    q = Quarantine(until={"n2": 100.0})
    assert step(q, [(EXIT, "n1")] * 2, 0, S, ["n1", "n2"]).spared == ("n1",)
    assert step(q, [(EXIT, "n1")] * 2, 0, S, ["n1", "n2", "n3"]).q.until == {
        "n1": 50.0, "n2": 100.0}


def test_off() -> None:
    off = Settings(failures=0)
    assert run([(0, [(EXIT, "n1"), (EXIT, "n1"), (EXIT, "n1")])], off) == [(0, (), (), {})]
    q = step(Quarantine(), [(EXIT, "n1")] * 2, 0, S, NODES).q
    ch = step(q, [], 1, off)
    assert ch.q == Quarantine() and ch.ended == ("n1",), "turned off: released"


def test_nothing_new_keeps_the_same_object() -> None:
    q = Quarantine()
    assert step(q, [], 5, S).q is q
    q = step(q, [(EXIT, "n1")], 5, S).q
    assert step(q, [], 6, S).q is q


def test_core_keeps_new_workers_off_a_quarantined_node_and_says_so() -> None:
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    first = died(0)  # on node-0
    pods = {**PODS, first.failure.pod: first.pod}
    p = manage(replace(STEADY, found=(first,), failed=frozenset({first.failure.uid})),
               seen(pods), st)
    assert not [t for t in p.todo if isinstance(t, Note) and t.event == "node.quarantined"]
    # Its replacement fails on the same node: quarantined, and the next one is kept off it.
    again = exited(worker(0, 2, node="node-0"))
    f = Failure(Cause.EXIT_CODE, again["metadata"]["name"], again["metadata"]["uid"], "node-0",
                137, "worker", "container worker exited with 137")
    c = replace(p.core, found=(Failed(f, again, NOW),), failed=p.core.failed | {f.uid})
    q = manage(c, seen({**pods, f.pod: again}, wall=WALL + 10), st)
    said = [t for t in q.todo if isinstance(t, Note) and t.event == "node.quarantined"]
    assert len(said) == 1 and said[0].k8s is not None
    assert said[0].k8s.reason == "NodeQuarantined" and "node node-0: 2 workers" in said[0].k8s.note
    creates = [t for t in q.todo if isinstance(t, CreateWorker)]
    assert creates and all("node-0" in t.lost_nodes for t in creates), creates
    assert q.core.quarantine.until == {"node-0": WALL + 60}
    saved = [t for t in q.todo if isinstance(t, SaveState)]
    assert saved and saved[-1].state["quarantined"] == {"node-0": WALL + 60}
    # After the TTL: released, said, saved without it.
    r = manage(replace(q.core, found=()), seen({**pods, f.pod: again}, wall=WALL + 61), st)
    assert [t.event for t in r.todo if isinstance(t, Note)] == ["node.released"]
    assert r.core.quarantine.until == {}
    assert "quarantined" not in next(t for t in r.todo if isinstance(t, SaveState)).state


def test_a_replacement_with_nowhere_to_go_but_a_quarantined_node_waits() -> None:
    """Kept off a quarantined node and unschedulable: not deleted as a stale exclusion (it
    would be created again kept off the same node, over and over) until the quarantine ends."""
    st = replace(core_settings(), quarantine=Settings(failures=2, window_s=100, ttl_s=50))
    pending = worker(0, 2)
    pending["spec"].pop("nodeName")
    pending["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": not_on(["node-0"])}]}}}
    pending["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    pods = {pod_name(JOB, 1, 1): worker(1), pending["metadata"]["name"]: pending}
    fl = fleet.initial(2)
    fl = replace(fl, slots={**fl.slots, 0: replace(fl.slots[0], incarnation=2)})
    q = Quarantine(until={"node-0": WALL + 50})
    c = replace(STEADY, fleet=fl, saved=fl, quarantine=q, saved_quarantine=q.until)
    held = manage(c, seen(pods), st)
    assert not [t for t in held.todo if isinstance(t, DeletePod)], held.todo
    over = manage(c, seen(pods, wall=WALL + 51), st)
    assert [t.name for t in over.todo if isinstance(t, DeletePod)] == [
        pending["metadata"]["name"]], "the quarantine over: created again without it"
