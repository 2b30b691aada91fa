"""PURE: one pass of the supervisor's decisions, composed from the steps in verdicts.py,
failures.py and plan.py.

`manage(Core, Seen, Settings) -> Pass` is the reconcile of one pass, level-triggered: from what
the loop remembers of its own decisions (`Core`: the fleet and its budgets, the failures found
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
   a cordon alone evicts nothing, so there the replacement is placed first (the slot's next
   incarnation, ahead) and the worker leaves once it runs: with nowhere to go it trains on;
8. plan.plan reconciles the fleet (scale, scale-in, reused addresses, expectations, creates,
   MIN_NP); its state is saved before the creates, so a restart never forgets a budget used;
   the workers' PodDisruptionBudget is kept at the desired count less one (KeepMinAvailable).

Running `manage` twice on the same `Core` and `Seen` asks for the same things: nothing in it
reads a clock, a file or the network. reconcile.py gathers `Seen`, runs the script and keeps
`Pass.core`; what happens between passes (a watch event classified, a create refused) is
written into `Core` there with `dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from supervisor import admission
from supervisor.decide import (
    disruption,
    failures,
    fleet,
    hang,
    hostlist,
    plan,
    quarantine,
    regroup,
    starts,
    verdicts,
)
from supervisor.decide.beats import Beat, Driver, heartbeating
from supervisor.decide.classify import (
    Cause,
    ClassifySettings,
    Failure,
    NodeState,
    PodMemory,
    classify,
    held_nodes,
    training_container,
)
from supervisor.decide.fleet import Fleet
from supervisor.decide.hang import HangSettings, Verdict
from supervisor.decide.hostlist import HostMode, Rendered
from supervisor.decide.plan import Note
from supervisor.decide.policy import Policy
from supervisor.decide.script import DeletePod, SaveState
from supervisor.model import EventSpec, ExitCode
from supervisor.observe import EventType, Obj, node_problem, pod_problem
from supervisor.workers import ANNOTATION_AHEAD_OF, pod_name

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    from supervisor.config import Config

HUNG_NODE_AVOID_S = 300.0  # replacements prefer other nodes this long after a hang on one


def classify_settings(cfg: Config) -> ClassifySettings:
    """How failures are classified: the node graces, the training container, and the other
    containers the policy's rules name (their exits count too)."""
    return ClassifySettings(
        node_grace_s=cfg.node_grace_s, lease_grace_s=cfg.node_lease_s,
        training_container=cfg.worker_container,
        policy_containers=frozenset(r.container for r in cfg.policy.rules
                                    if r.container is not None),
        graceful_leave=cfg.worker_template is not None)


def hang_settings(cfg: Config) -> HangSettings:
    return HangSettings(silence_s=cfg.heartbeat_timeout_s, stall_s=cfg.stall_timeout_s,
                        stuck_s=cfg.stuck_s)


def horovodrun_restarts(c: Core) -> int:
    """Restarts of horovodrun so far: kept in the fleet's persisted ledger where the supervisor
    owns the workers, so the limit holds over launcher attempts (a Job retry, a takeover)."""
    stored = c.fleet.ledger.horovodrun_restarts if c.fleet is not None else 0
    return max(c.horovodrun_restarts, stored)


@dataclass(frozen=True)
class Settings:
    """What of the config the decisions read (config.Config holds them)."""

    plan: plan.Settings
    policy: Policy
    classify: ClassifySettings
    hang: HangSettings
    disruption_threshold: float | None
    horovodrun_restart_limit: int
    stall_timeout_s: float
    disruption: disruption.Settings = field(default_factory=disruption.Settings)
    quarantine: quarantine.Settings = field(default_factory=quarantine.Settings)
    # seconds a bound worker may stay not started (starts.py); None: never acted on
    start_timeout_s: float | None = None

    @classmethod
    def of(cls, cfg: Config) -> Settings:
        return cls(plan.Settings.of(cfg), cfg.policy, classify_settings(cfg),
                   hang_settings(cfg),
                   cfg.node_disruption_threshold, cfg.horovodrun_restart_limit,
                   cfg.stall_timeout_s,
                   disruption.Settings(cfg.node_drain_taints, cfg.node_bad_conditions),
                   quarantine.Settings(cfg.quarantine_failures, cfg.quarantine_window_s,
                                       cfg.quarantine_s),
                   cfg.worker_start_timeout_s)


