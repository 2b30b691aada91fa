"""incidents.py: phases of each incident from the passes' decisions (the notes and script
core.manage emits), the captured pod shapes at each stage, and the progress."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from supervisor.decide import incidents, script
from supervisor.decide.fleet import Create
from supervisor.decide.hostlist import HostMode
from supervisor.decide.incidents import Book, Tick
from supervisor.decide.plan import Note
from supervisor.decide.progress import Progress
from supervisor.workers import LABEL_INCARNATION, LABEL_SLOT
from tests.unit.shapes import pod as shaped_pod

T0 = 1.8e9
JOB = "job1"


def pod(slot: int, inc: int, stage: str, ip: str) -> dict[str, Any]:
    """A worker pod at `stage` (pending, scheduled, running), from the captured shape."""
    p = shaped_pod(f"{JOB}-w{slot}-{inc}", ip=ip if stage == "running" else None)
    p["metadata"]["labels"].update({LABEL_SLOT: str(slot), LABEL_INCARNATION: str(inc)})
    if stage != "running":
        p["status"]["phase"] = "Pending"
        for c in p["status"]["containerStatuses"]:
            c["state"] = {"waiting": {"reason": "ContainerCreating"}}
    if stage == "pending":
        del p["spec"]["nodeName"]
        p["status"].pop("containerStatuses")
    return p


def failed(name: str, cause: str = "ExitCode", slot: int = 1) -> Note:
    """The note failures.py writes for a failure decided (fields as there)."""
    return Note("warning", "worker.failed", {
        "pod": name, "slot": slot, "node": "node-a", "cause": cause, "exit_code": 137,
        "container": "worker", "detail": "", "rule": "default", "action": "Restart",
        "refused": None, "delay_s": 0.0, "counted": True, "restarts_used": 1,
        "restart_limit": 5})


def create(slot: int, inc: int) -> script.CreateWorker:
    return script.CreateWorker(Create(slot, inc, f"{JOB}-w{slot}-{inc}", "node-a"), (), ())


class Job:
    """A job of `size` processes, one per worker, passes at half-second steps."""

    def __init__(self, size: int = 2) -> None:
        self.book, self.t = Book(), T0
        self.pods: dict[str, dict[str, Any]] = {
            f"{JOB}-w{i}-1": pod(i, 1, "running", f"10.1.0.{10 + i}") for i in range(size)}
        self.joined = {f"10.1.0.{10 + i}" for i in range(size)}
        self.progress = Progress(step=100, desired=size, world=size, grew_at=T0, resets=1,
                                 at=T0, since=T0 - 100)
        self.reached: list[tuple[int, str]] = []

    def tick(self, *todo: object, grew: bool = False, world: int | None = None,
             reset: bool = False, desired: int | None = None, dt: float = 0.5) -> Book:
        self.t += dt
        p = self.progress
        self.progress = replace(
            p, at=self.t, resets=p.resets + reset, desired=p.desired if desired is None
            else desired, world=p.world if world is None else world,
            grew_at=self.t if grew else p.grew_at, step=p.step + grew, redone=p.redone,
            lost_ws=p.lost_ws + (0.0 if grew else dt * p.desired))
        seen = {n: incidents.pod_seen(x, HostMode.POD_IP, JOB) for n, x in self.pods.items()}
        fenced = frozenset(h for x in todo if isinstance(x, script.Fence) for h in x.hosts)
        created = tuple((x.create.slot, x.create.name) for x in todo
                        if isinstance(x, script.CreateWorker))
        self.book, reached = incidents.advance(self.book, Tick(
            self.t, incidents.opened_in(todo), fenced, created, seen, frozenset(self.joined),
            self.progress))
        self.reached += [(i.id, ph) for i, ph in reached]
        return self.book

    def seconds(self, i: int = 0) -> dict[str, float]:
        return incidents.phase_seconds(self.book.incidents[i])


def replaced(j: Job, slot: int, old_ip: str, new_ip: str) -> None:
    """The replacement of `slot`: created (done by the caller), scheduled, started, joined."""
    name = f"{JOB}-w{slot}-2"
    j.pods[name] = pod(slot, 2, "pending", new_ip)
    j.tick(grew=True)
    j.pods[name] = pod(slot, 2, "scheduled", new_ip)
    j.tick(grew=True)
    j.pods[name] = pod(slot, 2, "running", new_ip)
    j.tick(grew=True, dt=2.0)
    j.joined.add(new_ip)
    j.tick(grew=True, reset=True, world=2, dt=1.0)  # it joined: the world regroups
    j.tick(grew=True)


def test_a_killed_worker_is_fenced_the_survivors_resume_and_the_replacement_joins() -> None:
    j = Job()
    j.joined.discard("10.1.0.11")
    j.tick(failed(f"{JOB}-w1-1"), script.Fence(frozenset({"10.1.0.11"})), create(1, 2))
    j.tick()
    j.tick(grew=True, reset=True, world=1)  # the survivor trains alone
    assert j.book.incidents[0].open
    replaced(j, 1, "10.1.0.11", "10.1.0.21")
    inc = j.book.incidents[0]
    assert (inc.cause, inc.kind, inc.slots, inc.label()) == ("ExitCode", "failure", (1,),
                                                               "ExitCode w1")
    assert not inc.open
    assert list(j.seconds()) == list(incidents.PHASES)  # every phase, in order
    s = j.seconds()
    assert (s["fenced"], s["created"], s["resumed"]) == (0.0, 0.0, 1.0)
    assert s["scheduled"] < s["started"] < s["joined"] == s["full"]
    assert inc.lost_ws == pytest.approx(0.5 * 2)  # a pass without a step after it, 2 asked
    assert sorted(ph for _, ph in j.reached) == sorted(incidents.PHASES)  # each once


def test_a_force_delete_and_a_hang_are_one_incident_each_whatever_follows() -> None:
    j = Job(3)
    hung = Note("warning", "worker.hung", {"pod": f"{JOB}-w2-1", "host": "10.1.0.12",
                                           "pid": 7, "silent_s": 3.1, "detail": "silent"})
    j.tick(hung)
    j.tick(failed(f"{JOB}-w2-1", "Hung", 2), script.Fence(frozenset({"10.1.0.12"})),
           create(2, 2))
    del j.pods[f"{JOB}-w0-1"]  # force-deleted: gone from the view as it is decided
    j.tick(failed(f"{JOB}-w0-1", "PodForceDeleted", 0), script.Fence(frozenset({"10.1.0.10"})))
    assert [(x.cause, x.pods, x.slots) for x in j.book.incidents] == [
        ("Hung", (f"{JOB}-w2-1",), (2,)), ("PodForceDeleted", (f"{JOB}-w0-1",), (0,))]
    hung_s = j.seconds(0)
    assert hung_s["fenced"] == 0.5 and hung_s["created"] == 0.5  # detected a pass earlier
    assert "created" not in j.book.incidents[1].phases  # not the other incident's pod


def test_a_frozen_node_fails_its_workers_as_one_incident_and_overlaps_end_together() -> None:
    j = Job(3)
    gone = [failed(f"{JOB}-w{i}-1", "NodeNotReady", i) for i in (0, 1)]
    j.tick(*gone, script.Fence(frozenset({"10.1.0.10", "10.1.0.11"})), create(0, 2), create(1, 2))
    (inc,) = j.book.incidents
    assert inc.slots == (0, 1) and inc.label() == "NodeNotReady w0 w1"
    j.tick(grew=True, reset=True, world=1)
    # a fault in the middle of the recovery: the last survivor's replacement... another kill
    j.tick(failed(f"{JOB}-w2-1", "ExitCode", 2), script.Fence(frozenset({"10.1.0.12"})))
    for slot, ip in ((0, "10.1.0.20"), (1, "10.1.0.21")):
        j.pods[f"{JOB}-w{slot}-2"] = pod(slot, 2, "running", ip)
        j.joined.add(ip)
    j.tick(grew=True, reset=True, world=2)
    assert all(x.open for x in j.book.incidents)  # 2 of 3: not full yet
    j.tick(grew=True, reset=True, world=3)
    first, second = j.book.incidents
    assert not first.open and not second.open
    assert first.phases["full"] == second.phases["full"]
    assert "joined" in first.phases and "created" not in second.phases


def test_an_eviction_is_a_leave_with_its_replacement_created_at_once() -> None:
    j = Job()
    leaving = Note("info", "worker.leaving", {
        "pod": f"{JOB}-w0-1", "node": "node-a", "why": "Evicted", "detail": "eviction",
        "replacement": f"{JOB}-w0-2"})
    j.tick(leaving, create(0, 2), grew=True)
    j.tick(grew=True)
    j.tick(grew=True, reset=True, world=1)  # Horovod let it go at its next host check
    replaced(j, 0, "10.1.0.10", "10.1.0.20")
    inc = j.book.incidents[0]
    assert (inc.kind, inc.cause) == ("leave", "Evicted")
    assert "fenced" not in inc.phases  # nothing to fence: it left
    s = j.seconds()
    assert s["created"] == 0.0 and s["resumed"] == 1.0 and not inc.open
    assert inc.lost_ws == 0.0  # it never stopped


@pytest.mark.parametrize(("to", "cause"), [(3, "ScaleOut"), (1, "ScaleIn")])
def test_a_scale_waits_for_the_world_of_the_new_size(to: int, cause: str) -> None:
    j = Job()
    scaled = Note("info", "scale.applied", {"workers_from": 2, "workers_to": to})
    j.tick(scaled, *([create(2, 1)] if to > 2 else []), desired=to, grew=True)
    (inc,) = j.book.incidents
    assert (inc.kind, inc.cause) == ("scale", cause)
    assert ("created" in inc.phases) == (to > 2)
    if to > 2:
        j.pods[f"{JOB}-w2-1"] = pod(2, 1, "running", "10.1.0.30")
        j.joined.add("10.1.0.30")
    j.tick(grew=True, world=2)
    assert j.book.incidents[0].open
    j.tick(grew=True, reset=True, world=to)
    assert not j.book.incidents[0].open and j.seconds()["full"] == 1.0


def test_a_horovodrun_restart_is_an_incident_too() -> None:
    j = Job()
    j.tick(script.RestartHorovodrun("TrainingStalled", "no progress", 1))
    j.tick(dt=5.0)
    j.tick(grew=True, reset=True)
    inc = j.book.incidents[0]
    assert (inc.kind, inc.cause, inc.label()) == ("restart", "TrainingStalled", "TrainingStalled")
    assert j.seconds()["resumed"] == 5.5 and not inc.open


def test_the_book_keeps_the_newest_and_round_trips() -> None:
    j = Job()
    for k in range(incidents.KEEP + 5):
        j.tick(failed(f"{JOB}-w1-{k + 1}"))
    assert len(j.book.incidents) == incidents.KEEP
    assert j.book.incidents[-1].id == incidents.KEEP + 5
    back = incidents.from_list(copy.deepcopy(incidents.to_list(j.book)))
    assert [x.id for x in back.incidents] == [x.id for x in j.book.incidents]
    assert not any(x.open for x in back.incidents)  # a new supervisor cannot follow them
    assert back.next_id == incidents.KEEP + 6
    with pytest.raises(ValueError, match="incidents"):
        incidents.from_list([{"id": 1}])
