"""core.manage: one pass of decisions, from the loop's memory and what it sees to the memory of
the next pass and the script to carry out, in order.

Pods and nodes are the captured shapes (tests/unit/shapes) with the supervisor's labels;
heartbeats are the hook's Beat records. Each row is one pass; the script is compared by kind
(and what matters of each item), in order, because the order is part of the contract: a
failed host is fenced and its ssh clients killed before anything else is done for it, the
fleet's state is saved before its replacements are created.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from supervisor.decide import fleet, memory, plan
from supervisor.decide.beats import Beat, Driver
from supervisor.decide.classify import Cause, ClassifySettings, Failure
from supervisor.decide.core import manage
from supervisor.decide.failures import Failed
from supervisor.decide.hang import HangSettings
from supervisor.decide.hostlist import HostMode, Rendered
from supervisor.decide.memory import (
    HUNG_NODE_AVOID_S,
    CreateWorker,
    FailJob,
    Fence,
    KillSsh,
    Memory,
    RestartHorovodrun,
    Seen,
)
from supervisor.decide.plan import Note
from supervisor.decide.plan import Settings as PlanSettings
from supervisor.decide.policy import Action, Policy, Rule
from supervisor.decide.quarantine import Quarantine
from supervisor.decide.regroup import Pending
from supervisor.decide.script import DeletePod, KeepMinAvailable, SaveState
from supervisor.model import ExitCode
from supervisor.observe import Unusable
from supervisor.workers import LABEL_INCARNATION, LABEL_JOB, LABEL_ROLE, LABEL_SLOT, pod_name
from tests.unit import shapes

JOB = "job1"
NOW, WALL = 500.0, 1_700_000_000.0
STALL_S = 60.0


def settings(policy: Policy | None = None, restarts: int = 2,
             disruption: float | None = None) -> memory.Settings:
    return memory.Settings(
        PlanSettings(JOB, HostMode.POD_IP, min_np=1, max_np=4, slots_per_worker=1,
                     scale_out_timeout_s=300.0, scale_in_timeout_s=60.0),
        policy or Policy(), ClassifySettings(node_grace_s=0.0),
        HangSettings(silence_s=3.0, stall_s=STALL_S),
        disruption, restarts, STALL_S)


S = settings()


def worker(slot: int, inc: int = 1, node: str | None = None, **status: Any) -> dict[str, Any]:
    name = pod_name(JOB, slot, inc)
    p = shapes.pod(name, ip=ip(slot), node=node or f"node-{slot}", **status)
    p["metadata"]["labels"] = {LABEL_JOB: JOB, LABEL_ROLE: "worker", LABEL_SLOT: str(slot),
                               LABEL_INCARNATION: str(inc)}
    return p


def ip(slot: int) -> str:
    return f"10.1.0.{10 + slot}"


def exited(p: dict[str, Any], code: int = 137) -> dict[str, Any]:
    """`p` with its container ended (the kubelet's report of an OOM kill, say)."""
    p = copy.deepcopy(p)
    p["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": code}}
    return p


W0, W1 = worker(0), worker(1)
PODS = {pod_name(JOB, 0, 1): W0, pod_name(JOB, 1, 1): W1}
NODES = {"node-0": shapes.node("node-0"), "node-1": shapes.node("node-1")}
OWNERS = {ip(0): "uid-" + pod_name(JOB, 0, 1), ip(1): "uid-" + pod_name(JOB, 1, 1)}
LISTED = {ip(0): pod_name(JOB, 0, 1), ip(1): pod_name(JOB, 1, 1)}
TWO = fleet.initial(2)
# The loop's memory once both workers of a two-worker job run and their state is saved.
# (It has seen one worker on each node: what the quarantine knows of their room.)
STEADY = Memory(fleet=TWO, saved=TWO, synced_at=NOW - 100, scanned=True,
              listed_since={h: NOW - 100 for h in LISTED},
              quarantine=Quarantine(held={"node-0": 1, "node-1": 1}))


def beat(slot: int, *, progress_at: float | None = NOW - 1, **kw: Any) -> Beat:
    return Beat(**{"sender": f"s{slot}", "host": ip(slot), "pid": 100 + slot,
                   "local_rank": 0, "first_seen": NOW - 90, "last_seen": NOW - 0.5,
                   "progress_at": progress_at, **kw})


BEATS = (beat(0), beat(1))
WORLD = Driver(ok=True, at=NOW - 90, world=frozenset(LISTED), world_seq=1, world_at=NOW - 90)