@dataclass(frozen=True)
class Core:
    """What the decisions remember from one pass to the next (replaced, never mutated)."""

    fleet: Fleet | None = None  # None: the supervisor does not own the workers
    saved: Fleet | None = None  # the fleet last handed to the actuator to save
    failed: frozenset[str] = frozenset()  # UIDs classified as failed (never twice)
    found: tuple[failures.Failed, ...] = ()  # failures classified between passes, to decide
    node_down: Mapping[str, float] = field(default_factory=dict)  # node -> down since
    braked: frozenset[str] = frozenset()  # down nodes the disruption brake holds back
    settling: frozenset[str] = frozenset()  # down nodes held after an API outage (_settle)
    synced_at: float | None = None  # the first pass after the watch synced
    scanned: bool = False  # the first full classification after sync is done
    reused: Mapping[int, int] = field(default_factory=dict)  # slot -> pods replaced (reused IP)
    reuse_checked: Rendered | None = None  # the render last looked at for reused addresses
    expected: Mapping[str, float] = field(default_factory=dict)  # being created -> since
    blocked: Mapping[str, admission.Refusal] = field(default_factory=dict)  # creates refused
    scale_request: int | None = None  # desired workers asked for, not applied yet
    leaving: Mapping[str, plan.Leaving] = field(default_factory=dict)  # announced to go
    budget: int | None = None  # the PodDisruptionBudget's minAvailable last asked for
    leave_waits: frozenset[str] = frozenset()  # announced, waiting for another to join
    # workers on a cordoned node -> their replacement placed ahead (_move_ahead); workers
    # whose replacement failed before it ran: they stay while the cordon lasts
    moving: Mapping[str, str] = field(default_factory=dict)
    staying: frozenset[str] = frozenset()
    quarantine: quarantine.Quarantine = field(default_factory=quarantine.Quarantine)
    saved_quarantine: Mapping[str, float] = field(default_factory=dict)  # as last saved
    failing: tuple[int, str] | None = None  # the run ends with this code and reason
    # the hang watch (this run of horovodrun, except the restarts and the hung pods)
    listed_since: Mapping[str, float] = field(default_factory=dict)  # host -> listed since
    hung: frozenset[str] = frozenset()  # UIDs of pods found Hung: never listed again
    forced: frozenset[str] = frozenset()  # UIDs of hung pods force-deleted: their node went down
    hung_nodes: Mapping[str, float] = field(default_factory=dict)  # node -> a worker hung
    failed_at: Mapping[str, float] = field(default_factory=dict)  # host -> found failed
    regroup: regroup.Pending | None = None  # a failure the survivors have not regrouped from
    horovodrun_restarts: int = 0  # of this supervisor (see horovodrun_restarts())
    # the host list (listing.listing): host -> (driver world, out of the file until) of hosts
    # announced again to Horovod; the hold-back of the pending regroup was said
    reannounced: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    held_said: bool = False
    # pods that never start (starts.py): UID -> seen bound and not started since (monotonic);
    # slot -> its pods replaced in a row for it; UID -> what was said of it (once)
    unstarted_since: Mapping[str, float] = field(default_factory=dict)
    unstarted: Mapping[int, int] = field(default_factory=dict)
    start_said: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    """What the loop sees in this pass (gathered by reconcile.py)."""

    pods: Mapping[str, Obj]  # the job's worker pods the watch shows, by name
    nodes: Mapping[str, Obj]
    memory: Mapping[str, PodMemory]  # what earlier events showed of each pod, by name
    lease_ages: Mapping[str, float] | None  # node -> seconds since its Lease was renewed
    lease_stale: frozenset[str]  # nodes whose Lease is older than SUPERVISOR_NODE_LEASE_SECONDS
    first_owner: Mapping[str, str]  # host -> UID of the first pod published with it
    published: str | None  # the discovery file as published (None: withdrawn)
    view_render: Rendered | None  # the last render of the view (hostlist.render)
    listed_hosts: Mapping[str, str]  # host -> pod of the hosts published now
    hooked: bool  # the hook channel is there (fence, heartbeats)
    running: bool  # horovodrun runs
    stopping: bool  # a signal is being forwarded to horovodrun
    started_at: float  # when this run of horovodrun started (monotonic)
    beats: tuple[Beat, ...]  # the hook's heartbeats of this run
    driver: Driver | None  # the driver hook's last word
    ssh_clients: Mapping[str, int]  # host -> ssh clients (plan.retiring_hosts of Core.fleet)
    now: float  # monotonic
    wall: float  # epoch (the fleet's clock)
    # monotonic: when the supervisor's node watch came back from its last outage (None: none)
    api_back_at: float | None = None


@dataclass(frozen=True)
class Fence:
    """Tell the hook in every training process: these hosts are gone (the driver skips them,
    survivors stalled on them leave their collective)."""

    hosts: frozenset[str]


@dataclass(frozen=True)
class KillSsh:
    """Kill horovodrun's ssh clients to these hosts (host -> the failed pod): a frozen worker
    never closes them, and Horovod waits on them."""

    pods: Mapping[str, str]


@dataclass(frozen=True)
class RestartHorovodrun:
    """Tell the training processes to exit, kill horovodrun's tree, start again at the gate."""

    reason: str  # the Event's reason: TrainingStalled, RendezvousBroken, RendezvousStuck
    why: str
    restart: int  # this restart's number (1-based)


@dataclass(frozen=True)
class CreateWorker:
    create: fleet.Create
    lost_nodes: tuple[str, ...]  # nodes down or silent: the replacement avoids them
    suspect_nodes: tuple[str, ...]  # nodes where a worker hung lately: preferred against
    ahead_of: str | None = None  # placed ahead of this worker's move (_move_ahead)


