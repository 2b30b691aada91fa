"""THE LOOP: the one consumer of the trigger queue; owns the view and the horovodrun child.

Reflector threads put watch events and their own news on the queue, a waiter thread puts the
child's exit, signal handlers put signals. Each pass drains everything queued (coalescing bursts),
applies it to the view, and then, level-triggered from the whole view: renders the discovery
lines, decides the hosts to publish (pure `plan.listing`: new ones held back while survivors
regroup, one Horovod missed re-announced), publishes or withdraws the file (pure
`discovery.decide`), starts horovodrun once the view
is synced and MIN_NP slots are usable, forwards signals and kills the tree after the grace period.
A pass runs at least every RESYNC_SECONDS even without events (staleness, start timeout, reaping).

Failures: every pod event (and, while a node is down, every pass) runs the pure classifier on
the worker; the failed hosts are fenced and horovodrun's ssh clients to them killed first (a
frozen worker never closes them), then the pure `plan.on_failures` decides (policy, budgets,
force deletes of stranded or hung pods, a FailJob), and the pure `plan.plan` reconciles the
fleet from the whole picture (scale requests, scale-in deletes, reused addresses, expectations,
creates, the MIN_NP check); this module gathers their inputs and carries their outputs out:
the fleet's new state is saved before the replacements are created. Cluster changes go through
the injected `act` (the actuator thread), whose outcomes come back on the queue. A FailJob
rule, or too few workers left for MIN_NP, stops horovodrun and ends the run with a documented
code.

Decisions are logged once each under a dotted name and, where they change the job, posted as
Kubernetes Events through the injected `events` callable (never blocking).
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from supervisor import admission, discovery, fleet, hang, plan, regroup, reload
from supervisor.actuator import CreatePod, Op, SaveState
from supervisor.channel import HookChannel
from supervisor.classify import (
    Cause,
    ClassifySettings,
    Failure,
    NodeState,
    PodMemory,
    classify,
    disrupted,
    node_down_since,
    remember,
)
from supervisor.config import Config
from supervisor.discovery import Publish, Rendered
from supervisor.fleet import Fleet
from supervisor.hang import HangSettings, Verdict
from supervisor.launch import horovodrun_argv, horovodrun_env
from supervisor.metrics import Metrics
from supervisor.model import (
    ActionDone,
    ChildExited,
    EventSpec,
    ExitCode,
    LeadershipLost,
    PolicyChanged,
    SignalReceived,
    SourceState,
    Trigger,
    WatchEvent,
)
from supervisor.observe import (
    ClusterView,
    EventType,
    Kind,
    NodeLeases,
    Obj,
    SourceHealth,
)
from supervisor.workers import pod_name, worker_pod

PROGRESS_EVERY_S = 5.0
DRIVER_HELLO_WAIT_S = 30.0  # horovodrun's driver hook should have said hello by then
STALL_LOG_AFTER_S = 60.0  # no collective completed this long: said once in the log
HUNG_NODE_AVOID_S = 300.0  # replacements prefer other nodes this long after a hang on one


class ChildProcess(Protocol):
    """What the loop needs from the supervised child (supervisor.proc.Child)."""

    pid: int

    def wait(self, timeout: float | None = None) -> int: ...
    def signal_group(self, sig: int) -> None: ...
    def kill_tree(self, rounds: int = 3) -> int: ...
    def reap(self) -> list[int]: ...


@dataclass
class Outcome:
    """How the run ended: the exit code and a one-line reason."""

    code: int
    reason: str


@dataclass
class HangWatch:
    """What the loop remembers of the hook's signals for the current run of horovodrun."""

    run_started_at: float | None = None  # monotonic; None: no horovodrun running
    listed_since: dict[str, float] = field(default_factory=dict)  # host -> in the file since
    reported: set[str] = field(default_factory=set)  # one-time warnings of this run
    hung: set[str] = field(default_factory=set)  # UIDs of pods found Hung: never listed again
    hung_nodes: dict[str, float] = field(default_factory=dict)  # node -> a worker hung there
    regroup: regroup.Pending | None = None  # a failure the survivors have not regrouped from
    failed_at: dict[str, float] = field(default_factory=dict)  # host -> found failed (this run)
    horovodrun_restarts: int = 0  # restarts of horovodrun for a stall (whole supervisor life)
    # host -> (driver world sequence, out of the file until): announced again to Horovod
    reannounced: dict[str, tuple[int, float]] = field(default_factory=dict)


@dataclass
class LoopState:
    """Mutable state owned by the loop thread."""

    view: ClusterView = field(default_factory=ClusterView)
    # host string -> UID of the first pod that had it (Horovod blacklists names for good)
    first_owner: dict[str, str] = field(default_factory=dict)
    published: str | None = None  # current discovery content; None while withdrawn
    rendered: Rendered | None = None
    listed: Rendered | None = None  # the last render: what the view says is usable
    rendered_from: tuple[object, ...] = ()  # what `listed` was made of (view version, ...)
    memo: discovery.Memo = field(default_factory=discovery.Memo)
    child: ChildProcess | None = None
    stop_signal: int | None = None
    kill_at: float | None = None
    fatal: str | None = None
    crashed: bool = False
    # failure handling
    fleet: Fleet | None = None  # None: the supervisor does not own the workers
    saved: Fleet | None = None  # the fleet last handed to the actuator to save
    memory: dict[str, PodMemory] = field(default_factory=dict)  # by pod name
    failed: set[str] = field(default_factory=set)  # UIDs already classified as failed
    failures: list[tuple[Failure, Obj, float]] = field(default_factory=list)  # to decide
    node_down: dict[str, float] = field(default_factory=dict)  # node -> down since
    braked: frozenset[str] = frozenset()  # down nodes the disruption brake holds back
    lease_reported: set[str] = field(default_factory=set)  # nodes whose Lease is too slow
    # the pods of the active slots, for the fleet they were computed from
    active_pods: tuple[Fleet | None, frozenset[str] | None] = (None, None)
    reused: dict[int, int] = field(default_factory=dict)  # slot -> pods replaced for reused IPs
    reuse_checked: Rendered | None = None  # the render last looked at for reused IPs
    synced_at: float | None = None
    scanned: bool = False  # the first full classification after sync is done
    expected: dict[str, float] = field(default_factory=dict)  # pods being created -> since
    replace_from: dict[str, float] = field(default_factory=dict)  # new pod -> failure seen
    failing: tuple[int, str] | None = None  # the run is ending with this code and reason
    scale_request: int | None = None  # desired workers asked for, not applied yet
    scale_version: str | None = None  # resourceVersion of the last scale request seen
    blocked: dict[str, admission.Refusal] = field(default_factory=dict)  # creates refused
    gate_since: float = 0.0  # since when the start gate waits for MIN_NP slots
    hangs: HangWatch = field(default_factory=HangWatch)