def seen(pods: dict[str, Any] | None = None, **kw: Any) -> Seen:
    pods = PODS if pods is None else pods
    base: dict[str, Any] = {
        "nodes": NODES, "memory": {}, "lease_ages": None, "lease_stale": frozenset(),
        "first_owner": OWNERS, "published": "".join(f"{h}:1\n" for h in LISTED),
        "view_render": None, "listed_hosts": LISTED, "hooked": True, "running": True,
        "stopping": False, "started_at": NOW - 95, "beats": BEATS, "driver": WORLD,
        "ssh_clients": {}, "now": NOW, "wall": WALL}
    return Seen(pods=pods, **{**base, **kw})


def died(slot: int = 0, code: int = 137) -> Failed:
    """Worker `slot`'s container exited with `code`, classified on its pod event."""
    p = exited(worker(slot), code)
    f = Failure(Cause.EXIT_CODE, p["metadata"]["name"], p["metadata"]["uid"],
                p["spec"]["nodeName"], code, "worker", f"container worker exited with {code}")
    return Failed(f, p, NOW - 0.1)


def script(p: memory.Pass) -> list[Any]:
    """The script as (kind, what matters) pairs."""
    out: list[Any] = []
    for t in p.todo:
        if isinstance(t, Note):
            out.append(("say", t.event))
        elif isinstance(t, Fence):
            out.append(("fence", sorted(t.hosts)))
        elif isinstance(t, KillSsh):
            out.append(("kill-ssh", dict(t.pods)))
        elif isinstance(t, DeletePod):
            out.append(("delete", t.name, t.grace_s))
        elif isinstance(t, SaveState):
            out.append(("save",))
        elif isinstance(t, CreateWorker):
            out.append(("create", t.create.name))
        elif isinstance(t, RestartHorovodrun):
            out.append(("restart", t.reason, t.restart))
        elif isinstance(t, FailJob):
            out.append(("fail", t.code))
        elif isinstance(t, KeepMinAvailable):
            out.append(("budget", t.min_available))
    return out


def test_a_steady_job_asks_for_nothing() -> None:
    p = manage(STEADY, seen(), S)
    assert (p.todo, p.core) == ((), STEADY)


def test_a_dead_worker_is_fenced_then_decided_then_saved_then_replaced() -> None:
    x = died(0)
    pods = {**PODS, x.failure.pod: x.pod}
    p = manage(replace(STEADY, found=(x,), failed=frozenset({x.failure.uid})), seen(pods), S)
    w0 = pod_name(JOB, 0, 1)
    assert script(p) == [("fence", [ip(0)]), ("kill-ssh", {ip(0): w0}),
                         ("say", "worker.failed"), ("save",),
                         ("create", pod_name(JOB, 0, 2))]
    c = p.core
    assert c.found == () and c.fleet is not None and c.fleet.ledger.total == 1
    assert c.saved == c.fleet, "the state saved is the fleet the replacement comes from"
    assert c.expected == {pod_name(JOB, 0, 2): NOW}
    assert c.failed_at == {ip(0): NOW}
    assert c.regroup is not None and c.regroup.since == NOW, "it was in the driver's world"
    assert p.counts == (("ExitCode", "Restart"),)
    assert p.replace_from == {pod_name(JOB, 0, 2): NOW - 0.1}


def test_the_next_pass_on_the_same_picture_asks_for_nothing_new() -> None:
    x = died(0)
    pods = {**PODS, x.failure.pod: x.pod}
    first = manage(replace(STEADY, found=(x,), failed=frozenset({x.failure.uid})),
                   seen(pods), S)
    again = manage(first.core, seen(pods, now=NOW + 1), S)
    assert again.todo == (), "the replacement is expected, the state saved"
    assert again.core.fleet == first.core.fleet


@pytest.mark.parametrize(("owner", "hooked", "running", "expected"), [
    pytest.param("uid-" + pod_name(JOB, 0, 1), True, True, ["fence", "kill-ssh"],
                 id="its host was first published for this pod: fenced, ssh clients killed"),
    pytest.param("uid-another", True, True, [],
                 id="an IP the CNI gave another pod before: not this failure's to fence"),
    pytest.param("uid-" + pod_name(JOB, 0, 1), True, False, ["fence"],
                 id="no horovodrun: fenced, no ssh client to kill"),
    pytest.param("uid-" + pod_name(JOB, 0, 1), False, True, ["kill-ssh"],
                 id="no hook: no fence, the ssh clients killed"),
])
def test_which_failed_hosts_are_fenced(owner: str, hooked: bool, running: bool,
                                       expected: list[str]) -> None:
    x = died(0)
    p = manage(replace(STEADY, found=(x,)), seen(
        {**PODS, x.failure.pod: x.pod}, first_owner={**OWNERS, ip(0): owner}, hooked=hooked,
        running=running), S)
    assert [k[0] for k in script(p) if k[0] in ("fence", "kill-ssh")] == expected
    assert [k[0] for k in script(p)][-1] == "create", "replaced all the same"


