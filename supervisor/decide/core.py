"""PURE: one pass of the supervisor's decisions, composed from the steps in verdicts.py,
failures.py and plan.py.

`manage(Memory, Seen, Settings) -> Pass` is the reconcile of one pass, level-triggered: from what
the loop remembers of its own decisions (`Memory`: the fleet and its budgets, the failures found
and not decided yet, the pods being created, the nodes held back, the hang watch's memory) and
what it sees now (`Seen`: the watch's pods and nodes, the node Leases, the hook's heartbeats and
the driver's last word, the ssh clients of retiring hosts, the clocks), to the memory of the
next pass (`Pass.core`) and the script to carry out, in order (`Pass.todo`): decisions to say
(a log line, and an Event when it changes the job), hosts to fence, horovodrun's ssh clients
to kill, horovodrun to restart, pods to delete, the fleet's state to save, workers to create,
the job to fail. In order, as the steps depend on each other:

1. the first pass after the watch synced adopts the worker pods it finds (fleet.adopt);
2. while horovodrun runs with the hook: hang.assess reads the heartbeats and verdicts.on_verdict
   turns the verdict into failures (a hung worker, a process the driver saw exit) and a
   restart of horovodrun (a broken or stuck rendezvous, a stall), at most
   `horovodrun_restart_limit` times; past it the job fails (STALLED);
2b. a host whose ranks' own work (outside collectives) is slower than the others' is named
   (stragglers.py, slowranks.py) and, when that pays, moved as in 7b (placed ahead, kept off
   its node);
3. nodes down together past the disruption threshold are held back (classify.held_nodes);
4. the first pass, and every pass while a node is suspect, classifies every worker pod;
4b. a worker bound to a node that has not started within the bound (starts.py) fails as
   NotStarted when its node is at fault or its status does not say (at most starts.LIMIT
   pods of a slot in a row), and is only said when its template is;
5. the failed hosts that Horovod knew as this very pod are fenced and horovodrun's ssh
   clients to them killed, before anything else is done for them;
6. failures.on_failures decides on the failures (policy, budgets, deletes, FailJob);
7. a member of the driver's world failed: new hosts wait until the survivors regrouped;
7b. a worker announced to go (disruption.notice: evicted, deleted with a grace, its node
   cordoned, tainted or going bad) leaves gracefully: its slot moves to a new incarnation at
   once (no budget used), the old pod is out of the file and deleted once horovodrun let it go;
   a cordon alone evicts nothing, so there (and for a straggler) the replacement is placed
   first (the slot's next incarnation, ahead) and the worker leaves once it runs: with nowhere
   to go it trains on;
8. plan.plan reconciles the fleet (scale, scale-in, reused addresses, expectations, creates,
   MIN_NP); its state is saved before the creates, so a restart never forgets a budget used;
   the workers' PodDisruptionBudget is kept at the desired count less one (KeepMinAvailable).

Running `manage` twice on the same `Memory` and `Seen` asks for the same things: nothing in it
reads a clock, a file or the network. loop.py gathers `Seen`, runs the script and keeps
`Pass.core`; what happens between passes (a watch event classified, a create refused) is
decided by on.py. The types are memory.py's; the steps about nodes (3, the quarantine) are
nodes.py's, about workers that never start (4b) unstarted.py's, about announced disruptions
(7b) leaving.py's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from supervisor.decide import (
    admission,
    failures,
    fleet,
    hang,
    hostlist,
    leaving,
    nodes,
    plan,
    regroup,
    slowranks,
    unstarted,
    verdicts,
)
from supervisor.decide.classify import (
    Cause,
    classify,
)
from supervisor.decide.fleet import Fleet
from supervisor.decide.hang import Verdict
from supervisor.decide.memory import (
    HUNG_NODE_AVOID_S,
    CreateWorker,
    Fence,
    KeepMinAvailable,
    KillSsh,
    Memory,
    Pass,
    Passing,
    RestartHorovodrun,
    Seen,
    Settings,
    horovodrun_restarts,
    node_state,
    nodes_kept_off,
    suspect_nodes,
)
from supervisor.decide.plan import Note
from supervisor.decide.podindex import PodFacts
from supervisor.decide.script import DeletePod, SaveState
from supervisor.model import EventSpec, ExitCode
from supervisor.observe import EventType, Unusable

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    pass


def manage(c: Memory, s: Seen, st: Settings) -> Pass:
    """One pass of decisions: see the module's doc for the order."""
    p = Passing(c)
    now = s.now
    if s.index is None:
        s = replace(s, index=s.facts(st.plan.job))
    if p.c.synced_at is None:
        fl = p.c.fleet
        p.c = replace(p.c, synced_at=now, fleet=None if fl is None else fleet.adopt(
            fl, s.pods.values(), st.plan.job))
    running = s.running
    verdict, restarts, found = None, (), list(p.c.found)
    if running and s.hooked:
        verdict, restarts, hung_found = _watch_hangs(p, s, st)
        found += hung_found
        running = running and not any(isinstance(t, RestartHorovodrun) for t in p.todo)
        if running:
            slowranks.step(p, s, st)
    suspects = set(p.c.node_down) | set(s.lease_stale)
    nodes.brake(p, s, st, suspects)
    nodes.settle(p, s, st, suspects)
    if suspects and p.c.hung:
        _force_hung_on_lost_nodes(p, s, suspects)
    if not p.c.scanned or suspects:
        failed = set(p.c.failed)
        for name, pod in s.pods.items():
            uid = pod["metadata"].get("uid", "")
            node = pod.get("spec", {}).get("nodeName")
            if uid in failed or (p.c.scanned and node not in suspects):
                continue
            age = s.lease_ages.get(node or "") if s.lease_ages is not None else None
            f = classify(pod, EventType.MODIFIED, s.memory.get(name),
                         node_state(p.c, s.nodes, pod, age, now), settings=st.classify, now=now)
            if f is not None:
                failed.add(uid)
                found.append(failures.Failed(f, pod, now))
        p.c = replace(p.c, failed=frozenset(failed), scanned=True)
    found += unstarted.fail_unstarted(p, s, st)
    p.c = replace(p.c, found=())
    # Only a host Horovod knew as this very pod: an IP the CNI handed to another pod before or
    # since is not this failure's to fence.
    hosts = {h: x.failure.pod for x in found
             if (h := hostlist.host_of(x.pod, st.plan.host_mode))
             and s.first_owner.get(h) == x.pod["metadata"].get("uid")}
    if hosts and s.hooked:
        p.todo.append(Fence(frozenset(hosts)))
    if hosts and running:
        p.todo.append(KillSsh(hosts))
    counts: tuple[tuple[str, str], ...] = ()
    replace_from: Mapping[str, float] = {}
    if found:
        d = failures.on_failures(p.c.fleet, found, st.policy, st.plan, s.wall)
        p.c = replace(p.c, fleet=d.fleet)
        p.todo += d.deletes
        p.todo += d.notes
        counts, replace_from = d.counts, d.replace_from
        if d.fail is not None:
            p.fail(ExitCode.POLICY_FAILED, d.fail, event=False)
        if running and s.hooked:
            failed_at = {**{h: now for h in hosts}, **p.c.failed_at}
            pending = p.c.regroup
            if regroup.member_failed(hosts, s.beats, s.driver.world if s.driver else None):
                pending = regroup.pending(s.beats, now)  # new workers wait (regroup.py)
            p.c = replace(p.c, failed_at=failed_at, regroup=pending)
    nodes.quarantine_nodes(p, s, st, found, verdict=verdict, suspects=suspects)
    if p.c.fleet is not None and p.c.failing is None:
        leaving.announced(p, s, st, suspects)
        _plan_fleet(p, s, st, suspects)
    elif p.c.scale_request is not None:
        why = "the supervisor does not own the workers (SUPERVISOR_WORKER_TEMPLATE is not set)"
        p.todo.append(plan.scale_refused(p.c.scale_request, why))
        p.c = replace(p.c, scale_request=None)
    return Pass(p.c, tuple(p.todo), verdict, counts, restarts, replace_from)