@dataclass(frozen=True)
class KeepMinAvailable:
    """Keep the workers' PodDisruptionBudget at `min_available` (workers.disruption_budget;
    the loop hands the actuator its manifest: script.KeepBudget)."""

    min_available: int


@dataclass(frozen=True)
class FailJob:
    code: int
    reason: str
    event: bool  # post the JobFailing Event (a decision's own Event may have said it)


Todo = (Note | Fence | KillSsh | RestartHorovodrun | DeletePod | SaveState | CreateWorker
        | KeepMinAvailable | FailJob)


@dataclass(frozen=True)
class Pass:
    core: Core
    todo: tuple[Todo, ...]
    verdict: Verdict | None = None  # the hang watch's, for the adapter's one-time warnings
    counts: tuple[tuple[str, str], ...] = ()  # (cause, action) of each failure decided
    restarts: tuple[str, ...] = ()  # reasons horovodrun was found to need a restart
    replace_from: Mapping[str, float] = field(default_factory=dict)  # new pod -> failure seen


def node_state(c: Core, nodes: Mapping[str, Obj], pod: Obj, lease_age: float | None,
               now: float) -> NodeState:
    """What is known of `pod`'s node for classify: held back by the brake, down since, its
    Lease's age. A node never seen since the sync counts as down since then."""
    name = pod.get("spec", {}).get("nodeName") or ""
    node = nodes.get(name)
    if name in c.braked or name in c.settling:
        return NodeState(node=node)  # held back: no evidence against it for now
    down = c.node_down.get(name)
    if node is None and name and down is None:
        down = c.synced_at if c.synced_at is not None else now  # never seen since sync
    return NodeState(node=node, down_since=down, lease_age_s=lease_age)


def fail(c: Core, code: int, reason: str, *, event: bool = True) -> tuple[Core, FailJob | None]:
    """The run ends with `code` unless it ends already (the first reason wins)."""
    if c.failing is not None:
        return c, None
    return replace(c, failing=(int(code), reason)), FailJob(int(code), reason, event)


def judge_exit(held: int | None, exited: int | None, *,
               paused: bool) -> tuple[int | None, int | None]:
    """horovodrun's exit, held or judged: (the code held from now on, the code to judge now).
    An exit seen while the leader Lease cannot be renewed (`paused`) is no verdict on the job:
    a standby may have taken the workers, whose training processes then end this run's (hook
    owner.py). It is held until the Lease is renewed again (judged then, as any exit) or lost
    (the run ends with LEADERSHIP_LOST: `fail`, whose code the caller finishes with)."""
    if held is not None:
        return (held, None) if paused else (None, held)
    if exited is not None and paused:
        return exited, None
    return None, exited


@dataclass
class _Pass:
    """`manage` under way (local to one call)."""

    c: Core
    todo: list[Todo] = field(default_factory=list)

    def fail(self, code: int, reason: str, *, event: bool = True) -> None:
        self.c, op = fail(self.c, code, reason, event=event)
        if op is not None:
            self.todo.append(op)


def manage(c: Core, s: Seen, st: Settings) -> Pass:
    """One pass of decisions: see the module's doc for the order."""
    p = _Pass(c)
    now = s.now
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
    suspects = set(p.c.node_down) | set(s.lease_stale)
    _brake(p, s, st, suspects)
    _settle(p, s, st, suspects)
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
    found += _starts(p, s, st)
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
    _quarantine(p, s, st, found, verdict=verdict, suspects=suspects)
    if p.c.fleet is not None and p.c.failing is None:
        _announced(p, s, st, suspects)
        _plan_fleet(p, s, st, suspects)
    elif p.c.scale_request is not None:
        why = "the supervisor does not own the workers (SUPERVISOR_WORKER_TEMPLATE is not set)"
        p.todo.append(plan.scale_refused(p.c.scale_request, why))
        p.c = replace(p.c, scale_request=None)
    return Pass(p.c, tuple(p.todo), verdict, counts, restarts, replace_from)


def _force_hung_on_lost_nodes(p: _Pass, s: Seen, suspects: set[str]) -> None:
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


def _dropped_members(members: frozenset[str], s: Seen, c: Core) -> dict[str, str]:
    """Hosts of the driver's last world that the listing dropped because their node is down,
    host -> pod (the pod Horovod knew under that host). After an API outage the node
    controller marks every node NotReady and the brake holds their loss; a worker there that
    does not heartbeat leaves the listing, but while it is in the world its silence blocks
    the others in their collective as any member's does: hang detection keeps judging it
    (seen in the soak: 86 s without a step, until Gloo's timeout and then the node grace)."""
    if not c.node_down:
        return {}
    hosts = {uid: h for h in members
             if h not in s.listed_hosts and (uid := s.first_owner.get(h)) is not None}
    if not hosts:
        return {}
    return {hosts[uid]: name for name, pod in s.pods.items()
            if (uid := pod["metadata"].get("uid")) in hosts
            and pod.get("spec", {}).get("nodeName") in c.node_down}