def test_the_first_pass_after_sync_finds_workers_on_a_lost_node() -> None:
    """A node unreachable when the supervisor starts: its worker is lost (grace 0), force-deleted
    (it would stay Terminating forever) and replaced away from the node."""
    nodes = {**NODES, "node-0": shapes.node("node-0", "node_unreachable")}
    c = Memory(fleet=TWO, node_down={"node-0": NOW - 30})
    p = manage(c, seen(nodes=nodes, running=False, beats=(), driver=None), S)
    w0 = pod_name(JOB, 0, 1)
    assert script(p) == [("fence", [ip(0)]), ("delete", w0, 0), ("say", "worker.failed"),
                         ("save",), ("create", pod_name(JOB, 0, 2))]
    create = next(t for t in p.todo if isinstance(t, CreateWorker))
    assert create.lost_nodes == ("node-0",) and create.create.avoid_node == "node-0"
    assert p.core.synced_at == NOW and p.core.scanned
    assert "uid-" + w0 in p.core.failed


def test_nodes_down_together_are_held_not_lost() -> None:
    """Both nodes of the job down at once past the disruption threshold: the brake holds
    them; no worker fails, nothing is deleted."""
    down = {"node-0": NOW - 30, "node-1": NOW - 30}
    p = manage(replace(STEADY, node_down=down), seen(), settings(disruption=0.5))
    assert script(p) == [("say", "node.disruption")]
    assert p.core.braked == frozenset(down) and p.core.failed == frozenset()
    over = manage(replace(p.core, node_down={}), seen(now=NOW + 5), settings(disruption=0.5))
    assert script(over) == [("say", "node.disruption_over")]
    assert over.core.braked == frozenset()


@pytest.mark.parametrize(("api_back", "beats", "held"), [
    pytest.param(NOW - 14, BEATS, True,
                 id="down 14s after the API came back, its worker heartbeats: held"),
    pytest.param(NOW - 61, BEATS, False, id="long after the outage: a lost node"),
    pytest.param(None, BEATS, False, id="no outage seen: a lost node (a stopped kubelet)"),
    pytest.param(NOW - 14, (beat(1),), False, id="its worker silent: a lost node"),
])
def test_a_node_down_just_after_an_api_outage_is_held_while_its_workers_heartbeat(
        api_back: float | None, beats: tuple[Beat, ...], held: bool) -> None:
    """The node controller marks NotReady the nodes whose kubelets could not renew their
    Leases through an API server outage (seen on real nodes after kube-apiserver restarted:
    a job with both workers on that node lost both, and horovodrun gave up). While every
    worker on it heartbeats, within OUTAGE_SETTLE_S of the watch's return, nothing fails."""
    nodes = {**NODES, "node-0": shapes.node("node-0", "node_unreachable")}
    c = replace(STEADY, node_down={"node-0": NOW - 12})
    p = manage(c, seen(nodes=nodes, beats=beats, api_back_at=api_back), S)
    w0 = pod_name(JOB, 0, 1)
    if held:
        assert script(p) == [("say", "node.settling")]
        assert p.core.settling == {"node-0"} and p.core.failed == frozenset()
        back = manage(replace(p.core, node_down={}), seen(api_back_at=api_back), S)  # Ready
        assert script(back) == [("say", "node.settled")] and back.core.settling == frozenset()
    else:
        assert ("delete", w0, 0) in script(p) and "uid-" + w0 in p.core.failed
        assert p.core.settling == frozenset()