def _force_hung_on_lost_nodes(p: Passing, s: Seen, suspects: set[str]) -> None:
    """A hung pod deleted with a grace whose node went down since: its kubelet will never
    confirm, so the pod would stay Terminating (and its replacement held): force it out."""
    forced = set(p.c.forced)
    for name, pod in sorted(s.pods.items()):
        meta = pod["metadata"]
        uid, node = meta.get("uid", ""), pod.get("spec", {}).get("nodeName")
        if (uid in p.c.hung and uid not in forced and node in suspects
                and meta.get("deletionTimestamp")
                and meta.get("deletionGracePeriodSeconds") != 0):
            forced.add(uid)
            p.todo.append(DeletePod(name, uid, 0))
            note = (f"hung worker {name} was deleted with a grace its kubelet would honour, but "
                    f"its node {node} is down now: force-deleted")
            p.todo.append(Note("warning", "worker.force_deleted", {"pod": name, "node": node},
                               EventSpec("Warning", "WorkerForceDeleted", "Delete", note)))
    p.c = replace(p.c, forced=frozenset(forced))


def _dropped_members(members: frozenset[str], s: Seen, c: Memory) -> dict[str, str]:
    """Hosts of the driver's last world that are not listed, host -> pod (the pod Horovod knew
    under that host), where a member's silence still blocks the others in their collective as
    any member's does, so hang detection keeps judging it:
    - its node is down: after an API outage the node controller marks every node NotReady and
      the brake holds their loss; a worker there that does not heartbeat leaves the listing
      (seen in the soak: 86 s without a step, until Gloo's timeout and then the node grace);
    - the discovery file is withdrawn while horovodrun runs (the view stale: the API out of
      reach for STALENESS_SECONDS): the workers train on in the driver's world, and no host is
      listed. Seen in the soak (seed 1, 2026-11-30): a node froze as the API came back, 50 s
      before the launcher pod's path to it did (kube-proxy's); its worker blocked the other
      for 49.6 s, declared 0.5 s after the watches came back. The fence and the ssh clients
      need no API; Horovod's driver keeps its hosts while the discovery script fails and
      leaves the failed host out; the replacement waits for the API;
    - its pod is left out as not Ready (its readiness probe failed: a partitioned or frozen
      worker's does within seconds): Horovod's driver keeps it in the world and waits for it in
      the next rendezvous too. Seen in the soak (seed 12, 2026-12-02): a partitioned worker was
      left out 6.5 s after the cut, never declared, and its peers waited out Gloo's 60 s timeout
      and then the rendezvous for good. A member scaled in, being deleted, declared, or not
      active any more is left out for another reason and not judged here."""
    withdrawn = s.published is None and s.running
    not_ready = frozenset() if s.view_render is None else frozenset(
        name for name, why in s.view_render.left_out.items() if why == Unusable.NOT_READY)
    if not c.node_down and not withdrawn and not not_ready:
        return {}
    hosts = {uid: h for h in members
             if h not in s.listed_hosts and (uid := s.first_owner.get(h)) is not None}
    if not hosts:
        return {}
    return {hosts[uid]: name for name, pod in s.pods.items()
            if (uid := pod["metadata"].get("uid")) in hosts
            and (withdrawn or name in not_ready
                 or pod.get("spec", {}).get("nodeName") in c.node_down)}