class Supervisor:
    """Runs the loop for one `run` command. Adapters are injected; time comes from `clock`."""

    def __init__(
        self,
        cfg: Config,
        *,
        log: Any,
        metrics: Metrics,
        events: Callable[[EventSpec], None],
        start_child: Callable[[Sequence[str], Mapping[str, str]], ChildProcess],
        base_env: Mapping[str, str],
        act: Callable[[Op], None],
        kill_ssh_clients: Callable[[int, Collection[str]], dict[str, list[int]]],
        count_ssh_clients: Callable[[int, str], int],
        channel: HookChannel | None = None,
        workers: Fleet | None = None,
        owner: Mapping[str, str] | None = None,
        leases: NodeLeases | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.log, self.metrics, self.events = cfg, log, metrics, events
        self.start_child, self.base_env, self.clock = start_child, base_env, clock
        self.act, self.kill_ssh_clients, self.owner, self.wall = act, kill_ssh_clients, owner, wall
        self.count_ssh_clients = count_ssh_clients
        self.channel = channel
        self.hang_settings = HangSettings(silence_s=cfg.heartbeat_timeout_s,
                                          stall_s=cfg.stall_timeout_s)
        self.classify_settings = ClassifySettings(node_grace_s=cfg.node_grace_s,
                                                  lease_grace_s=cfg.node_lease_s)
        self.leases = leases if cfg.node_lease_s is not None else None
        self.queue: queue.Queue[Trigger] = queue.Queue()
        self.state = LoopState(fleet=workers)
        if workers is not None and cfg.worker_template is None:
            raise ValueError("a fleet needs the worker template")

    # -- inputs (any thread) ------------------------------------------------------------------

    def submit(self, item: Trigger) -> None:
        """Hand a trigger to the loop; never blocks (the queue is unbounded)."""
        self.queue.put_nowait(item)

    def handle_signal(self, signum: int, _frame: object = None) -> None:
        self.submit(SignalReceived(signum))

    # -- the loop (main thread) ---------------------------------------------------------------

    def run(self, command: Sequence[str]) -> Outcome:
        """Supervise until horovodrun exits or the start fails; return how it ended."""
        cfg = self.cfg
        argv = horovodrun_argv(cfg, command)
        st = self.state
        st.gate_since = self.clock()
        next_progress = next_reap = st.gate_since
        self._sync_discovery(st.gate_since, None)  # withdraw a file left by a previous run
        while True:
            batch = self._drain(self._timeout())
            now = self.clock()
            earliest, exited = self._apply(batch, now)
            if batch:
                self.log.debug("loop.batch", items=len(batch), pods=len(self.state.view.pods),
                               nodes=len(self.state.view.nodes))
            for kind, health in self.state.view.health.items():
                if health.last_event_at is not None:
                    self.metrics.watch_last_event_age.labels(kind.value).set(
                        max(0.0, now - health.last_event_at))
            if self.state.fatal:
                code = ExitCode.INTERNAL if self.state.crashed else ExitCode.KUBE_FATAL
                return self._finish(code, self.state.fatal)
            if self.state.view.synced:
                # The host list first: deciding on many failures at once (a lost node with 100
                # workers: ssh clients, logs, Events) must not delay what horovodrun reads.
                self._sync_discovery(now, earliest)
                self._manage(now)
                earliest = None  # what _manage changes (scale-in) is not a watch latency
            self._sync_discovery(now, earliest)
            st = self.state
            if exited is not None:
                if st.failing is not None:
                    return self._finish(*st.failing)
                if exited == ExitCode.HOOK_REFUSED:
                    return self._finish(exited, self._driver_refused())
                return self._finish(exited, f"horovodrun exited with {exited}")
            if st.child is None:
                if st.failing is not None:
                    return self._finish(*st.failing)
                if st.stop_signal is not None:
                    return self._finish(128 + st.stop_signal,
                                        f"stopped by signal {st.stop_signal} before start")
                slots = st.rendered.slots(cfg.slots_per_worker) if st.rendered else 0
                if st.view.synced and st.published is not None and slots >= cfg.min_np:
                    self._start(argv, slots)
                elif now - st.gate_since > cfg.start_timeout_s:
                    why = (f"only {slots} of {cfg.min_np} slots usable after "
                           f"{cfg.start_timeout_s:g}s (synced={st.view.synced})")
                    self.log.error("start.timeout", slots=slots, min_np=cfg.min_np,
                                   waited_s=round(now - st.gate_since, 1))
                    self.events(EventSpec("Warning", "StartTimeout", "Start", why))
                    return self._finish(ExitCode.START_TIMEOUT, why)
                elif now >= next_progress:
                    next_progress = now + PROGRESS_EVERY_S
                    self.log.info("start.waiting", slots=slots, min_np=cfg.min_np,
                                  synced=st.view.synced, workers=len(st.view.pods),
                                  left_out=dict(st.rendered.left_out) if st.rendered else {},
                                  waited_s=round(now - st.gate_since, 1))
            else:
                if now >= next_reap:  # a walk of the process table: not on every event
                    st.child.reap()
                    next_reap = now + min(1.0, cfg.resync_s)
                if st.kill_at is not None and now >= st.kill_at:
                    self._kill_tree("shutdown grace expired")

    def _timeout(self) -> float:
        """How long the next pass may wait for triggers: the tick, or a backoff deadline."""
        st = self.state
        timeout = self.cfg.resync_s
        if st.fleet is not None:
            wall = self.wall()
            due = fleet.next_due(st.fleet, wall)
            if due is not None:
                timeout = min(timeout, due - wall)
        if self.channel is not None and st.child is not None:
            # Look again the moment a process would have been silent for the threshold.
            silent = self.channel.next_silence(self.hang_settings.silence_s)
            if silent is not None:
                timeout = min(timeout, silent - self.clock() + 0.01)
        return max(0.005, timeout)

    def _drain(self, timeout: float) -> list[Trigger]:
        try:
            items = [self.queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                return items

    def _apply(self, batch: list[Trigger], now: float) -> tuple[float | None, int | None]:
        """Apply a batch; return (receipt time of the earliest view change, child exit code)."""
        st, earliest, exited = self.state, None, None
        for item in batch:
            if isinstance(item, WatchEvent) and item.kind is Kind.SCALE:
                self._scale_event(item)
            elif isinstance(item, WatchEvent):
                if item.kind is Kind.POD:
                    self._observe_pod(item)
                else:
                    self._observe_node(item)
                if st.view.apply(item.kind, item.type, item.obj):
                    earliest = item.at if earliest is None else min(earliest, item.at)
                health = st.view.health[item.kind]
                health.last_event_at = item.at
            elif isinstance(item, ActionDone):
                self._action_done(item, now)
            elif isinstance(item, PolicyChanged):
                self._policy_changed(item)
            elif isinstance(item, SourceState):
                self._source_state(item)
                # Only news that can change what is published (synced, reconnected) starts a
                # discovery-latency measurement; a bookmark does not.
                if item.synced or item.broken is False:
                    earliest = item.at if earliest is None else min(earliest, item.at)
            elif isinstance(item, ChildExited):
                if st.child is not None and item.pid in (None, st.child.pid):
                    exited = item.code  # (a horovodrun restarted for a stall is not news)
            elif isinstance(item, SignalReceived):
                self._on_signal(item.signum, now)
            elif isinstance(item, LeadershipLost):
                self._leadership_lost(item.reason, now)
        return earliest, exited

    # -- failures ------------------------------------------------------------------------------

    def _node_state(self, pod: Obj, now: float) -> NodeState:
        st = self.state
        name = pod.get("spec", {}).get("nodeName") or ""
        node = st.view.nodes.get(name)
        if name in st.braked:
            return NodeState(node=node)  # held back: no evidence against it for now
        down = st.node_down.get(name)
        if node is None and name and down is None:
            down = st.synced_at if st.synced_at is not None else now  # never seen since sync
        lease_age = self.leases.age(name, now) if self.leases is not None else None
        return NodeState(node=node, down_since=down, lease_age_s=lease_age)

    def _observe_pod(self, ev: WatchEvent) -> None:
        """Classify a pod event (once synced), then remember what it showed."""
        st, obj = self.state, ev.obj
        if ev.relist and ev.type is EventType.DELETED:
            # Deleted while the watch was down: the relist only knows its name. Judge it from
            # the last object seen (uid, labels, slot), not as a stranger.
            obj = st.view.pods.get(obj["metadata"]["name"]) or obj
        meta = obj["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        st.expected.pop(name, None)
        before = st.memory.get(name)
        if st.view.synced and uid not in st.failed:
            found = classify(obj, ev.type, before, self._node_state(obj, ev.at),
                             settings=self.classify_settings, now=ev.at, relisted=ev.relist)
            if found is not None:
                st.failed.add(uid)
                st.failures.append((found, obj, ev.at))
        if ev.type is EventType.DELETED:
            st.memory.pop(name, None)
            st.failed.discard(uid)
        else:
            st.memory[name] = remember(before, obj)

    def _observe_node(self, ev: WatchEvent) -> None:
        st, name = self.state, ev.obj["metadata"]["name"]
        node = None if ev.type is EventType.DELETED else ev.obj
        down = node_down_since(st.node_down.get(name), node, ev.at)
        if down is None:
            st.node_down.pop(name, None)
        else:
            st.node_down[name] = down

    def _manage(self, now: float) -> None:
        """Once synced: classify what time revealed, decide on failures, create workers."""
        st, cfg = self.state, self.cfg
        if st.synced_at is None:
            st.synced_at = now
            if st.fleet is not None:
                st.fleet = fleet.adopt(st.fleet, st.view.pods.values(), cfg.job_name)
        if st.child is not None and self.channel is not None:
            self._watch_hangs(now)
        suspects = set(st.node_down)
        if self.leases is not None and cfg.node_lease_s is not None:
            suspects |= self.leases.older_than(cfg.node_lease_s, now)
            self._report_slow_leases(cfg.node_lease_s)
        self._brake(suspects, now)
        if not st.scanned or suspects:
            for name, pod in st.view.pods.items():
                uid = pod["metadata"].get("uid", "")
                node = pod.get("spec", {}).get("nodeName")
                if uid in st.failed or (st.scanned and node not in suspects):
                    continue
                found = classify(pod, EventType.MODIFIED, st.memory.get(name),
                                 self._node_state(pod, now), settings=self.classify_settings,
                                 now=now)
                if found is not None:
                    st.failed.add(uid)
                    st.failures.append((found, pod, now))
            st.scanned = True
        wall = self.wall()
        failures, st.failures = st.failures, []
        # Only a host Horovod knew as this very pod: an IP the CNI handed to another pod
        # before or since is not this failure's to fence.
        hosts = {h for _, pod, _ in failures if (h := discovery.host_of(pod, cfg.host_mode))
                 and st.first_owner.get(h) == pod["metadata"].get("uid")}
        if hosts and self.channel is not None:
            # The driver skips them, survivors stalled on them leave their collective.
            t0 = time.perf_counter()
            pushed = self.channel.fence(hosts)
            self.log.info("worker.fenced", hosts=sorted(hosts), pushed_to=pushed,
                          push_ms=round((time.perf_counter() - t0) * 1000, 2))
        # One walk of horovodrun's tree for all of them (a lost node may take 100 workers).
        killed = (self.kill_ssh_clients(st.child.pid, hosts)
                  if st.child is not None and hosts else {})
        if failures:
            self._decide(failures, killed, now, wall)
        if failures and st.child is not None and self.channel is not None:
            snap = self.channel.snapshot()
            for host in hosts:
                st.hangs.failed_at.setdefault(host, now)
            if regroup.member_failed(hosts, snap.beats.values(),
                                     snap.driver.world if snap.driver else None):
                # New workers wait until the survivors regrouped (regroup.py).
                st.hangs.regroup = regroup.pending(snap.beats.values(), now)
        if st.fleet is None or st.failing is not None:
            if st.scale_request is not None:
                self._refuse_scale(st.scale_request, "the supervisor does not own the workers "
                                   "(SUPERVISOR_WORKER_TEMPLATE is not set)")
            return
        self._plan_fleet(suspects, now, wall)

    def _plan_fleet(self, suspects: set[str], now: float, wall: float) -> None:
        """The fleet's reconcile (plan.py, pure): gather the picture, plan, carry it out."""
        st, cfg = self.state, self.cfg
        assert st.fleet is not None
        settings = plan.Settings.of(cfg)
        published = st.published or ""
        child = st.child
        clients = {host: self.count_ssh_clients(child.pid, host) if child is not None else 0
                   for host in plan.retiring_hosts(st.fleet, st.view.pods, published, settings)}
        p = plan.plan(plan.Picture(
            fleet=st.fleet, pods=st.view.pods, published=published, listed=st.listed,
            reuse_checked=st.reuse_checked, reused=st.reused, scale_request=st.scale_request,
            expected=st.expected, waiting=frozenset(admission.waiting(st.blocked, now)),
            ssh_clients=clients, now=now, wall=wall), settings)
        st.fleet, st.reused, st.reuse_checked = p.fleet, dict(p.reused), p.reuse_checked
        st.scale_request, st.expected = p.scale_request, dict(p.expected)
        st.failed |= p.ours
        self._say(p.notes)
        for op in p.deletes:
            self.act(op)
        if st.fleet != st.saved:
            lo, hi = fleet.limits(cfg.min_np, cfg.max_np, cfg.slots_per_worker)
            self.act(SaveState({**fleet.fleet_to_dict(st.fleet),
                                "limits": {"minWorkers": lo, "maxWorkers": hi},
                                "desiredWorkers": len(st.fleet.active()),
                                "restartLimit": cfg.policy.budgets.restart_limit}))
            st.saved = st.fleet
            self.metrics.restart_budget_left.set(
                max(0, cfg.policy.budgets.restart_limit - st.fleet.ledger.total))
        for c in p.creates:
            body = worker_pod(cfg.worker_template, job=cfg.job_name,  # type: ignore[arg-type]
                              slot=c.slot, incarnation=c.incarnation, owner=self.owner,
                              avoid_node=c.avoid_node, lost_nodes=sorted(suspects),
                              suspect_nodes=self._hung_nodes(now))
            self.act(CreatePod(body))
        if p.fail is not None:
            self._fail(ExitCode.WORKERS_LOST, p.fail, now)

    def _brake(self, down: set[str], now: float) -> None:
        """Hold back the loss of nodes that went down together (classify.disrupted). Nodes
        released while still down get a fresh grace: they come back one by one."""
        st = self.state
        braked: frozenset[str] = frozenset()
        job_nodes: set[str] = set()
        if down and self.cfg.node_disruption_threshold is not None:
            job_nodes = {node for pod in st.view.pods.values()
                         if (node := pod.get("spec", {}).get("nodeName"))
                         and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")}
            braked = disrupted(job_nodes, down, self.cfg.node_disruption_threshold)
        if braked == st.braked:
            return
        for node in st.braked - braked:
            if node in st.node_down:
                st.node_down[node] = now
        if braked:
            note = (f"{len(braked)} of the {len(job_nodes)} nodes of the job's workers "
                    f"are down together ({', '.join(sorted(braked))}): their workers are held, "
                    f"not failed or force-deleted, until fewer are down "
                    f"(SUPERVISOR_NODE_DISRUPTION_THRESHOLD="
                    f"{self.cfg.node_disruption_threshold:g})")
            self.log.warning("node.disruption", nodes=sorted(braked), note=note)
            self.events(EventSpec("Warning", "NodeDisruption", "Hold", note))
        else:
            note = (f"fewer of the job's nodes are down now ({', '.join(sorted(st.braked))} "
                    "held before): node loss is handled again")
            self.log.info("node.disruption_over", nodes=sorted(st.braked))
            self.events(EventSpec("Normal", "NodeDisruptionOver", "Resume", note))
        st.braked = braked

    def _report_slow_leases(self, grace_s: float) -> None:
        """Say once per node that its Lease cannot tell silence within SUPERVISOR_NODE_LEASE_
        SECONDS (NodeLeases does not use it)."""
        assert self.leases is not None
        st = self.state
        for node, interval in self.leases.too_short(grace_s).items():
            if node in st.lease_reported:
                continue
            st.lease_reported.add(node)
            note = (f"SUPERVISOR_NODE_LEASE_SECONDS={grace_s:g} is not above node {node}'s "
                    f"Lease renew interval ({interval:g} s = leaseDurationSeconds / 4): its "
                    f"Lease is not used; only its Ready condition counts. Set it above "
                    f"{interval:g}")
            self.log.warning("node_lease.not_used", node=node, renew_interval_s=interval,
                             lease_seconds=grace_s)
            self.events(EventSpec("Warning", "NodeLeaseNotUsed", "Ignore", note))

    def _decide(self, failures: list[tuple[Failure, Obj, float]],
                killed: Mapping[str, list[int]], now: float, wall: float) -> None:
        """Decide on the failures (plan.on_failures, pure; their hosts already fenced, their
        ssh clients killed) and carry the decisions out."""
        st, cfg = self.state, self.cfg
        d = plan.on_failures(st.fleet, [
            plan.Failed(f, pod, seen_at, tuple(killed.get(host, ())) if (
                host := discovery.host_of(pod, cfg.host_mode)) else ())
            for f, pod, seen_at in failures], cfg.policy, plan.Settings.of(cfg), wall)
        st.fleet = d.fleet
        for op in d.deletes:
            self.act(op)
        for cause, action in d.counts:
            self.metrics.worker_failures.labels(cause, action).inc()
        self._say(d.notes)
        st.replace_from.update(d.replace_from)
        if d.fail is not None:
            self._fail(ExitCode.POLICY_FAILED, d.fail, now, event=False)

    def _say(self, notes: Sequence[plan.Note]) -> None:
        """Log each decision of a plan, and post its Event if it has one."""
        for note in notes:
            getattr(self.log, note.level)(note.event, **note.fields)
            if note.k8s is not None:
                self.events(note.k8s)

    # -- hangs (the hook's heartbeats: channel.py, hang.py) -----------------------------------

    def _watch_hangs(self, now: float) -> None:
        """Read the heartbeats, decide (hang.assess), and turn a hung worker into a failure of
        the usual path, a stalled job into a restart of horovodrun."""
        assert self.channel is not None
        st, h = self.state, self.state.hangs
        rendered = st.rendered
        listed = dict(rendered.hosts) if rendered is not None and st.published is not None \
            else {}
        h.listed_since = {host: h.listed_since.get(host, now) for host in listed}
        snap = self.channel.snapshot()
        started = h.run_started_at if h.run_started_at is not None else now
        world = ((snap.driver.world, snap.driver.world_at)
                 if snap.driver is not None and snap.driver.world_seq else None)
        verdict = hang.assess(snap.beats.values(), h.listed_since, started_at=started,
                              settings=self.hang_settings, now=now, failed_at=h.failed_at,
                              world=world)
        fresh = sum(1 for b in snap.beats.values()
                    if b.bye_at is None and now - b.last_seen < self.hang_settings.silence_s)
        self.metrics.heartbeating_processes.set(fresh)
        c = self.channel.counters
        for outcome, n in (("received", c.received), ("rejected", c.rejected),
                           ("stale", c.stale_runs), ("pushed", c.pushed),
                           ("replies", c.replies)):
            self.metrics.hook_datagrams.labels(outcome).set(n)
        progress = [b.progress_at for b in snap.beats.values() if b.progress_at is not None]
        if progress:
            self.metrics.last_progress_age.set(max(0.0, now - max(progress)))
        self._hang_warnings(verdict, snap.driver, now - started)
        exited = (snap.driver.exited if snap.driver is not None and st.stop_signal is None
                  and st.failing is None else {})
        found = plan.on_verdict(verdict, listed, st.view.pods, frozenset(st.failed), exited,
                                stall_timeout_s=self.cfg.stall_timeout_s, now=now)
        for failure, pod in found.failures:
            st.failed.add(failure.uid)
            h.hung.add(failure.uid)  # out of the discovery file: it looks usable, it is not
            if failure.cause is Cause.HUNG and failure.node:
                h.hung_nodes[failure.node] = now
            st.failures.append((failure, pod, now))
        self._say(found.notes)
        if found.restart is not None:
            self._restart_horovodrun(*found.restart, now)
        elif progress and now - max(progress) >= STALL_LOG_AFTER_S:
            if "stall-logged" not in h.reported:
                h.reported.add("stall-logged")
                self.log.warning("training.no_progress", seconds=round(now - max(progress)),
                                 stall_timeout_s=self.cfg.stall_timeout_s, heartbeating=fresh)
        else:
            h.reported.discard("stall-logged")

    def _hung_nodes(self, now: float) -> list[str]:
        """Nodes where a worker hung in the last HUNG_NODE_AVOID_S: replacements prefer others
        (the node may be the silent one, still Ready in the API for 40-50 s)."""
        h = self.state.hangs
        h.hung_nodes = {n: t for n, t in h.hung_nodes.items() if now - t < HUNG_NODE_AVOID_S}
        return sorted(h.hung_nodes)

    def _hang_warnings(self, verdict: Verdict, driver: Any, running_s: float) -> None:
        """The one-time Warning Events of a run: hosts without heartbeats, the hook's problems,
        a driver that never said the hook was loaded."""
        h = self.state.hangs
        if verdict.unmonitored and "unmonitored" not in h.reported:
            h.reported.add("unmonitored")
            hosts = list(verdict.unmonitored)
            self.log.warning("hang_detection.off", hosts=hosts, reason="no heartbeat")
            self.events(EventSpec(
                "Warning", "HangDetectionOff", "Detect",
                f"no heartbeat from {len(hosts)} listed worker(s) {hosts[:10]} after "
                f"{hang.UNMONITORED_AFTER_S:g}s: the hook is not loaded in their training "
                "processes (a worker image without the package at the launcher's path, python "
                "-I or -S, PYTHONPATH replaced), so hang detection and the fence are off for "
                "them"))
        for host, problem in verdict.problems:
            key = f"problem:{problem}"
            if key not in h.reported:
                h.reported.add(key)
                self.log.warning("hook.problem", host=host, problem=problem)
                self.events(EventSpec("Warning", "HookProblem", "Detect",
                                      f"the hook in a training process on {host}: {problem}; "
                                      "no fence and no hang detection for such processes"))
        if driver is None and running_s >= DRIVER_HELLO_WAIT_S and "driver" not in h.reported:
            h.reported.add("driver")
            self.log.error("hook.driver_missing", waited_s=round(running_s, 1))
            self.events(EventSpec(
                "Warning", "DriverNotHardened", "Detect",
                f"horovodrun's driver has not loaded the hook after {running_s:.0f}s (python -I "
                "or -S, PYTHONPATH replaced, or SUPERVISOR_HOROVODRUN is not horovodrun): a "
                "frozen or partitioned worker can hang it for good"))

    def _restart_horovodrun(self, reason: str, why: str, now: float) -> None:
        """Training cannot go on in this run of horovodrun: restart it (the processes told to
        exit, its whole tree killed, the start gate again), at most HOROVODRUN_RESTART_LIMIT
        times; then fail (exit 9). `reason`: the Event's reason (TrainingStalled,
        RendezvousBroken, RendezvousStuck)."""
        st, cfg, h = self.state, self.cfg, self.state.hangs
        if st.failing is not None or st.stop_signal is not None or st.child is None:
            return
        h.horovodrun_restarts += 1
        self.metrics.horovodrun_restarts.labels(reason).inc()
        if h.horovodrun_restarts > cfg.horovodrun_restart_limit:
            self._fail(ExitCode.STALLED, f"{why}; horovodrun was restarted "
                       f"{cfg.horovodrun_restart_limit} times already", now)
            return
        self.log.error("horovodrun.restarting", reason=reason, why=why,
                       restart=h.horovodrun_restarts, limit=cfg.horovodrun_restart_limit)
        self.events(EventSpec("Warning", reason, "Restart",
                              f"{why}: restarting horovodrun ({h.horovodrun_restarts} of "
                              f"{cfg.horovodrun_restart_limit}); the script resumes from its "
                              "checkpoint if it keeps one"))
        assert self.channel is not None
        self.channel.exit_run(f"{reason}: horovodrun is restarted")
        killed = st.child.kill_tree()
        self.log.info("horovodrun.killed", reason=reason, processes=killed)
        st.child = None
        st.gate_since = now
        st.hangs = replace(h, run_started_at=None, reported=set(), failed_at={}, regroup=None)
        self.metrics.horovodrun_up.set(0)

    def _driver_refused(self) -> str:
        """horovodrun exited HOOK_REFUSED: say why, once."""
        snap = self.channel.snapshot() if self.channel is not None else None
        problems = list(snap.driver.problems) if snap and snap.driver else []
        why = ("the hook refused to run horovodrun's elastic driver unhardened: "
               + ("; ".join(problems) or "see horovodrun's output"))
        self.log.error("hook.driver_refused", problems=problems)
        self.events(EventSpec("Warning", "DriverRefused", "Start", why))
        return why

    # -- scaling ---------------------------------------------------------------------------------

    def _scale_event(self, ev: WatchEvent) -> None:
        st = self.state
        if ev.type is EventType.DELETED:
            return
        rv = ev.obj["metadata"].get("resourceVersion")
        if rv == st.scale_version:
            return
        st.scale_version = rv
        raw = (ev.obj.get("data") or {}).get(fleet.SCALE_KEY)
        try:
            workers = int(json.loads(raw or "{}")["workers"])
            if workers < 0:
                raise ValueError("negative")
        except (ValueError, KeyError, TypeError) as e:
            self.log.error("scale.invalid", configmap=ev.obj["metadata"]["name"], data=raw,
                           reason=str(e))
            self.events(EventSpec("Warning", "ScaleRefused", "Scale",
                                  f"unreadable scale request {raw!r}: expected "
                                  '{"workers": N} (use `elastic-supervisor scale`)'))
            return
        st.scale_request = workers

    def _refuse_scale(self, workers: int, why: str) -> None:
        self.state.scale_request = None
        self.log.warning("scale.refused", workers=workers, reason=why)
        self.events(EventSpec("Warning", "ScaleRefused", "Scale",
                              f"scale to {workers} workers refused: {why}"))

    def _fail(self, code: int, reason: str, now: float, *, event: bool = True) -> None:
        """End the run with `code`: stop horovodrun (SIGTERM, then the tree after the grace)."""
        st = self.state
        if st.failing is not None:
            return
        st.failing = (int(code), reason)
        self.log.error("job.failing", code=int(code), reason=reason)
        if event:
            self.events(EventSpec("Warning", "JobFailing", "Fail", reason))
        if st.child is not None and st.stop_signal is None:
            st.stop_signal = signal.SIGTERM
            st.kill_at = now + self.cfg.shutdown_grace_s
            st.child.signal_group(signal.SIGTERM)

    def _action_done(self, done: ActionDone, now: float) -> None:
        st = self.state
        if done.fatal:
            st.fatal = f"{done.what} {done.name}: {done.error}"
            st.crashed = done.note == "bug"
            self.log.error("supervisor.crashed" if st.crashed else "kube.fatal",
                           action=done.what, name=done.name, reason=done.error)
            self.events(EventSpec("Warning", "SupervisorCrashed" if st.crashed
                                  else "KubernetesAccessDenied", "Act", st.fatal))
            return
        if done.retrying:
            self.log.warning("kube.retrying", action=done.what, name=done.name,
                             reason=done.error)
            return
        if done.refused:
            self._create_refused(done.name, done.error or "", now)
            return
        if done.error is not None:
            self.log.error("worker.create_failed" if done.what == "create" else "kube.failed",
                           action=done.what, name=done.name, reason=done.error)
            if done.what == "create":
                st.expected.pop(done.name, None)
                self._drop_slot_of(done.name, f"cannot create {done.name}: {done.error}")
            return
        if done.what == "create":
            self.metrics.workers_created.inc()
            started = st.replace_from.pop(done.name, None)
            latency = None if started is None else max(0.0, done.at - started)
            if latency is not None:
                self.metrics.replacement_latency.observe(latency)
            blocked = st.blocked.pop(done.name, None)
            self.log.info("worker.created", pod=done.name, note=done.note or None,
                          replacement_latency_ms=None if latency is None
                          else round(latency * 1000, 2),
                          refused_before=blocked.attempts if blocked else 0)
            self.events(EventSpec("Normal", "WorkerCreated", "Create",
                                  f"created worker pod {done.name}"
                                  + (f" ({done.note})" if done.note else "")))
        elif done.what == "delete":
            self.log.info("worker.deleted", pod=done.name, note=done.note or None)
        elif done.note:  # the ConfigMap had been deleted: stored again, budgets included
            self.log.warning("state.recreated", note=done.note)
            self.events(EventSpec("Warning", "StateRecreated", "Save",
                                  f"state ConfigMap {fleet.state_name(self.cfg.job_name)}: "
                                  f"{done.note}; created again from the supervisor's memory"))
        else:
            self.log.debug("state.saved")

    def _create_refused(self, name: str, reason: str, now: float) -> None:
        """Admission refused worker `name`: not fatal; try again after a backoff."""
        st = self.state
        st.expected.pop(name, None)
        before = st.blocked.get(name)
        r = st.blocked[name] = admission.refused(before, reason, now)
        wait = r.retry_at - now
        self.log.warning("worker.create_blocked", pod=name, reason=reason, attempt=r.attempts,
                         retry_in_s=round(wait, 1))
        if before is None or before.reason != reason:
            self.events(EventSpec("Warning", "ReplacementBlocked", "Create",
                                  f"cannot create worker {name}: {reason}; trying again in "
                                  f"{wait:.0f}s, then with backoff (refused {r.attempts} "
                                  "times); training goes on with the workers it has"))

    def _leadership_lost(self, reason: str, now: float) -> None:
        """Another launcher may drive the workers now: stop horovodrun at once (no grace)."""
        self.log.error("leader.lost", reason=reason)
        self.events(EventSpec("Warning", "LeadershipLost", "Lead",
                              f"{reason}; horovodrun stopped at once, exiting "
                              f"{int(ExitCode.LEADERSHIP_LOST)}"))
        self._fail(ExitCode.LEADERSHIP_LOST, f"leadership lost: {reason}", now, event=False)
        self._kill_tree("leadership lost")

    def _drop_slot_of(self, name: str, why: str) -> None:
        st = self.state
        if st.fleet is None:
            return
        for i, s in st.fleet.slots.items():
            if s.dropped is None and name == pod_name(self.cfg.job_name, i, s.incarnation):
                st.fleet = Fleet(slots={**st.fleet.slots, i: replace(s, dropped=why)},
                                 ledger=st.fleet.ledger)
                self.events(EventSpec("Warning", "WorkerCreateFailed", "Create", why))
                return

    def _policy_changed(self, change: PolicyChanged) -> None:
        file = str(self.cfg.policy_file)
        if change.policy is None:
            self.log.error("policy.rejected", file=file, problems=list(change.problems))
            self.events(EventSpec("Warning", "PolicyRejected", "Reload",
                                  f"{file}: kept the current policy; "
                                  + "; ".join(change.problems)))
            return
        diff = reload.summary(self.cfg.policy, change.policy)
        self.cfg = replace(self.cfg, policy=change.policy)
        self.state.saved = None  # store the new restart limit with the state (for `status`)
        self.metrics.restart_budget_left.set(max(0, change.policy.budgets.restart_limit - (
            self.state.fleet.ledger.total if self.state.fleet is not None else 0)))
        self.log.info("policy.reloaded", file=file, **diff)
        self.events(EventSpec("Normal", "PolicyReloaded", "Reload", f"{file}: {diff}"))

    def _source_state(self, s: SourceState) -> None:
        # The lease watch is not part of the view; only its fatal news come here.
        health = self.state.view.health.get(s.kind) or SourceHealth()
        health.last_event_at = s.at
        if s.synced:
            if not health.synced:
                self.log.info("watch.synced", kind=s.kind.value)
            health.synced = True
        if s.relisted:
            self.metrics.watch_relists.labels(s.kind.value).inc()
        if s.broken is True:
            if health.broken_since is None:
                health.broken_since = s.at
            self.log.warning("watch.broken", kind=s.kind.value, reason=s.reason)
            if s.fatal:
                self.state.fatal = f"watching {s.kind.value}s failed for good: {s.reason}"
                self.state.crashed = s.crashed
                self.log.error("supervisor.crashed" if s.crashed else "kube.fatal",
                               kind=s.kind.value, reason=s.reason)
                self.events(EventSpec("Warning", "SupervisorCrashed" if s.crashed
                                      else "KubernetesAccessDenied", "Watch", self.state.fatal))
        elif s.broken is False:
            if health.broken_since is not None:
                self.log.info("watch.connected", kind=s.kind.value,
                              broken_s=round(s.at - health.broken_since, 3))
            health.broken_since = None
            self.metrics.watch_connects.labels(s.kind.value).inc()

    def _sync_discovery(self, now: float, earliest: float | None) -> None:
        st, cfg = self.state, self.cfg
        retiring = frozenset() if st.fleet is None else frozenset(
            pod_name(cfg.job_name, i, st.fleet.slots[i].incarnation)
            for i in st.fleet.retiring())
        # Render only when something it reads changed: at 10,000 workers a render is ~10 ms
        # and the tick comes every RESYNC_SECONDS.
        failed = frozenset(st.hangs.hung)
        declared = frozenset(st.failed)
        if st.fleet is not None and st.active_pods[0] is not st.fleet:
            st.active_pods = (st.fleet, fleet.current_pods(st.fleet, cfg.job_name))
        active = st.active_pods[1] if st.fleet is not None else None
        inputs = (st.view.version, retiring, len(st.first_owner), failed, declared, active)
        if st.listed is None or inputs != st.rendered_from:
            st.listed = discovery.render(st.view, cfg.slots_per_worker, cfg.host_mode,
                                         st.first_owner, retiring=retiring, failed=failed,
                                         declared=declared, active=active, memo=st.memo)
            st.rendered_from = inputs
            self.metrics.workers_listed.set(len(st.view.pods))
            self.metrics.workers_live.set(st.listed.live)
        # New hosts may be held back while survivors regroup: that depends on the time too.
        rendered = self._listing(st.listed, now)
        if rendered is not st.rendered:
            self._report_membership(st.rendered, rendered)
            st.rendered = rendered
            self.metrics.workers_usable.set(len(rendered.lines))
        self.metrics.workers_desired.set(len(st.fleet.active()) if st.fleet is not None else 0)
        decision = discovery.decide(st.view.synced, st.view.broken_for(now), cfg.staleness_s,
                                    rendered)
        if isinstance(decision, Publish):
            if decision.content == st.published:
                return
            discovery.write_atomic(cfg.discovery_file, decision.content)
            written = self.clock()
            # Only hosts never published before (a set difference, not 10,000 lookups).
            for host in rendered.hosts.keys() - st.first_owner.keys():
                st.first_owner[host] = st.view.pods[rendered.hosts[host]]["metadata"]["uid"]
            self.metrics.discovery_writes.inc()
            latency = None if earliest is None else written - earliest
            if latency is not None:
                self.metrics.discovery_latency.observe(latency)
            self.log.info("discovery.written", hosts=len(rendered.lines),
                          slots=rendered.slots(cfg.slots_per_worker),
                          latency_ms=None if latency is None else round(latency * 1000, 2))
            st.published = decision.content
        elif st.published is not None or discovery.read_current(cfg.discovery_file) is not None:
            discovery.withdraw(cfg.discovery_file)
            self.metrics.discovery_withdrawals.inc()
            self.log.warning("discovery.withdrawn", reason=decision.reason)
            if st.child is not None:
                self.events(EventSpec("Warning", "DiscoveryWithdrawn", "Discovery",
                                      f"host list withdrawn: {decision.reason}"))
            st.published = None

    def _listing(self, listed: Rendered, now: float) -> Rendered:
        """The hosts to publish (plan.listing, pure): gather its inputs, keep its outputs."""
        st, h, cfg = self.state, self.state.hangs, self.cfg
        running = self.channel is not None and st.child is not None
        if not running:
            h.regroup = None
        beats = (tuple(self.channel.snapshot().beats.values())
                 if running and h.regroup is not None and self.channel is not None else ())
        driver = self.channel.driver() if running and self.channel is not None else None
        out = plan.listing(plan.Listing(
            listed=listed, published=st.published or "", regroup=h.regroup, beats=beats,
            driver=driver, listed_since=h.listed_since, reannounced=h.reannounced,
            held_said="held" in h.reported, running=running, now=now),
            cfg.slots_per_worker, cfg.min_np, cfg.max_np)
        h.regroup, h.reannounced = out.regroup, dict(out.reannounced)
        if out.held_said:
            h.reported.add("held")
        else:
            h.reported.discard("held")
        self._say(out.notes)
        return out.rendered

    def _report_membership(self, old: Rendered | None, new: Rendered) -> None:
        old_out = dict(old.left_out) if old else {}
        changed = {name: reason.value for name, reason in new.left_out.items()
                   if old_out.get(name) is not reason}
        if changed:
            shown = dict(sorted(changed.items())[:20])
            self.log.info("workers.unusable", changed=shown, more=len(changed) - len(shown),
                          unusable=len(new.left_out))
        before = set(old.hosts) if old else set()
        after = set(new.hosts)
        if before == after:
            return
        added, removed = sorted(after - before), sorted(before - after)
        left_out = {name: reason.value for name, reason in new.left_out.items()}
        self.log.info("workers.changed", added=added, removed=removed, usable=len(after),
                      left_out=left_out)
        if self.state.child is not None:
            self.events(EventSpec("Normal", "WorkersChanged", "Discovery",
                                  f"usable workers {len(after)}; added {added}; "
                                  f"removed {removed}"))

    def _start(self, argv: Sequence[str], slots: int) -> None:
        st, cfg = self.state, self.cfg
        hook = (self.channel.new_run(self.base_env.get("PYTHONPATH"))
                if self.channel is not None else None)
        child = self.start_child(argv, horovodrun_env(cfg, self.base_env, hook))
        st.child = child
        st.hangs = replace(st.hangs, run_started_at=self.clock(), reported=set(), failed_at={},
                           regroup=None)
        if self.channel is None or not cfg.worker_hook:
            why = ("SUPERVISOR_WORKER_HOOK=false" if self.channel is not None
                   else "the hook is not installed")
            self.log.warning("hang_detection.off", reason=why)
            self.events(EventSpec("Warning", "HangDetectionOff", "Start",
                                  f"{why}: the training processes are left alone, so no fence "
                                  "(survivors of a frozen or partitioned worker wait for the "
                                  "Gloo timeout) and no hang detection"))
        self.metrics.horovodrun_up.set(1)
        self.log.info("horovodrun.started", pid=child.pid, slots=slots, argv=list(argv))
        self.events(EventSpec("Normal", "HorovodrunStarted", "Start",
                              f"horovodrun started with {slots} usable slots "
                              f"(np {self.cfg.np}, min {self.cfg.min_np}, max {self.cfg.max_np})"))
        threading.Thread(target=self._wait_child, args=(child,), name="child-waiter",
                         daemon=True).start()

    def _wait_child(self, child: ChildProcess) -> None:
        self.submit(ChildExited(child.wait(), child.pid))

    def _on_signal(self, signum: int, now: float) -> None:
        st = self.state
        name = signal.Signals(signum).name
        if st.child is None:
            st.stop_signal = signum
            self.log.info("signal.received", signal=name, child=None)
            return
        if st.stop_signal is not None:
            self.log.warning("signal.repeated", signal=name)
            self._kill_tree(f"second {name}")
            return
        st.stop_signal = signum
        st.kill_at = now + self.cfg.shutdown_grace_s
        st.child.signal_group(signum)
        self.log.info("signal.forwarded", signal=name, pid=st.child.pid,
                      grace_s=self.cfg.shutdown_grace_s)
        self.events(EventSpec("Normal", "Stopping", "Stop",
                              f"{name} forwarded to horovodrun; killing its process tree after "
                              f"{self.cfg.shutdown_grace_s:g}s"))

    def _kill_tree(self, why: str) -> None:
        st = self.state
        if st.child is None:
            return
        n = st.child.kill_tree()
        st.kill_at = None
        self.log.warning("shutdown.killed_tree", reason=why, processes=n)

    def _finish(self, code: int, reason: str) -> Outcome:
        st = self.state
        if st.child is not None:
            leftovers = st.child.kill_tree()
            self.metrics.horovodrun_up.set(0)
            level = self.log.info if code == 0 else self.log.warning
            level("horovodrun.exited", code=code, leftovers_killed=leftovers)
            self.events(EventSpec("Normal" if code == 0 else "Warning", "HorovodrunExited",
                                  "Exit", f"horovodrun exited with {code}"))
        return Outcome(int(code), reason)