def test_a_silent_worker_on_a_held_node_that_the_listing_dropped_is_still_hung() -> None:
    """Seen in the soak (seed 1, 2026-11-29): kube-apiserver came back from a 3-minute outage,
    the node controller marked every node NotReady, and one of them (node-0) had just frozen.
    Both nodes down together: the brake holds their loss. The listing drops node-0's worker
    (its node is down and it does not heartbeat), so hang detection, which judged only listed
    hosts, no longer looked at it, while it was still in the driver's world and its peer
    waited for it in an allreduce: no step for 86 s (Gloo's timeout, then the brake's end and
    the node grace). A member of the world that blocks the others is Hung, listed or not."""
    down = {"node-0": NOW - 30, "node-1": NOW - 30}
    frozen = beat(0, last_seen=NOW - 29, progress_at=NOW - 29)
    waits = beat(1, wait_s=28.0, waiting="c", progress_at=NOW - 29)
    listed = {ip(1): pod_name(JOB, 1, 1)}  # node-0's worker dropped: NodeNotReady, silent
    c = replace(STEADY, node_down=down, braked=frozenset(down))
    p = manage(c, seen(beats=(frozen, waits), listed_hosts=listed,
                       published=f"{ip(1)}:1\n"), settings(disruption=0.5))
    w0 = pod_name(JOB, 0, 1)
    assert script(p)[:3] == [("say", "worker.hung"), ("fence", [ip(0)]),
                             ("kill-ssh", {ip(0): w0})], script(p)
    assert "uid-" + w0 in p.core.hung
    assert "uid-" + pod_name(JOB, 1, 1) not in p.core.failed, "the waiting peer is not judged"
    # Its node down but its processes heartbeating (a kubelet that has not reported since the
    # outage; the settling hold keeps such a worker): never Hung, listed or not.
    alive = beat(0, progress_at=NOW - 1)
    h = manage(c, seen(beats=(alive, waits), listed_hosts=listed,
                       published=f"{ip(1)}:1\n"), settings(disruption=0.5))
    assert ("say", "worker.hung") not in script(h) and "uid-" + w0 not in h.core.hung
    # Not a member of the world any more (the survivors reset without it): not judged.
    alone = replace(WORLD, world=frozenset({ip(1)}), world_seq=2)
    q = manage(c, seen(beats=(frozen, waits), listed_hosts=listed, driver=alone,
                       published=f"{ip(1)}:1\n"), settings(disruption=0.5))
    assert ("say", "worker.hung") not in script(q) and "uid-" + w0 not in q.core.hung


def test_a_silent_member_is_judged_while_the_discovery_file_is_withdrawn() -> None:
    """Seen in the soak (seed 1, 2026-11-30): kube-apiserver came back from a 3-minute outage
    and a node froze at once, while the launcher pod still could not reach the API (kube-proxy
    put its route back 50 s later). The discovery file had been withdrawn (the view stale), so
    no host was listed, and hang detection, which judged listed hosts, did not look at the
    frozen worker: its peer waited for it for 49.6 s, until the watches came back. The workers
    train on in the driver's world while the file is withdrawn: a silent member blocking them
    is Hung, fenced and its ssh clients killed (none of which needs the API)."""
    frozen = beat(0, last_seen=NOW - 4, progress_at=NOW - 4)
    waits = beat(1, wait_s=3.5, waiting="c", progress_at=NOW - 4)
    p = manage(STEADY, seen(beats=(frozen, waits), listed_hosts={}, published=None),
               settings())
    w0 = pod_name(JOB, 0, 1)
    assert script(p)[:3] == [("say", "worker.hung"), ("fence", [ip(0)]),
                             ("kill-ssh", {ip(0): w0})], script(p)
    assert "uid-" + pod_name(JOB, 1, 1) not in p.core.failed, "the waiting peer is not judged"
    # A published file that leaves the member out (scaled in, held back): not judged here.
    listed = {ip(1): pod_name(JOB, 1, 1)}
    q = manage(STEADY, seen(beats=(frozen, waits), listed_hosts=listed,
                            published=f"{ip(1)}:1\n"), settings())
    assert ("say", "worker.hung") not in script(q) and "uid-" + w0 not in q.core.hung
    for why in (Unusable.SCALING_IN, Unusable.DELETING, Unusable.SLOT_NOT_ACTIVE):
        out = Rendered((f"{ip(1)}:1",), listed, {w0: why})
        r = manage(STEADY, seen(beats=(frozen, waits), listed_hosts=listed, view_render=out,
                                published=f"{ip(1)}:1\n"), settings())
        assert ("say", "worker.hung") not in script(r), why
    # Both heartbeating while the file is withdrawn (an API outage, training goes on): nothing.
    healthy = manage(STEADY, seen(listed_hosts={}, published=None), settings())
    assert not healthy.core.hung and ("say", "worker.hung") not in script(healthy)
    # No horovodrun: nothing trains, nothing to judge.
    r = manage(STEADY, seen(beats=(frozen, waits), listed_hosts={}, published=None,
                            running=False), settings())
    assert ("say", "worker.hung") not in script(r)