def _watch_hangs(p: _Pass, s: Seen, st: Settings) -> tuple[Verdict, tuple[str, ...],
                                                            list[failures.Failed]]:
    """Steps 2: the verdict on the heartbeats, its failures and restart."""
    now, c = s.now, p.c
    driver = s.driver
    world = ((driver.world, driver.world_at) if driver is not None and driver.world_seq
             else None)
    watched = {**s.listed_hosts, **(_dropped_members(world[0], s, c) if world else {})}
    listed_since = {host: c.listed_since.get(host, now) for host in watched}
    nodes = {host: node for host, name in watched.items()
             if (node := s.pods.get(name, {}).get("spec", {}).get("nodeName"))}
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


def _brake(p: _Pass, s: Seen, st: Settings, down: set[str]) -> None:
    """Step 3: hold back the loss of nodes that went down together (classify.held_nodes).
    Nodes released while still down get a fresh grace: they come back one by one."""
    c = p.c
    braked: frozenset[str] = frozenset()
    job_nodes: set[str] = set()
    if down and st.disruption_threshold is not None:
        job_nodes = {node for pod in s.pods.values()
                     if (node := pod.get("spec", {}).get("nodeName"))
                     and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")}
        braked = held_nodes(job_nodes, frozenset(s.nodes), down, st.disruption_threshold)
    if braked == c.braked:
        return
    node_down = {n: (s.now if n in c.braked - braked else t) for n, t in c.node_down.items()}
    if braked:
        cluster_down = len(down & set(s.nodes))
        note = (f"{len(braked)} of the {len(job_nodes)} nodes of the job's workers "
                f"({cluster_down} of the cluster's {len(s.nodes)} nodes) are down together "
                f"({', '.join(sorted(braked))}): their workers are held, "
                f"not failed or force-deleted, until fewer are down "
                f"(SUPERVISOR_NODE_DISRUPTION_THRESHOLD={st.disruption_threshold:g})")
        p.todo.append(Note("warning", "node.disruption", {"nodes": sorted(braked),
                                                          "note": note},
                           EventSpec("Warning", "NodeDisruption", "Hold", note)))
    else:
        note = (f"fewer of the job's nodes are down now ({', '.join(sorted(c.braked))} "
                "held before): node loss is handled again")
        p.todo.append(Note("info", "node.disruption_over", {"nodes": sorted(c.braked)},
                           EventSpec("Normal", "NodeDisruptionOver", "Resume", note)))
    p.c = replace(c, braked=braked, node_down=node_down)


# After an outage of the API server (or of the supervisor's link to it) the node controller may
# mark nodes NotReady whose kubelets could not renew their Leases through it, and they turn
# Ready again at their next status update: no node was lost. For this long after its own watch
# came back, the supervisor holds a down node whose workers' training processes all heartbeat.
OUTAGE_SETTLE_S = 60.0
OUTAGE_MIN_S = 5.0  # a watch broken this long is an outage (a routine reconnect is shorter)


def settling_nodes(down: set[str], pods: Mapping[str, Obj], beats: tuple[Beat, ...], *,
                   mode: HostMode, silence_s: float, now: float,
                   api_back_at: float | None) -> frozenset[str]:
    """PURE: the down nodes to hold (see OUTAGE_SETTLE_S): every live worker on them has a
    training process that heartbeats now, within OUTAGE_SETTLE_S of the API's return."""
    if api_back_at is None or now - api_back_at > OUTAGE_SETTLE_S or not down:
        return frozenset()
    talking = {b.host for b in beats if heartbeating(b, now, silence_s)}
    on: dict[str, list[str | None]] = {}
    for pod in pods.values():
        node = pod.get("spec", {}).get("nodeName")
        if node in down and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            on.setdefault(node, []).append(hostlist.host_of(pod, mode))
    return frozenset(n for n, hosts in on.items() if all(h in talking for h in hosts))


def _settle(p: _Pass, s: Seen, st: Settings, down: set[str]) -> None:
    """Step 3b: hold nodes that went down with the API server (settling_nodes), said once."""
    c = p.c
    settling = settling_nodes(down, s.pods, s.beats, mode=st.plan.host_mode,
                              silence_s=st.hang.silence_s, now=s.now,
                              api_back_at=s.api_back_at) if s.hooked else frozenset()
    if settling == c.settling:
        return
    if new := settling - c.settling:
        note = (f"node(s) {', '.join(sorted(new))} went down within {OUTAGE_SETTLE_S:g}s of "
                "the API server's return while every worker on them heartbeats: held, not "
                "replaced, while they do (their kubelets report again at their next update)")
        p.todo.append(Note("warning", "node.settling", {"nodes": sorted(new), "note": note},
                           EventSpec("Warning", "NodeSettling", "Hold", note)))
    if gone := c.settling - settling:
        p.todo.append(Note("info", "node.settled", {
            "nodes": sorted(gone), "still_down": sorted(gone & down)}))
    p.c = replace(c, settling=settling)


def quarantine_signs(found: list[failures.Failed], leaving: Mapping[str, plan.Leaving],
                     stuck: frozenset[str], job: str) -> list[quarantine.Sign]:
    """What the quarantine reads of this pass's failures and of the workers leaving for a
    node-problem condition (quarantine.py says what counts); `stuck`: pods failed because
    their main thread stood still (Hung too, but the script's)."""
    kinds = {Cause.NODE_NOT_READY: quarantine.Kind.LOST, Cause.HUNG: quarantine.Kind.HUNG,
             Cause.EXIT_CODE: quarantine.Kind.EXIT}
    out = []
    for x in found:
        f = x.failure
        kind = (quarantine.Kind.NOT_STARTED if f.cause is Cause.NOT_STARTED and f.node_fault
                else kinds.get(f.cause))
        if kind is None or not f.node or f.pod in stuck:
            continue
        slot = fleet.slot_of(x.pod, job)
        out.append(quarantine.Sign(kind, f.node, f.uid, None if slot is None else slot[0],
                                   f.exit_code))
    out += [quarantine.Sign(quarantine.Kind.CONDITION, w.node, w.uid, w.slot)
            for w in leaving.values() if w.node and w.why == disruption.Why.BAD_NODE.value]
    return out


def _starts(p: _Pass, s: Seen, st: Settings) -> list[failures.Failed]:
    """Step 4b: the worker pods bound to a node that have not started for the bound
    (starts.py). The node's fault, or one the pod's status does not say: a NotStarted failure
    of its slot's current pod (the policy replaces it, off that node, no budget used), at most
    starts.LIMIT pods of a slot in a row, then said once and left. The template's (it would
    fail the same anywhere), or a pod the supervisor does not own: said once, never replaced."""
    c, job, bound = p.c, st.plan.job, st.start_timeout_s
    if bound is None:
        return []
    since: dict[str, float] = {}
    said: dict[str, str] = {}
    row = dict(c.unstarted)
    failed = set(c.failed)
    found: list[failures.Failed] = []
    fl = c.fleet
    unstarted = []  # one cheap look at every pod; the few not started are judged in order
    for name, pod in s.pods.items():
        if pod.get("status", {}).get("phase") == "Running":
            if row and (at := _current(fl, pod, job)) is not None:
                row.pop(at[0], None)  # the slot's pods do start: the row is over
            continue
        if (x := starts.stuck(pod)) is not None and pod["metadata"].get("uid") not in failed:
            unstarted.append((name, pod, x))
    for name, pod, x in sorted(unstarted, key=lambda u: u[0]):
        uid = pod["metadata"].get("uid", "")
        since[uid] = c.unstarted_since.get(uid, s.now)
        waited = s.now - since[uid]
        at = _current(fl, pod, job)
        node = pod.get("spec", {}).get("nodeName")
        if fl is not None and at is None:
            # An older incarnation's pod is deleted as superseded (plan.py); one placed ahead
            # of a cordoned worker's move is given up at the bound (_move_ahead deletes it).
            ahead_of = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_AHEAD_OF)
            if c.moving.get(ahead_of or "") == name and waited >= bound:
                failed.add(uid)
                del since[uid]
                p.todo.append(_not_starting(name, node, x, waited, ahead_of=ahead_of))
            continue
        if fl is None or x.fault is starts.Fault.TEMPLATE:
            said[uid] = c.start_said.get(uid, "")
            if said[uid] != x.reason and waited >= min(bound, starts.SAY_AFTER_S):
                said[uid] = x.reason
                p.todo.append(_not_starting(name, node, x, waited, owned=fl is not None))
            continue
        if waited < bound:
            continue
        assert at is not None
        n = row.get(at[0], 0)
        if n >= starts.LIMIT:
            if c.start_said.get(uid) != "limit":
                p.todo.append(_never_starts(name, at[0], node, x, waited))
            said[uid] = "limit"
            continue
        row[at[0]] = n + 1
        failed.add(uid)
        del since[uid]
        whose = (f"the node's fault ({x.rule})" if x.fault is starts.Fault.NODE else
                 "its status does not say whose fault (the kubelet's Events on the pod do: "
                 "FailedMount, FailedCreatePodSandBox)")
        detail = (f"not started {waited:.0f}s after it was seen bound to node {node} "
                  f"({x.said()}); {whose}; pod {n + 1} of {starts.LIMIT} of this slot in a row "
                  "that never started")
        found.append(failures.Failed(Failure(Cause.NOT_STARTED, name, uid, node, detail=detail,
                                         node_fault=x.fault is starts.Fault.NODE), pod, s.now))
    if (since, row, said) != (c.unstarted_since, c.unstarted, c.start_said) or found:
        p.c = replace(c, unstarted_since=since, unstarted=row, failed=frozenset(failed),
                      start_said=said)
    return found