@dataclass(frozen=True)
class _NodeOf(Mapping[str, str]):
    """host -> the node of the pod watched under it, looked up when asked: hang.assess asks
    for the hosts of silent processes only (a map of every host cost a pass O(workers))."""

    watched: Mapping[str, str]  # host -> pod
    facts: Mapping[str, PodFacts]

    def __getitem__(self, host: str) -> str:
        f = self.facts.get(self.watched[host])
        if f is None or not f.node:
            raise KeyError(host)
        return f.node

    def __iter__(self) -> Iterator[str]:
        return (h for h in self.watched if h in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _watch_hangs(p: Passing, s: Seen, st: Settings) -> tuple[Verdict, tuple[str, ...],
                                                            list[failures.Failed]]:
    """Steps 2: the verdict on the heartbeats, its failures and restart."""
    now, c = s.now, p.c
    driver = s.driver
    world = ((driver.world, driver.world_at) if driver is not None and driver.world_seq
             else None)
    dropped = _dropped_members(world[0], s, c) if world else {}
    watched = {**s.listed_hosts, **dropped} if dropped else s.listed_hosts
    listed_since = c.listed_since
    if listed_since.keys() != watched.keys():  # (set operations: at 10,000 hosts a few differ)
        listed_since = dict(listed_since)
        for host in listed_since.keys() - watched.keys():
            del listed_since[host]
        listed_since.update(dict.fromkeys(watched.keys() - listed_since.keys(), now))
    nodes = _NodeOf(watched, s.facts(st.plan.job).pods)
    verdict = hang.assess(s.beats, listed_since, started_at=s.started_at, settings=st.hang,
                          now=now, failed_at=c.failed_at, world=world, nodes=nodes)
    exited = (driver.exited if driver is not None and not s.stopping and c.failing is None
              else {})
    d = verdicts.on_verdict(verdict, watched, s.pods, c.failed, exited,
                        stall_timeout_s=st.stall_timeout_s, now=now)
    found = [failures.Failed(f, pod, now) for f, pod in d.failures]
    hung_nodes = {n: t for n, t in c.hung_nodes.items() if now - t < HUNG_NODE_AVOID_S}
    hung_nodes.update({f.node: now for f, _ in d.failures
                       if f.cause is Cause.HUNG and f.node})
    uids = frozenset(f.uid for f, _ in d.failures)
    p.c = replace(c, listed_since=listed_since, failed=c.failed | uids, hung=c.hung | uids,
                  hung_nodes=hung_nodes)
    p.todo += d.notes
    restarts: tuple[str, ...] = ()
    if d.restart is not None and p.c.failing is None and not s.stopping:
        reason, why = d.restart
        restarts = (reason,)
        n = horovodrun_restarts(p.c) + 1
        fl = p.c.fleet
        p.c = replace(p.c, horovodrun_restarts=n, fleet=None if fl is None else replace(
            fl, ledger=replace(fl.ledger, horovodrun_restarts=n)))
        if n > st.horovodrun_restart_limit:
            p.fail(ExitCode.STALLED, f"{why}; horovodrun was restarted "
                   f"{st.horovodrun_restart_limit} times already")
        else:
            p.todo.append(RestartHorovodrun(reason, why, n))
            # A new run of horovodrun: its own failures, its own regroup.
            p.c = replace(p.c, failed_at={}, regroup=None, held_said=False)
    return verdict, restarts, found


def _plan_fleet(p: Passing, s: Seen, st: Settings, suspects: set[str]) -> None:
    """Step 8: the fleet's reconcile (plan.plan); the state saved before the creates."""
    c = p.c
    assert c.fleet is not None
    kept_off = nodes_kept_off(c, s, st, suspects)
    out = plan.plan(plan.Picture(
        fleet=c.fleet, pods=s.pods, published=s.published or "", view_render=s.view_render,
        reuse_checked=c.reuse_checked, reused=c.reused, scale_request=c.scale_request,
        expected=c.expected, waiting=frozenset(admission.waiting(c.blocked, s.now)),
        ssh_clients=s.ssh_clients, now=s.now, wall=s.wall, failed=c.failed,
        lost_nodes=frozenset(kept_off), leaving=c.leaving, index=s.index, unseen=c.unseen),
        st.plan)
    p.c = replace(c, fleet=out.fleet, reused=out.reused, reuse_checked=out.reuse_checked,
                  scale_request=out.scale_request, expected=out.expected,
                  failed=c.failed | out.ours, leaving=out.leaving, unseen=out.unseen)
    p.todo += out.notes
    p.todo += out.deletes
    if p.c.fleet != p.c.saved or p.c.quarantine.until != p.c.saved_quarantine:
        p.todo.append(SaveState(state_of(out.fleet, st, p.c.quarantine.until)))
        p.c = replace(p.c, saved=p.c.fleet, saved_quarantine=p.c.quarantine.until)
    # The leaving workers still count as healthy for the disruption controller until they are
    # gone: while one leaves, no other eviction is allowed.
    want = max(0, len(out.fleet.active()) - 1 + len(p.c.leaving))
    if st.classify.graceful_leave and want != c.budget:
        p.todo.append(KeepMinAvailable(want))
        p.c = replace(p.c, budget=want)
    lost = tuple(sorted(kept_off))
    suspect = suspect_nodes(p.c, s.now)
    # A hung pod still there after the hold: its node is kept off, required (fleet.wanted).
    p.todo += [CreateWorker(x, tuple(sorted({*lost, x.avoid_node})) if x.away and x.avoid_node
                            else lost, suspect) for x in out.creates]
    if out.fail is not None:
        p.fail(ExitCode.WORKERS_LOST, out.fail)


def state_of(f: Fleet, st: Settings,
             quarantined: Mapping[str, float] | None = None) -> dict[str, object]:
    """The fleet as saved in the state ConfigMap, with what `status` shows beside it (the
    nodes quarantined: until when, epoch seconds)."""
    s = st.plan
    lo, hi = fleet.limits(s.min_np, s.max_np, s.slots_per_worker)
    out: dict[str, object] = {
        **fleet.stored(f), "limits": {"minWorkers": lo, "maxWorkers": hi},
        "desiredWorkers": len(f.active()), "restartLimit": st.policy.budgets.restart_limit}
    if quarantined:
        out["quarantined"] = {n: round(t, 1) for n, t in sorted(quarantined.items())}
    return out