def test_a_silent_member_left_out_as_not_ready_is_judged() -> None:
    """Seen in the soak (seed 12, 2026-12-02): a worker of three partitioned (iptables) was
    left out of the file 6.5 s after the cut, its pod NotReady (its readiness probe failed),
    never declared; its peers waited out Gloo's 60 s timeout, then Horovod's rendezvous waited
    for it for good (it was in the driver's world still). A member left out as not Ready whose
    silence blocks the others is Hung like a listed one; a not-Ready one that heartbeats is
    not, nor one that is no longer a member."""
    frozen = beat(0, last_seen=NOW - 4, progress_at=NOW - 4)
    waits = beat(1, wait_s=3.5, waiting="i", progress_at=NOW - 4)
    w0 = pod_name(JOB, 0, 1)
    listed = {ip(1): pod_name(JOB, 1, 1)}
    out = Rendered((f"{ip(1)}:1",), listed, {w0: Unusable.NOT_READY})

    def judged(*beats: Beat, driver: Driver = WORLD) -> memory.Pass:
        return manage(STEADY, seen(beats=beats, listed_hosts=listed, view_render=out,
                                   published=f"{ip(1)}:1\n", driver=driver), settings())

    p = judged(frozen, waits)
    assert script(p)[:3] == [("say", "worker.hung"), ("fence", [ip(0)]),
                             ("kill-ssh", {ip(0): w0})], script(p)
    assert "uid-" + w0 in p.core.hung
    assert "uid-" + pod_name(JOB, 1, 1) not in p.core.failed, "the waiting peer is not judged"
    alive = judged(beat(0, progress_at=NOW - 4), waits)  # not Ready, but it heartbeats
    assert ("say", "worker.hung") not in script(alive) and not alive.core.hung
    alone = replace(WORLD, world=frozenset({ip(1)}), world_seq=2)  # the world went on without it
    gone = judged(frozen, waits, driver=alone)
    assert ("say", "worker.hung") not in script(gone) and not gone.core.hung


def stalled() -> tuple[Beat, ...]:
    return (beat(0, progress_at=NOW - STALL_S - 1), beat(1, progress_at=NOW - STALL_S - 1))


def test_a_stalled_job_restarts_horovodrun() -> None:
    c = replace(STEADY, failed_at={ip(1): NOW - 200}, regroup=Pending(NOW - 200, {}),
                held_said=True)
    p = manage(c, seen(beats=stalled()), S)
    # The count is saved with the fleet's ledger: a retried launcher keeps it.
    assert script(p) == [("restart", "TrainingStalled", 1), ("save",)]
    assert p.core.horovodrun_restarts == 1 and p.core.failed_at == {}
    assert p.core.fleet is not None and p.core.fleet.ledger.horovodrun_restarts == 1
    assert p.core.regroup is None and not p.core.held_said, "a new run: its own regroup"
    assert p.restarts == ("TrainingStalled",)


def test_the_restart_limit_counts_the_restarts_a_previous_launcher_saved() -> None:
    """A Job retry or a takeover starts with the ledger the last launcher saved: two restarts
    there and one stall here are past the limit of 2 (exit 9), not the first of a fresh 2."""
    fl = STEADY.fleet
    assert fl is not None
    c = replace(STEADY, expected={},
                fleet=replace(fl, ledger=replace(fl.ledger, horovodrun_restarts=2)))
    p = manage(c, seen(beats=stalled()), S)
    assert script(p) == [("fail", ExitCode.STALLED)]


def test_past_the_restart_limit_the_job_fails_and_nothing_more_is_planned() -> None:
    c = replace(STEADY, horovodrun_restarts=2, expected={})
    p = manage(c, seen(beats=stalled()), S)
    assert script(p) == [("fail", ExitCode.STALLED)]
    assert p.core.failing is not None and p.core.failing[0] == ExitCode.STALLED
    assert p.restarts == ("TrainingStalled",), "counted in the restarts metric too"


def test_no_restart_while_stopping() -> None:
    p = manage(STEADY, seen(beats=stalled(), stopping=True), S)
    assert script(p) == [] and p.core.horovodrun_restarts == 0


def deleting(p: dict[str, Any], grace: int) -> dict[str, Any]:
    """`p` as the API shows it once deleted with `grace` (still there: Terminating)."""
    p = copy.deepcopy(p)
    p["metadata"].update(deletionTimestamp="2026-11-26T10:00:00Z",
                         deletionGracePeriodSeconds=grace)
    return p


