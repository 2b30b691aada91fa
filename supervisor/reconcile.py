"""THE LOOP: the one consumer of the trigger queue; owns the view and the horovodrun child.

Reflector threads put watch events and their own news on the queue, a waiter thread puts the
child's exit, signal handlers put signals. Each pass drains everything queued (coalescing bursts),
applies it to the view, and then, level-triggered from the whole view: renders the discovery
lines, decides the hosts to publish (pure `listing.listing`: new ones held back while survivors
regroup, one Horovod missed re-announced), publishes or withdraws the file (pure
`hostlist.decide`), starts horovodrun once the view
is synced and MIN_NP slots are usable, forwards signals and kills the tree after the grace period.
A pass runs at least every RESYNC_SECONDS even without events (staleness, start timeout, reaping).

Decisions: every pod event is classified as it comes (classify.py, pure) into the decisions'
memory (`LoopState.core`); then, once synced, one pure function decides the pass
(`core.manage`: the hang watch's verdict, the disruption brake, a scan while nodes are
suspect, the policy on the failures, the fleet's reconcile) and returns the memory of the next
pass and a script that this module carries out in order: fence the failed hosts, kill
horovodrun's ssh clients to them, restart horovodrun, delete, save the fleet's state, create,
fail the job. This module only gathers what the decisions read (the view, the heartbeats, ssh
clients of retiring hosts, the clocks) and does what they ask. Cluster changes go through the
injected `act` (the actuator thread), whose outcomes come back on the queue. A FailJob rule,
too few workers left for MIN_NP, or a stall past the restart limit stops horovodrun and ends
the run with a documented code.

Decisions are logged once each under a dotted name and, where they change the job, posted as
Kubernetes Events through the injected `events` callable (never blocking).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor import reload
from supervisor.channel import HookChannel, Snapshot
from supervisor.config import Config
from supervisor.decide import (
    accounting,
    core,
    fleet,
    hostlist,
    incidents,
    memory,
    on,
    plan,
    progress,
    script,
    start,
)
from supervisor.decide.classify import (
    NodeState,
    PodMemory,
)
from supervisor.decide.fleet import Fleet
from supervisor.decide.memory import Core
from supervisor.decide.script import CreatePod, KeepBudget, Op, SaveState
from supervisor.horovodrun import ChildProcess, Horovodrun, Outcome
from supervisor.hostfile import HostFile
from supervisor.launch import horovodrun_argv
from supervisor.metrics import Metrics
from supervisor.model import (
    ActionDone,
    ChildExited,
    EventSpec,
    ExitCode,
    LeadershipLost,
    LeadershipPaused,
    LeadershipResumed,
    PolicyChanged,
    SignalReceived,
    SourceState,
    Trigger,
    WatchEvent,
)
from supervisor.nodeleases import NodeLeases
from supervisor.observe import (
    ClusterView,
    EventType,
    Kind,
    Obj,
    SourceHealth,
)
from supervisor.reports import Reports
from supervisor.workers import disruption_budget, worker_pod

PROGRESS_EVERY_S = 5.0


@dataclass
class LoopState:
    """What the loop thread holds: the decisions' memory (`core`, written only by decide/), the
    view, each pod's watch memory, a watch's or an action's fatal error, and when each
    replacement's failure was seen (for the latency metric)."""

    core: Core
    view: ClusterView = field(default_factory=ClusterView)
    fatal: str | None = None
    crashed: bool = False
    memory: dict[str, PodMemory] = field(default_factory=dict)  # by pod name
    replace_from: dict[str, float] = field(default_factory=dict)  # new pod -> failure seen


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
        stored: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.log, self.metrics, self.events = cfg, log, metrics, events
        self.start_child, self.base_env, self.clock = start_child, base_env, clock
        self.act, self.kill_ssh_clients, self.owner, self.wall = act, kill_ssh_clients, owner, wall
        self.count_ssh_clients = count_ssh_clients
        self.channel = channel
        self.hang_settings = memory.hang_settings(cfg)
        self.reports = Reports(cfg, log=log, events=events, metrics=metrics, channel=channel,
                               hang_settings=self.hang_settings)
        self.horovodrun = Horovodrun(cfg, log=log, events=events, metrics=metrics,
                               reports=self.reports, channel=channel, start_child=start_child,
                               base_env=base_env, submit=self.submit, clock=clock)
        self.hostfile = HostFile(cfg, log=log, events=events, metrics=metrics,
                                 reports=self.reports, channel=channel,
                                 hang_settings=self.hang_settings, clock=clock)
        self.sizes = start.Sizes(cfg.np, cfg.min_np, cfg.max_np)
        self.leases = leases if cfg.node_lease_s is not None else None
        # SimpleQueue: handle_signal puts from a signal handler, which interrupts the main
        # thread anywhere, even inside this queue's get; a queue.Queue's Lock would deadlock.
        self.queue: queue.SimpleQueue[Trigger] = queue.SimpleQueue()
        self.state = LoopState(core=Core(
            fleet=workers, progress=progress.from_dict((stored or {}).get("progress")),
            book=incidents.from_list((stored or {}).get("incidents"))))
        if workers is not None and cfg.worker_template is None:
            raise ValueError("a fleet needs the worker template")

    # -- inputs (any thread) ------------------------------------------------------------------

    def submit(self, item: Trigger) -> None:
        """Hand a trigger to the loop; never blocks (the queue is unbounded)."""
        self.queue.put_nowait(item)

    def handle_signal(self, signum: int, _frame: object = None) -> None:
        self.submit(SignalReceived(signum))

    # -- the loop (main thread) ---------------------------------------------------------------

    def run(self, command: Sequence[str], adopted: ChildProcess | None = None) -> Outcome:
        """Supervise until horovodrun exits or the start fails; return how it ended.
        `adopted`: a horovodrun already running (sidecar mode: started for a supervisor of
        this pod that died), supervised as if this one had started it."""
        cfg, hr = self.cfg, self.horovodrun
        horovodrun_argv(cfg, command)  # a bad command fails before anything starts
        st = self.state
        st.core = on.gate_opened(st.core, self.clock())
        next_progress = next_reap = st.core.gate_since
        self._sync_discovery(st.core.gate_since, None)  # withdraw a file left by a previous run
        if adopted is not None:
            self.horovodrun.running(adopted, adopted=True)
            self.state.core = on.horovodrun_started(self.state.core)
        while True:
            batch = self._drain(self._timeout())
            now = self.clock()
            if self.channel is not None:
                self.channel.revive()  # its receiver thread, if it ended: said, started again
            earliest, exited = self._apply(batch, now)
            if earliest is not None and self.channel is not None:
                self.channel.bind_hosts(hostlist.addresses(self.state.view.pods.values(),
                                                            cfg.host_mode))
            if batch:
                self.log.debug("loop.batch", items=len(batch), pods=len(self.state.view.pods),
                               nodes=len(self.state.view.nodes))
            for kind, health in self.state.view.health.items():
                if health.last_event_at is not None:
                    self.metrics.watch_last_event_age.labels(kind.value).set(
                        max(0.0, now - health.last_event_at))
            if self.state.fatal:
                code = ExitCode.INTERNAL if self.state.crashed else ExitCode.KUBE_FATAL
                return self.horovodrun.finish(code, self.state.fatal)
            if self.state.view.synced:
                # The host list first: deciding on many failures at once (a lost node with 100
                # workers: ssh clients, logs, Events) must not delay what horovodrun reads.
                self._sync_discovery(now, earliest)
                self._manage(now)
                earliest = None  # what _manage changes (scale-in) is not a watch latency
            self._sync_discovery(now, earliest)
            st = self.state
            if st.core.held_exit is not None and st.core.failing is not None:
                return self.horovodrun.finish(*st.core.failing)  # the Lease lost meanwhile
            st.core, exited, held = on.exit_seen(st.core, exited)
            if held:
                self.log.warning("horovodrun.exit_held", code=st.core.held_exit, reason=(
                    "horovodrun exited while this launcher cannot renew the leader Lease: "
                    "another launcher may have taken the workers; judged once the Lease says "
                    "whose the job is"))
            if exited is not None:
                snap = self.channel.snapshot() if self.channel is not None else None
                end = start.ended(exited, failing=st.core.failing, stop_signal=hr.stop_signal,
                                  driver_problems=snap.driver.problems
                                  if snap is not None and snap.driver is not None else ())
                self.reports.say(() if end.note is None else (end.note,))
                return self.horovodrun.finish(end.code, end.reason, horovodrun=end.horovodrun)
            if self.horovodrun.child is None:
                end = start.not_started(failing=st.core.failing, stop_signal=hr.stop_signal)
                if end is not None:
                    return self.horovodrun.finish(end.code, end.reason)
                listed = self.hostfile.host_list
                slots = listed.slots(cfg.slots_per_worker) if listed else 0
                step = start.gate(self.sizes, synced=st.view.synced,
                                  published=self.hostfile.published is not None, slots=slots,
                                  restart=memory.horovodrun_restarts(st.core) > 0,
                                  waited_s=now - st.core.gate_since, timeout_s=cfg.start_timeout_s)
                if isinstance(step, start.Start):
                    self.horovodrun.start(horovodrun_argv(cfg, command, step.np), slots, step.np)
                    st.core = on.horovodrun_started(st.core)
                elif isinstance(step, start.GiveUp):
                    self.log.error("start.timeout", slots=slots, min_np=cfg.min_np,
                                   waited_s=round(now - st.core.gate_since, 1))
                    self.events(EventSpec("Warning", "StartTimeout", "Start", step.reason))
                    return self.horovodrun.finish(step.code, step.reason)
                elif now >= next_progress:
                    next_progress = now + PROGRESS_EVERY_S
                    self.log.info("start.waiting", slots=slots, min_np=cfg.min_np,
                                  synced=st.view.synced, workers=len(st.view.pods),
                                  left_out=dict(listed.left_out) if listed else {},
                                  waited_s=round(now - st.core.gate_since, 1))
            else:
                if now >= next_reap:  # a walk of the process table: not on every event
                    self.horovodrun.child.reap()
                    next_reap = now + min(1.0, cfg.resync_s)
                self.horovodrun.tick(now)

    def _timeout(self) -> float:
        """How long the next pass may wait for triggers: the tick, or a backoff deadline."""
        st = self.state
        timeout = self.cfg.resync_s
        if st.core.fleet is not None:
            wall = self.wall()
            due = fleet.next_due(st.core.fleet, wall)
            if due is not None:
                timeout = min(timeout, due - wall)
        if self.channel is not None and self.horovodrun.child is not None:
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
                if (child := self.horovodrun.child) is not None and item.pid in (None, child.pid):
                    exited = item.code  # (a horovodrun restarted for a stall is not news)
            elif isinstance(item, SignalReceived):
                self.horovodrun.on_signal(item.signum, now)
            elif isinstance(item, LeadershipLost):
                self._leadership_lost(item.reason, now)
            elif isinstance(item, LeadershipPaused):
                st.core = on.leadership(st.core, paused=True)
                self.log.warning("leader.paused", reason=item.reason)
            elif isinstance(item, LeadershipResumed):
                st.core = on.leadership(st.core, paused=False)
                self.log.info("leader.resumed", paused_s=round(item.paused_s, 1))
                self.events(EventSpec(
                    "Normal", "LeadershipResumed", "Lead",
                    f"the leader Lease was renewed again after {item.paused_s:.0f}s unreachable; "
                    "training went on, nothing was created or deleted meanwhile"))
        return earliest, exited

    # -- failures ------------------------------------------------------------------------------

    def _node_state(self, pod: Obj, now: float) -> NodeState:
        name = pod.get("spec", {}).get("nodeName") or ""
        lease_age = self.leases.age(name, now) if self.leases is not None else None
        return memory.node_state(self.state.core, self.state.view.nodes, pod, lease_age, now)

    def _observe_pod(self, ev: WatchEvent) -> None:
        """Classify a pod event (once synced), then remember what it showed."""
        st, obj = self.state, ev.obj
        if ev.relist and ev.type is EventType.DELETED:
            # Deleted while the watch was down: the relist only knows its name. Judge it from
            # the last object seen (uid, labels, slot), not as a stranger.
            obj = st.view.pods.get(obj["metadata"]["name"]) or obj
        meta = obj["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        before = st.memory.get(name)
        settings = memory.classify_settings(self.cfg)
        judged = st.view.synced and uid not in st.core.failed
        st.core, record = on.pod_seen(
            st.core, on.PodEvent(ev.type, obj, ev.at, ev.relist), before,
            synced=st.view.synced, node=self._node_state(obj, ev.at), settings=settings)
        if judged:
            self.reports.helper_exits(obj, before, settings)
        if record is None:
            st.memory.pop(name, None)
            self.reports.forget_pod(uid)
        else:
            st.memory[name] = record

    def _observe_node(self, ev: WatchEvent) -> None:
        st = self.state
        st.core = on.node_seen(st.core, ev.obj["metadata"]["name"],
                               None if ev.type is EventType.DELETED else ev.obj, ev.at)

    def _manage(self, now: float) -> None:
        """Once synced: gather what the decisions read, decide (core.manage, pure), carry the
        script out in order."""
        st, cfg, c = self.state, self.cfg, self.state.core
        settings = memory.Settings.of(cfg)
        child = self.horovodrun.child
        running = child is not None
        hooked = self.channel is not None
        snap = self.channel.snapshot() if hooked and running and self.channel else None
        stale: frozenset[str] = frozenset()
        if self.leases is not None and cfg.node_lease_s is not None:
            stale = frozenset(self.leases.older_than(cfg.node_lease_s, now))
            self.reports.slow_leases(self.leases, cfg.node_lease_s)
        hf = self.hostfile
        published = hf.published or ""
        clients = {} if c.fleet is None else {
            host: self.count_ssh_clients(child.pid, host) if child is not None else 0
            for host in plan.retiring_hosts(c.fleet, st.view.pods, published, settings.plan,
                                            c.leaving)}
        host_list = hf.host_list
        p = core.manage(c, memory.Seen(
            pods=st.view.pods, nodes=st.view.nodes, memory=st.memory,
            lease_ages=self.leases.ages(now) if self.leases is not None else None,
            lease_stale=stale, first_owner=hf.first_owner, published=hf.published,
            view_render=hf.view_render,
            listed_hosts=host_list.hosts if host_list is not None and hf.published is not None
            else {},
            hooked=hooked, running=running, stopping=self.horovodrun.stop_signal is not None,
            started_at=self.horovodrun.started_or(now),
            beats=tuple(snap.beats.values()) if snap is not None else (),
            driver=snap.driver if snap is not None else None,
            ssh_clients=clients, now=now, wall=self.wall(), api_back_at=st.core.api_back_at),
            settings)
        st.core = p.core
        st.replace_from.update(p.replace_from)
        for cause, action in p.counts:
            self.metrics.worker_failures.labels(cause, action).inc()
        for todo in p.todo:
            if isinstance(todo, plan.Note) and todo.event == "worker.leaving":
                self.metrics.worker_leaves.labels(todo.fields["why"]).inc()
        self.metrics.nodes_quarantined.set(len(p.core.quarantine.until))
        for reason in p.restarts:
            self.metrics.horovodrun_restarts.labels(reason).inc()
        if snap is not None and p.verdict is not None:
            self.reports.hangs(snap, p.verdict, restarting=bool(p.restarts), now=now,
                               started=self.horovodrun.started_or(now))
        saving = self._account(p, snap, now)
        for todo in p.todo:
            self._carry_out(todo, now)
        if saving and c.fleet is not None and not any(isinstance(t, SaveState) for t in p.todo):
            self._carry_out(SaveState(core.state_of(p.core.fleet or c.fleet, settings,
                                                    p.core.quarantine.until)), now)

    def _account(self, p: memory.Pass, snap: Snapshot | None, now: float) -> bool:
        """The progress and the incidents after this pass (accounting.py, pure): keep them,
        their metrics and lines; return whether the state is due to be saved for them."""
        st, cfg, m = self.state, self.cfg, self.metrics
        fl = p.core.fleet
        desired = (len(fl.active()) if fl is not None else 0) * cfg.slots_per_worker or cfg.np
        before = st.core.progress
        a = accounting.account(before, st.core.book, p.todo,
                               snap.beats.values() if snap is not None else (), st.view.pods,
                               desired=desired, mode=cfg.host_mode, job=cfg.job_name,
                               now=now, wall=self.wall(), saved_at=st.core.progress_saved_at)
        st.core = on.accounted(st.core, a)
        after = a.progress
        m.training_steps.inc(after.step - before.step)
        m.steps_recomputed.inc(after.redone - before.redone)
        m.productive_worker_seconds.inc(max(0.0, after.productive_ws - before.productive_ws))
        m.lost_worker_seconds.inc(max(0.0, after.lost_ws - before.lost_ws))
        m.training_step_rate.set(after.rate())
        m.world_size.set(after.world or 0)
        m.world_size_desired.set(desired)
        good, good_any = after.goodput()
        if good is not None and good_any is not None:
            m.goodput.labels("full").set(good)
            m.goodput.labels("any").set(good_any)
        for inc, phase in a.reached:
            if phase == "detected":
                m.incidents.labels(inc.cause, inc.kind).inc()
                self.log.info("incident.opened", incident=inc.id, cause=inc.cause,
                              kind=inc.kind, pods=list(inc.pods), step=after.step)
                continue
            m.incident_phase.labels(phase, inc.kind).observe(
                max(0.0, inc.phases[phase] - inc.phases["detected"]))
        for inc in a.closed:
            self.reports.incident_closed(inc)
        return a.save

    def _carry_out(self, todo: memory.Todo, now: float) -> None:
        """One item of core.manage's script."""
        st, cfg = self.state, self.cfg
        if isinstance(todo, plan.Note):
            self.reports.say((todo,))
        elif isinstance(todo, script.Fence):
            assert self.channel is not None
            t0 = time.perf_counter()
            pushed = self.channel.fence(todo.hosts)
            self.log.info("worker.fenced", hosts=sorted(todo.hosts), pushed_to=pushed,
                          push_ms=round((time.perf_counter() - t0) * 1000, 2))
        elif isinstance(todo, script.KillSsh):
            if self.horovodrun.child is None:
                return
            # One walk of horovodrun's tree for all of them (a lost node may take 100).
            killed = self.kill_ssh_clients(self.horovodrun.child.pid, todo.pods.keys())
            for host, pod in sorted(todo.pods.items()):
                self.log.info("worker.ssh_clients_killed", pod=pod, host=host,
                              pids=killed.get(host, []))
        elif isinstance(todo, script.RestartHorovodrun):
            if self.horovodrun.restart(todo, now):
                st.core = on.gate_opened(st.core, now)
        elif isinstance(todo, SaveState):
            self.act(SaveState({**todo.state, "progress": progress.to_dict(st.core.progress),
                                "incidents": incidents.to_list(st.core.book)}))
            fl = st.core.fleet
            self.metrics.restart_budget_left.set(max(0, cfg.policy.budgets.restart_limit - (
                fl.ledger.total if fl is not None else 0)))
        elif isinstance(todo, script.CreateWorker):
            x = todo.create
            self.act(CreatePod(worker_pod(
                cfg.worker_template, job=cfg.job_name,  # type: ignore[arg-type]
                slot=x.slot, incarnation=x.incarnation, owner=self.owner,
                avoid_node=x.avoid_node, lost_nodes=list(todo.lost_nodes),
                suspect_nodes=list(todo.suspect_nodes), ahead_of=todo.ahead_of,
                hold_in=cfg.worker_container or cfg.worker_template[  # type: ignore[index]
                    "spec"]["containers"][0]["name"])))
        elif isinstance(todo, script.KeepMinAvailable):
            self.act(KeepBudget(disruption_budget(
                fleet.budget_name(cfg.job_name), cfg.job_name, todo.min_available, self.owner)))
        elif isinstance(todo, script.FailJob):
            self._failing(todo, now)
        else:
            self.act(todo)

    # -- scaling ---------------------------------------------------------------------------------

    def _scale_event(self, ev: WatchEvent) -> None:
        st = self.state
        if ev.type is EventType.DELETED:
            return
        st.core, refused = on.scale_seen(st.core, ev.obj, plan.Settings.of(self.cfg))
        self.reports.say(() if refused is None else (refused,))

    def _fail(self, code: int, reason: str, now: float, *, event: bool = True) -> None:
        """End the run with `code` (unless it ends already)."""
        self.state.core, failing = memory.fail(self.state.core, code, reason, event=event)
        if failing is not None:
            self._failing(failing, now)

    def _failing(self, f: script.FailJob, now: float) -> None:
        """The run ends: stop horovodrun (SIGTERM, then the tree after the grace)."""
        self.log.error("job.failing", code=f.code, reason=f.reason)
        if f.event:
            self.events(EventSpec("Warning", "JobFailing", "Fail", f.reason))
        self.horovodrun.stop(now)

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
            st.core, note = on.create_refused(st.core, done.name, done.error or "", now)
            self.reports.say((note,))
            return
        if done.what == "budget":
            self.reports.budget_done(done, st.core.budget)
            return
        if done.error is not None:
            self.log.error("worker.create_failed" if done.what == "create" else "kube.failed",
                           action=done.what, name=done.name, reason=done.error)
            if done.what == "create":
                st.core, notes = on.create_failed(
                    st.core, done.name, f"cannot create {done.name}: {done.error}",
                    self.cfg.job_name)
                self.reports.say(notes)
            return
        if done.what == "create":
            self.metrics.workers_created.inc()
            started = st.replace_from.pop(done.name, None)
            latency = None if started is None else max(0.0, done.at - started)
            if latency is not None:
                self.metrics.replacement_latency.observe(latency)
            st.core, blocked = on.created(st.core, done.name)
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

    def _leadership_lost(self, reason: str, now: float) -> None:
        """Another launcher may drive the workers now: stop horovodrun at once (no grace)."""
        self.log.error("leader.lost", reason=reason)
        self.events(EventSpec("Warning", "LeadershipLost", "Lead",
                              f"{reason}; horovodrun stopped at once, exiting "
                              f"{int(ExitCode.LEADERSHIP_LOST)}"))
        self._fail(ExitCode.LEADERSHIP_LOST, f"leadership lost: {reason}", now, event=False)
        self.horovodrun.kill_tree("leadership lost")

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
        # Store the new restart limit with the state (for `status`).
        self.state.core = on.policy_reloaded(self.state.core)
        fl = self.state.core.fleet
        self.metrics.restart_budget_left.set(max(0, change.policy.budgets.restart_limit - (
            fl.ledger.total if fl is not None else 0)))
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
                if s.kind is Kind.NODE:  # nodes it marks now may be its outage's artefact
                    self.state.core = on.node_watch_back(self.state.core, s.at,
                                                         s.at - health.broken_since)
            health.broken_since = None
            self.metrics.watch_connects.labels(s.kind.value).inc()

    def _sync_discovery(self, now: float, earliest: float | None) -> None:
        st = self.state
        st.core = on.listed(st.core, self.hostfile.sync(
            st.core, st.view, running=self.horovodrun.child is not None, now=now,
            earliest=earliest))