def _current(fl: Fleet | None, pod: Obj, job: str) -> tuple[int, int] | None:
    """(slot, incarnation) of `pod` if it is the current pod of an active slot."""
    at = fleet.slot_of(pod, job) if fl is not None else None
    slot = fl.slots.get(at[0]) if fl is not None and at is not None else None
    if (at is None or slot is None or slot.dropped is not None or slot.retiring_at is not None
            or at[1] != slot.incarnation):
        return None
    return at


def _not_starting(name: str, node: str | None, x: starts.Stuck, waited: float, *,
                  owned: bool = True, ahead_of: str | None = None) -> Note:
    """A worker that has not started, and is not replaced: said once per kubelet reason."""
    why = (f"placed ahead of the move of {ahead_of} (its node cordoned): given up, "
           f"{ahead_of} trains on where it is" if ahead_of is not None else
           "the pod's template is at fault (it would fail the same on any node): not "
           "replaced; the kubelet keeps trying, and the pod starts once what it names is "
           "there (fix the image, the Secret or the ConfigMap)" if owned else
           "the supervisor does not create workers (SUPERVISOR_WORKER_TEMPLATE is not set): "
           "not replaced")
    note = f"worker {name} on node {node} has not started after {waited:.0f}s: {x.said()}; {why}"
    return Note("warning", "worker.not_starting", {
        "pod": name, "node": node, "container": x.container, "reason": x.reason,
        "message": x.message, "fault": x.fault.value, "rule": x.rule,
        "waited_s": round(waited, 1)}, EventSpec("Warning", "WorkerNotStarting", "Report", note))