def test_a_hung_worker_is_deleted_gracefully_and_replaced_away_from_its_node() -> None:
    silent = beat(0, last_seen=NOW - 4)
    waiting = beat(1, wait_s=2.0, waiting="c", progress_at=NOW - 10)
    p = manage(STEADY, seen(beats=(silent, waiting)), S)
    w0 = pod_name(JOB, 0, 1)
    # Its node is Ready: a grace the kubelet honours (it kills the process, then the pod is
    # gone), never 0 (the API would free its GPU while the process may still hold it). The
    # replacement waits for that.
    assert script(p) == [("say", "worker.hung"), ("fence", [ip(0)]),
                         ("kill-ssh", {ip(0): w0}), ("delete", w0, plan.HUNG_GRACE_S),
                         ("say", "worker.failed"), ("save",)]
    assert "uid-" + w0 in p.core.hung, "never listed again"
    terminating = {**PODS, w0: deleting(W0, plan.HUNG_GRACE_S)}
    held = manage(p.core, seen(terminating, now=NOW + 1, wall=WALL + 1, running=False), S)
    assert not [t for t in held.todo if isinstance(t, CreateWorker)], "created beside it"
    gone = {pod_name(JOB, 1, 1): W1}
    after = manage(held.core, seen(gone, now=NOW + 2, wall=WALL + 2, running=False), S)
    create = next(t for t in after.todo if isinstance(t, CreateWorker))
    assert create.create.name == pod_name(JOB, 0, 2)
    assert create.suspect_nodes == ("node-0",) and create.lost_nodes == ()
    later = manage(replace(after.core, expected={}),
                   seen(gone, now=NOW + HUNG_NODE_AVOID_S, running=False), S)
    recreate = next(t for t in later.todo if isinstance(t, CreateWorker))
    assert recreate.suspect_nodes == (), "the node is trusted again after a while"


def test_a_hung_pod_that_stays_is_left_behind_on_its_node_then_forced_when_it_goes_down(
        ) -> None:
    silent = beat(0, last_seen=NOW - 4)
    waiting = beat(1, wait_s=2.0, waiting="c", progress_at=NOW - 10)
    p = manage(STEADY, seen(beats=(silent, waiting)), S)
    w0 = pod_name(JOB, 0, 1)
    terminating = {**PODS, w0: deleting(W0, plan.HUNG_GRACE_S)}
    # Its kubelet does not confirm (the node froze with it): after the hold the replacement
    # is made, kept off that node (required).
    late = WALL + fleet.HUNG_HOLD_S
    made = manage(p.core, seen(terminating, now=NOW + fleet.HUNG_HOLD_S, wall=late,
                               running=False), S)
    create = next(t for t in made.todo if isinstance(t, CreateWorker))
    assert create.lost_nodes == ("node-0",)
    # Then its node is found down: the pod would stay Terminating forever. Forced, once.
    c = replace(made.core, expected={}, node_down={"node-0": NOW + 50})
    forced = manage(c, seen(terminating, now=NOW + 60, wall=WALL + 60, running=False), S)
    deletes = [t for t in forced.todo if isinstance(t, DeletePod)]
    assert deletes == [DeletePod(w0, "uid-" + w0, 0)]
    assert ("say", "worker.force_deleted") in script(forced)
    again = manage(forced.core, seen(terminating, now=NOW + 61, wall=WALL + 61,
                                     running=False), S)
    assert not [t for t in again.todo if isinstance(t, DeletePod)]


def test_a_fail_job_rule_fails_the_job_without_its_own_event() -> None:
    policy = Policy(rules=(Rule("r0", Action.FAIL_JOB, exit_codes=((3, 3),)),))
    x = died(0, code=3)
    p = manage(replace(STEADY, found=(x,)), seen({**PODS, x.failure.pod: x.pod}),
               settings(policy))
    kinds = script(p)
    assert kinds[-1] == ("fail", ExitCode.POLICY_FAILED)
    assert not any(k[0] in ("create", "save") for k in kinds), "nothing planned after"
    fail = p.todo[-1]
    assert isinstance(fail, FailJob) and not fail.event, "the decision's Event says it"


def test_a_scale_request_without_a_fleet_is_refused_once() -> None:
    p = manage(Memory(synced_at=NOW - 1, scanned=True, scale_request=3), seen(), S)
    assert script(p) == [("say", "scale.refused")]
    assert p.core.scale_request is None
    assert manage(p.core, seen(), S).todo == ()


def test_a_failure_already_failing_the_job_is_decided_but_not_replaced() -> None:
    x = died(1)
    c = replace(STEADY, found=(x,), failing=(int(ExitCode.WORKERS_LOST), "before"))
    p = manage(c, seen({**PODS, x.failure.pod: x.pod}), S)
    assert [k[0] for k in script(p)] == ["fence", "kill-ssh", "say"]
    assert p.core.failing == (int(ExitCode.WORKERS_LOST), "before"), "the first reason wins"


# ---- graceful leave (issue 24): a worker announced to go ----------------------------------------

LEAVING = replace(S, classify=ClassifySettings(node_grace_s=0.0, graceful_leave=True))
KEPT = replace(STEADY, budget=1)  # the workers' PodDisruptionBudget asked for already


def test_the_disruption_budget_follows_the_desired_workers() -> None:
    """The desired count less one, asked for once per change (after the state it follows)."""
    p = manage(STEADY, seen(), LEAVING)
    assert script(p) == [("budget", 1)] and p.core.budget == 1
    assert script(manage(p.core, seen(), LEAVING)) == []
    out = manage(replace(p.core, scale_request=3), seen(), LEAVING)
    assert script(out) == [("say", "scale.applied"), ("save",), ("budget", 2),
                           ("create", pod_name(JOB, 2, 1))]
    assert script(manage(STEADY, seen(), S)) == [], "no graceful leave: no budget"


def cordon(name: str) -> dict[str, Any]:
    n = shapes.node(name)
    n["spec"]["unschedulable"] = True
    return n


def drained(name: str) -> dict[str, Any]:
    """A node the cluster autoscaler is taking away (its taint): its workers leave at once."""
    n = shapes.node(name)
    n["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000",
                            "effect": "NoSchedule"}]
    return n


def evicted(p: dict[str, Any]) -> dict[str, Any]:
    """`p` as the Eviction API leaves it: DisruptionTarget, deleted with its grace (30 s)."""
    p = copy.deepcopy(p)
    p["metadata"]["deletionTimestamp"] = "2026-11-27T05:00:00Z"
    p["metadata"]["deletionGracePeriodSeconds"] = 30
    p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                      "reason": "EvictionByEvictionAPI"})
    return p


@pytest.mark.parametrize(("pods", "nodes", "why", "away"), [
    pytest.param(PODS, {**NODES, "node-0": drained("node-0")}, "NodeTainted", ("node-0",),
                 id="its node taken away by the autoscaler"),
    pytest.param({**PODS, pod_name(JOB, 0, 1): evicted(W0)}, NODES, "Evicted", (),
                 id="evicted"),
])
def test_an_announced_worker_leaves_gracefully_and_is_replaced_at_once(
        pods: dict[str, Any], nodes: dict[str, Any], why: str, away: tuple[str, ...]) -> None:
    """No fence, no ssh kill, no delete, no budget: its slot moves on, the replacement is
    created at once (kept off a node that is going), the old pod waits for horovodrun."""
    w0, w0b = pod_name(JOB, 0, 1), pod_name(JOB, 0, 2)
    p = manage(KEPT, seen(pods, nodes=nodes), LEAVING)
    # The budget counts the leaving worker, still Ready, as one that stays: while it leaves,
    # no other eviction is allowed.
    assert script(p) == [("say", "worker.leaving"), ("save",), ("budget", 2), ("create", w0b)]
    note = p.todo[0]
    assert isinstance(note, Note) and note.k8s is not None
    assert (note.k8s.reason, note.fields["why"]) == ("WorkerLeaving", why)
    create = p.todo[3]
    assert isinstance(create, CreateWorker) and create.lost_nodes == away
    assert create.create.avoid_node == "node-0"
    c = p.core
    assert c.fleet is not None and c.fleet.slots[0].incarnation == 2
    assert c.fleet.ledger.total == 0, "no restart budget used"
    assert c.leaving == {w0: plan.Leaving(0, "uid-" + w0, "node-0", WALL, why)}
    assert "uid-" + w0 in c.failed, "never classified: it is out of the file from now"
    # The same picture again: nothing new (level-triggered).
    assert script(manage(c, seen(pods, nodes=nodes), LEAVING)) == []
    # Without the graceful leave (the supervisor does not own the workers' entrypoint): a
    # taint is nothing, and an eviction is a failure found on its watch event (classify).
    assert script(manage(STEADY, seen(pods, nodes=nodes), S)) == []


@pytest.mark.parametrize(("pods", "deleted"), [
    pytest.param(PODS, True, id="its node tainted to go: the supervisor deletes it"),
    pytest.param({**PODS, pod_name(JOB, 0, 1): evicted(W0)}, False,
                 id="evicted: being deleted already, its entrypoint ends by itself"),
])
def test_a_leaving_worker_goes_once_horovodrun_let_it_go(pods: dict[str, Any],
                                                          deleted: bool) -> None:
    w0 = pod_name(JOB, 0, 1)
    nodes = {**NODES, "node-0": drained("node-0")}
    first = manage(KEPT, seen(pods, nodes=nodes), LEAVING).core
    out_of_file = f"{ip(1)}:1\n"
    # Still listed, or its ssh clients not counted yet, or still running: it stays.
    for kw in ({}, {"published": out_of_file},
               {"published": out_of_file, "ssh_clients": {ip(0): 1}}):
        p = manage(first, seen(pods, nodes=nodes, **kw), LEAVING)
        assert script(p) == [] and w0 in p.core.leaving, kw
    # horovodrun let it go: deleted (unless it is being deleted), said, forgotten.
    p = manage(first, seen(pods, nodes=nodes, published=out_of_file, ssh_clients={ip(0): 0}),
               LEAVING)
    assert script(p) == ([("say", "worker.left"), ("delete", w0, None), ("budget", 1)]
                         if deleted else [("say", "worker.left"), ("budget", 1)])
    assert p.core.leaving == {}
    note = p.todo[0]
    assert isinstance(note, Note) and note.fields["how"] == "horovodrun let it go"
    # Still running past the scale-in timeout: let go anyway.
    late = manage(first, seen(pods, nodes=nodes, published=out_of_file,
                              ssh_clients={ip(0): 2}, wall=WALL + 61), LEAVING)
    assert late.core.leaving == {}
    assert late.todo[0].fields["how"] == "timeout; 2 ssh clients left"  # type: ignore[union-attr]