def _never_starts(name: str, slot: int, node: str | None, x: starts.Stuck,
                  waited: float) -> Note:
    """The slot's pods never started starts.LIMIT times in a row: this one is left."""
    note = (f"worker {name} (slot {slot}) on node {node} has not started after {waited:.0f}s: "
            f"{x.said()}; {starts.LIMIT} pods of this slot in a row never started on other "
            "nodes already, so it is not the node: left as it is, not replaced (look at the "
            "pod's Events: kubectl describe pod)")
    return Note("warning", "worker.never_starts", {
        "pod": name, "slot": slot, "node": node, "container": x.container,
        "reason": x.reason, "message": x.message, "waited_s": round(waited, 1),
        "in_a_row": starts.LIMIT}, EventSpec("Warning", "WorkerNeverStarts", "Keep", note))


def _quarantine(p: _Pass, s: Seen, st: Settings, found: list[failures.Failed], *,
                verdict: Verdict | None, suspects: set[str]) -> None:
    """Step 7c: a node where the job's workers keep failing for the node's own reasons gets no
    new worker of the job for a while, unless the nodes left cannot hold the job
    (quarantine.py); its end is said too."""
    live = [pod for pod in s.pods.values()
            if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
    placed: dict[str, int] = {}
    for pod in live:
        if node := pod.get("spec", {}).get("nodeName"):
            placed[node] = placed.get(node, 0) + 1
    # The nodes the job's workers run (or ran) on: where the scheduler can put them (the
    # template's selectors and affinities), which the supervisor cannot judge by itself.
    usable = [name for name, n in s.nodes.items()
              if (name in placed or name in p.c.quarantine.held) and node_problem(n) is None
              and not n.get("spec", {}).get("unschedulable")]
    fl = p.c.fleet
    need = max(len(fl.active()) if fl is not None else len(live), p.c.scale_request or 0)
    stuck = frozenset(s.listed_hosts.get(k.host, "") for k in verdict.stuck) if verdict else (
        frozenset())
    signs = quarantine_signs(found, p.c.leaving, stuck, st.plan.job)
    alike = {name: tuple(sorted((n.get("status", {}).get("allocatable") or {}).items()))
             for name, n in s.nodes.items()}
    # a current worker the scheduler has found no node for, for a while
    starved = any((t := plan.unschedulable_since(pod)) is not None
                  and s.wall - t >= quarantine.STARVED_S and _current(fl, pod, st.plan.job)
                  for pod in live)
    ch = quarantine.step(p.c.quarantine, signs, s.wall, st.quarantine, usable=usable,
                         placed=placed, need=need, down=suspects, alike=alike, starved=starved,
                         present={pod["metadata"].get("uid") for pod in s.pods.values()})
    q = st.quarantine

    def short(left: int, needed: int) -> str:
        return (f"the nodes left were seen to hold {left} of the {needed} workers the job needs"
                if left < needed else f"a worker of the job has found no node for "
                                      f"{quarantine.STARVED_S:g}s")

    for node, left, needed in ch.spared:
        p.todo.append(Note("info", "node.quarantine_spared", {
            "node": node, "can_hold": left, "need": needed, "reason": short(left, needed)}))
    if ch.q is p.c.quarantine:
        return
    for node, left, needed in ch.lifted:
        note = f"node {node}: quarantine lifted early: {short(left, needed)}"
        p.todo.append(Note("warning", "node.quarantine_lifted", {
            "node": node, "can_hold": left, "need": needed, "reason": short(left, needed)},
            EventSpec("Warning", "NodeQuarantineLifted", "Quarantine", note)))
    for node, n in ch.started:
        note = (f"node {node}: {n} failures of the job's workers there pointed at the node "
                f"within {q.window_s:g}s: no new worker of the job goes there for {q.ttl_s:g}s")
        p.todo.append(Note("warning", "node.quarantined", {"node": node, "failures": n,
                                                           "for_s": q.ttl_s},
                           EventSpec("Warning", "NodeQuarantined", "Quarantine", note)))
    for node in ch.ended:
        p.todo.append(Note("info", "node.released", {"node": node}, EventSpec(
            "Normal", "NodeReleased", "Quarantine",
            f"node {node}: quarantine over, new workers of the job may go there again")))
    p.c = replace(p.c, quarantine=ch.q)


def _announced(p: _Pass, s: Seen, st: Settings, suspects: set[str]) -> None:
    """Step 7b: the workers announced to go leave gracefully (see disruption.py); one whose
    node is only cordoned once its replacement runs (_move_ahead)."""
    fl = p.c.fleet
    if fl is None or not st.classify.graceful_leave:
        return
    moving: dict[str, str] = {}
    staying: set[str] = set()
    kept_off = _kept_off(p.c, s, st, suspects)
    leaving, failed = dict(p.c.leaving), set(p.c.failed)
    mode = st.plan.host_mode
    # Horovod needs a member of the last world to stay (it broadcasts the state from one):
    # the driver's last assignment (the hook), else the hosts published.
    driver = s.driver
    world = (set(driver.world) if driver is not None and driver.world_seq
             else set(s.listed_hosts))
    gone = {h for name in leaving if (q := s.pods.get(name)) is not None
            and (h := hostlist.host_of(q, mode))}
    waits = set()
    for i in fl.active():
        slot = fl.slots[i]
        name = pod_name(st.plan.job, i, slot.incarnation)
        pod = s.pods.get(name)
        if pod is None or (uid := pod["metadata"].get("uid", "")) in failed:
            continue
        node = pod.get("spec", {}).get("nodeName") or None
        n = disruption.notice(pod, s.nodes.get(node or ""), training_container(pod, st.classify),
                              st.disruption)
        ahead = pod_name(st.plan.job, i, slot.incarnation + 1)
        if n is None:
            _cancel_move(p, s, name, ahead)
            continue
        move = _Move(i, slot.incarnation + 1, name, node, ahead, n.detail)
        if n.why is disruption.Why.CORDONED and not _move_ahead(
                p, s, move, kept_off=kept_off, moving=moving, staying=staying):
            continue  # it trains on until its replacement runs
        host = hostlist.host_of(pod, mode)
        if host in world and not world - gone - {host}:
            waits.add(name)  # the last member of the world: once another joined
            if name not in p.c.leave_waits:
                p.todo.append(Note("info", "worker.leave_waits", {
                    "pod": name, "why": n.why.value,
                    "note": "the last worker of Horovod's world that stays: it leaves once "
                            "another one joined"}))
            continue
        gone.add(host or "")
        fl = fleet.leave(fl, i, s.wall, node)
        failed.add(uid)
        leaving[name] = plan.Leaving(i, uid, node, s.wall, n.why.value)
        new = pod_name(st.plan.job, i, slot.incarnation + 1)
        by = (f"its replacement {new} runs already" if n.why is disruption.Why.CORDONED
              else f"replaced by {new} now")
        note = (f"worker {name} on {node} is announced to go ({n.why.value}: {n.detail}): out "
                f"of the discovery file, Horovod lets it go at its next commit; {by}")
        p.todo.append(Note("info", "worker.leaving", {
            "pod": name, "node": node, "why": n.why.value, "detail": n.detail,
            "replacement": new}, EventSpec("Normal", "WorkerLeaving", "Leave", note)))
    if fl is not p.c.fleet:
        p.c = replace(p.c, fleet=fl, leaving=leaving, failed=p.c.failed | failed)
    if waits != p.c.leave_waits:
        p.c = replace(p.c, leave_waits=frozenset(waits))
    if moving != p.c.moving or staying != p.c.staying:
        p.c = replace(p.c, moving=moving, staying=frozenset(staying))


@dataclass(frozen=True)
class _Move:
    """A worker on a cordoned node (slot, pod, node) and its replacement placed ahead (the
    slot's next incarnation)."""

    slot: int
    incarnation: int  # the replacement's
    pod: str
    node: str | None
    ahead: str
    detail: str


def _move_ahead(p: _Pass, s: Seen, m: _Move, *, kept_off: set[str], moving: dict[str, str],
                staying: set[str]) -> bool:
    """A cordon alone evicts nothing: the worker leaves once its replacement, the slot's next
    incarnation placed ahead of the move (kept off the nodes that are going), runs; with
    nowhere to go that replacement stays Pending, the job keeps its size, and it moves when
    a node is there. A replacement that fails before it runs is deleted and the worker
    stays while the cordon lasts (no loop). Return whether the worker leaves now."""
    c = p.c
    q = s.pods.get(m.ahead)
    uid = q["metadata"].get("uid", "") if q is not None else ""
    if q is not None and uid not in c.failed and pod_problem(q, s.nodes) is None:
        return True
    if m.pod in c.staying or (q is not None and (
            uid in c.failed or q.get("status", {}).get("phase") in ("Succeeded", "Failed"))):
        staying.add(m.pod)
        if m.pod in c.staying:
            return False
        # Once, as it happens: a failed (or never started: _starts) replacement goes.
        if q is not None and not q["metadata"].get("deletionTimestamp"):
            p.c = replace(p.c, failed=p.c.failed | {uid})
            p.todo.append(DeletePod(m.ahead, uid, None))
        note = (f"worker {m.pod} on {m.node} ({m.detail}): its replacement {m.ahead} "
                "failed or never started: deleted; the worker trains on where it is while the "
                "cordon lasts (a cordon evicts nothing)")
        p.todo.append(Note("warning", "worker.stays", {
            "pod": m.pod, "node": m.node, "replacement": m.ahead}, EventSpec(
            "Warning", "WorkerStays", "Keep", note)))
        return False
    moving[m.pod] = m.ahead
    if m.pod not in c.moving:
        note = (f"worker {m.pod} on {m.node} is announced to go ({m.detail}): a cordon evicts "
                f"nothing, so {m.ahead} is placed first and the worker leaves once it runs; "
                "until then it trains on (with nowhere to go, the job keeps its size)")
        p.todo.append(Note("info", "worker.moving", {
            "pod": m.pod, "node": m.node, "replacement": m.ahead}, EventSpec(
            "Normal", "WorkerMoving", "Move", note)))
    if (q is None and m.ahead not in c.expected
            and m.ahead not in admission.waiting(c.blocked, s.now)):
        x = fleet.Create(m.slot, m.incarnation, m.ahead, m.node)
        p.todo.append(CreateWorker(x, tuple(sorted(kept_off)), _suspect_nodes(c, s.now),
                                   ahead_of=m.pod))
        p.c = replace(p.c, expected={**p.c.expected, m.ahead: s.now})
    return False


def _cancel_move(p: _Pass, s: Seen, name: str, ahead: str) -> None:
    """The cordon is over before the move: the replacement placed ahead goes (ours)."""
    q = s.pods.get(ahead)
    if q is None or q["metadata"].get("deletionTimestamp") or (
            uid := q["metadata"].get("uid", "")) in p.c.failed:
        return
    p.c = replace(p.c, failed=p.c.failed | {uid})
    p.todo.append(DeletePod(ahead, uid, None))
    note = (f"worker {name} is no longer announced to go (its node's cordon is over): "
            f"{ahead}, placed ahead of its move, deleted")
    p.todo.append(Note("info", "worker.move_cancelled", {"pod": name, "replacement": ahead},
                       EventSpec("Normal", "WorkerMoveCancelled", "Move", note)))


def _kept_off(c: Core, s: Seen, st: Settings, suspects: set[str]) -> set[str]:
    """Nodes down or silent, quarantined, or announced to go: a new worker is kept off them
    (and one kept off them is not created again while they are)."""
    kept_off = suspects | set(c.quarantine.until)
    if st.classify.graceful_leave:
        kept_off |= disruption.going_nodes(s.nodes.values(), st.disruption)
    return kept_off


def _suspect_nodes(c: Core, now: float) -> tuple[str, ...]:
    """Nodes where a worker hung lately: a new worker prefers others."""
    return tuple(sorted(n for n, t in c.hung_nodes.items() if now - t < HUNG_NODE_AVOID_S))


def _plan_fleet(p: _Pass, s: Seen, st: Settings, suspects: set[str]) -> None:
    """Step 8: the fleet's reconcile (plan.plan); the state saved before the creates."""
    c = p.c
    assert c.fleet is not None
    kept_off = _kept_off(c, s, st, suspects)
    out = plan.plan(plan.Picture(
        fleet=c.fleet, pods=s.pods, published=s.published or "", view_render=s.view_render,
        reuse_checked=c.reuse_checked, reused=c.reused, scale_request=c.scale_request,
        expected=c.expected, waiting=frozenset(admission.waiting(c.blocked, s.now)),
        ssh_clients=s.ssh_clients, now=s.now, wall=s.wall, failed=c.failed,
        lost_nodes=frozenset(kept_off), leaving=c.leaving), st.plan)
    p.c = replace(c, fleet=out.fleet, reused=out.reused, reuse_checked=out.reuse_checked,
                  scale_request=out.scale_request, expected=out.expected,
                  failed=c.failed | out.ours, leaving=out.leaving)
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
    suspect = _suspect_nodes(p.c, s.now)
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
        **fleet.fleet_to_dict(f), "limits": {"minWorkers": lo, "maxWorkers": hi},
        "desiredWorkers": len(f.active()), "restartLimit": st.policy.budgets.restart_limit}
    if quarantined:
        out["quarantined"] = {n: round(t, 1) for n, t in sorted(quarantined.items())}
    return out