def test_a_leaving_pod_that_is_gone_is_forgotten() -> None:
    nodes = {**NODES, "node-0": drained("node-0")}
    first = manage(KEPT, seen(PODS, nodes=nodes), LEAVING).core
    gone = {pod_name(JOB, 1, 1): W1}
    p = manage(first, seen(gone, nodes=nodes), LEAVING)
    assert p.core.leaving == {}
    assert ("say", "worker.left") in script(p)


def test_the_last_member_of_the_world_leaves_only_once_another_joined() -> None:
    """Both workers announced at once (their nodes taken away): Horovod broadcasts the state
    from a member of the last world, so one stays until a replacement is in the driver's
    world."""
    nodes = {"node-0": drained("node-0"), "node-1": drained("node-1")}
    w0, w1 = pod_name(JOB, 0, 1), pod_name(JOB, 1, 1)
    p = manage(KEPT, seen(PODS, nodes=nodes), LEAVING)
    assert script(p) == [("say", "worker.leaving"), ("say", "worker.leave_waits"), ("save",),
                         ("budget", 2), ("create", pod_name(JOB, 0, 2))]
    assert set(p.core.leaving) == {w0} and p.core.leave_waits == {w1}
    # Said once while it waits.
    again = manage(p.core, seen(PODS, nodes=nodes), LEAVING)
    assert script(again) == []
    # The replacement joined: the driver's world holds it and w1.
    joined = replace(WORLD, world=frozenset({ip(1), "10.1.0.99"}), world_seq=2)
    out = manage(again.core, seen(PODS, nodes=nodes, driver=joined), LEAVING)
    assert script(out) == [("say", "worker.leaving"), ("save",), ("budget", 3),
                           ("create", pod_name(JOB, 1, 2))]
    assert set(out.core.leaving) == {w0, w1} and out.core.leave_waits == frozenset()


def test_the_workers_of_a_frozen_node_are_fenced_in_one_dead_set() -> None:
    """Issue 40 item 3: slots 0 and 1 on node-0, which froze; slot 2 on node-2 waits. Slot 1 is
    silent for 3.0 s, slot 0 for 2.7 s (its heartbeat came later): both failed in this pass,
    one Fence of both hosts (one dead set, one reset of the survivors), said together."""
    pods = {pod_name(JOB, 0, 1): worker(0), pod_name(JOB, 1, 1): worker(1, node="node-0"),
            pod_name(JOB, 2, 1): worker(2)}
    listed = {ip(i): pod_name(JOB, i, 1) for i in range(3)}
    three = fleet.initial(3)
    c = replace(STEADY, fleet=three, saved=three, listed_since={h: NOW - 100 for h in listed})
    beats = (beat(0, last_seen=NOW - 2.7, progress_at=NOW - 3.2),
             beat(1, last_seen=NOW - 3.0, progress_at=NOW - 3.2),
             beat(2, wait_s=2.6, waiting="c", progress_at=NOW - 3.2))
    p = manage(c, seen(pods, beats=beats, listed_hosts=listed, first_owner={
        ip(i): "uid-" + pod_name(JOB, i, 1) for i in range(3)}, driver=replace(
        WORLD, world=frozenset(listed))), S)
    assert [t for t in script(p) if t[0] in ("say", "fence")][:4] == [
        ("say", "worker.hung"), ("say", "worker.hung"), ("say", "workers.hung_together"),
        ("fence", [ip(0), ip(1)])]
    together = next(t for t in p.todo if isinstance(t, Note)
                    and t.event == "workers.hung_together")
    assert together.fields == {"node": "node-0", "hosts": [ip(0), ip(1)],
                               "pods": [pod_name(JOB, 0, 1), pod_name(JOB, 1, 1)]}
