"""THE LOOP: the one consumer of the trigger queue; it owns the adapters' handles.

Reflector threads put watch events and their own news on the queue, a waiter thread puts the
child's exit, signal handlers put signals, the actuator its outcomes. Each pass drains everything
queued (coalescing bursts) and hands each trigger to what owns it: the watches (`watches.py`:
the view, each pod's watch memory, `on.pod_seen` and the like), the actuator's outcomes
(`outcomes.py`), horovodrun (`horovodrun.py`: signals, its exit). Then, level-triggered from the
whole view: the host list (`hostfile.py`: `listing.listing`, `hostlist.decide`, the file), the
pass (`core.manage`, pure: the hang watch's verdict, the disruption brake, the policy on the
failures, the fleet's reconcile), whose script it carries out in order (fence, kill ssh
clients, restart horovodrun, delete, save, create, fail the job), and the start gate
(`start.gate`). A pass runs at least every RESYNC_SECONDS even without events.

The decisions' memory (`decide.memory.Memory`) is kept here and written only by `decide/`: the
loop keeps what a decide function returned and never builds a changed memory itself
(tests/unit/test_loop_writes.py). Everything said goes through `reports.py` (one event name per
decision, an Event where it changes the job). Cluster changes go through the injected `act`
(the actuator thread), whose outcomes come back on the queue.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from supervisor import model, reload
from supervisor.carry import Carrier
from supervisor.channel import HookChannel
from supervisor.collector import Collector
from supervisor.config import Config
from supervisor.decide import (
    accounting,
    beats,
    core,
    fleet,
    hostlist,
    memory,
    on,
    plan,
    start,
)
from supervisor.decide.fleet import Fleet
from supervisor.decide.script import Op, SaveState
from supervisor.horovodrun import ChildProcess, Horovodrun, Outcome
from supervisor.hostfile import HostFile
from supervisor.launch import horovodrun_argv
from supervisor.metrics import Metrics
from supervisor.model import EventSpec, ExitCode, LeadershipPaused, LeadershipResumed, Trigger
from supervisor.nodeleases import NodeLeases
from supervisor.observe import ClusterView, EventType, Kind
from supervisor.outcomes import Outcomes
from supervisor.reports import Reports
from supervisor.watches import Watches

PROGRESS_EVERY_S = 5.0


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
        collector: Collector | None = None,
        workers: Fleet | None = None,
        owner: Mapping[str, str] | None = None,
        leases: NodeLeases | None = None,
        stored: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if workers is not None and cfg.worker_template is None:
            raise ValueError("a fleet needs the worker template")
        self.cfg, self.log, self.metrics, self.events = cfg, log, metrics, events
        self.clock, self.wall, self.channel = clock, wall, channel
        self.collector = collector
        self.count_ssh_clients = count_ssh_clients
        self.hang_settings = memory.hang_settings(cfg)
        self.leases = leases if cfg.node_lease_s is not None else None
        self.reports = Reports(cfg, log=log, events=events, metrics=metrics, channel=channel,
                               hang_settings=self.hang_settings)
        self.horovodrun = Horovodrun(cfg, log=log, events=events, metrics=metrics,
                                     reports=self.reports, channel=channel,
                                     start_child=start_child, base_env=base_env,
                                     submit=self.submit, clock=clock)
        self.hostfile = HostFile(cfg, log=log, events=events, metrics=metrics,
                                 reports=self.reports, channel=channel, clock=clock)
        self.watches = Watches(cfg, log=log, events=events, metrics=metrics,
                               reports=self.reports, leases=self.leases)
        self.outcomes = Outcomes(cfg, log=log, events=events, metrics=metrics,
                                 reports=self.reports)
        self.carrier = Carrier(cfg, log=log, events=events, metrics=metrics,
                               reports=self.reports, horovodrun=self.horovodrun,
                               channel=channel, act=act, kill_ssh_clients=kill_ssh_clients,
                               owner=owner)
        self.sizes = start.Sizes(cfg.np, cfg.min_np, cfg.max_np)
        # SimpleQueue: handle_signal puts from a signal handler, which interrupts the main
        # thread anywhere, even inside this queue's get; a queue.Queue's Lock would deadlock.
        self.queue: queue.SimpleQueue[Trigger] = queue.SimpleQueue()
        self.next_progress = self.next_reap = 0.0  # when to say the gate waits, to reap
        self.bound = 0  # the index's `readdressed` the channel's addresses were bound at
        self.addressed = hostlist.Addresses(cfg.host_mode)  # a render cache
        # The decisions' memory: kept here, written only by decide/.
        self.core = on.initial(workers, stored)

    @property
    def view(self) -> ClusterView:  # the watches'
        return self.watches.view

    # -- inputs (any thread) ------------------------------------------------------------------

    def submit(self, item: Trigger) -> None:
        """Hand a trigger to the loop; never blocks (the queue is unbounded)."""
        self.queue.put_nowait(item)

    def handle_signal(self, signum: int, _frame: object = None) -> None:
        self.submit(model.SignalReceived(signum))

    # -- the loop (main thread) ---------------------------------------------------------------

    def run(self, command: Sequence[str], adopted: ChildProcess | None = None) -> Outcome:
        """Supervise until horovodrun exits or the start fails; return how it ended.
        `adopted`: a horovodrun already running (sidecar mode: started for a supervisor of
        this pod that died), supervised as if this one had started it."""
        cfg = self.cfg
        horovodrun_argv(cfg, command)  # a bad command fails before anything starts
        self.core = on.gate_opened(self.core, self.clock())
        self.next_progress = self.next_reap = self.core.gate_since
        self._sync_discovery(self.core.gate_since, None)  # withdraw a previous run's file
        if adopted is not None:
            self.horovodrun.running(adopted, adopted=True)
            self.core = on.horovodrun_started(self.core)
        while True:
            batch = self._drain(self._timeout())
            now, began = self.clock(), time.perf_counter()
            if self.channel is not None:
                self.channel.revive()  # its receiver thread, if it ended: said, started again
            earliest, exited = self._apply(batch, now)
            readdressed = self.watches.index.readdressed
            if readdressed != self.bound and self.channel is not None:
                self.channel.bind_hosts(self.addressed.update(self.view))
                self.bound = readdressed
            if batch:
                self.log.debug("loop.batch", items=len(batch), pods=len(self.view.pods),
                               nodes=len(self.view.nodes))
            self.watches.ages(now)
            if self.core.fatal is not None:
                return self.horovodrun.finish(*self.core.fatal)
            if self.view.synced:
                # The host list first: deciding on many failures at once (a lost node with 100
                # workers: ssh clients, logs, Events) must not delay what horovodrun reads.
                self._sync_discovery(now, earliest)
                self._manage(now)
                earliest = None  # what _manage changes (scale-in) is not a watch latency
            self._sync_discovery(now, earliest)
            outcome = self._ended(exited)
            if outcome is None and (child := self.horovodrun.child) is None:
                outcome = self._gate(command, now)
            elif outcome is None:
                if now >= self.next_reap:  # a walk of the process table: not on every event
                    child.reap()
                    self.next_reap = now + min(1.0, cfg.resync_s)
                self.horovodrun.tick(now)
            if outcome is not None:
                return outcome
            self.metrics.loop_pass.labels("events" if batch else "idle").observe(
                time.perf_counter() - began)
            if self.collector is not None and (
                    frozen := self.collector.tick(now, idle=not batch)) is not None:
                self.log.debug("gc.frozen", took_ms=round(frozen.took_s * 1e3, 1),
                               objects=frozen.frozen)

    def _ended(self, exited: int | None) -> Outcome | None:
        """horovodrun's exit, judged (on.exit_seen, start.ended) or held while the leader
        Lease cannot be renewed; the run's outcome, or None while it goes on."""
        c = self.core
        if c.held_exit is not None and c.failing is not None:
            return self.horovodrun.finish(*c.failing)  # the Lease lost meanwhile
        self.core, exited, held = on.exit_seen(c, exited)
        if held:
            self.log.warning("horovodrun.exit_held", code=self.core.held_exit, reason=(
                "horovodrun exited while this launcher cannot renew the leader Lease: "
                "another launcher may have taken the workers; judged once the Lease says "
                "whose the job is"))
        if exited is None:
            return None
        snap = self.channel.snapshot() if self.channel is not None else None
        end = start.ended(exited, failing=self.core.failing,
                          stop_signal=self.horovodrun.stop_signal,
                          driver_problems=snap.driver.problems
                          if snap is not None and snap.driver is not None else ())
        self.reports.say(() if end.note is None else (end.note,))
        return self.horovodrun.finish(end.code, end.reason, horovodrun=end.horovodrun)

    def _gate(self, command: Sequence[str], now: float) -> Outcome | None:
        """No horovodrun: start it once MIN_NP slots are usable (start.gate), give up after
        START_TIMEOUT_SECONDS, or say every few seconds what it waits for."""
        cfg, c, hr = self.cfg, self.core, self.horovodrun
        end = start.not_started(failing=c.failing, stop_signal=hr.stop_signal)
        if end is not None:
            return hr.finish(end.code, end.reason)
        listed = self.hostfile.host_list
        slots = listed.slots(cfg.slots_per_worker) if listed else 0
        waited_s = round(now - c.gate_since, 1)
        step = start.gate(self.sizes, synced=self.view.synced,
                          published=self.hostfile.published is not None, slots=slots,
                          restart=memory.horovodrun_restarts(c) > 0,
                          waited_s=now - c.gate_since, timeout_s=cfg.start_timeout_s)
        if isinstance(step, start.Start):
            hr.start(horovodrun_argv(cfg, command, step.np), slots, step.np)
            self.core = on.horovodrun_started(self.core)
        elif isinstance(step, start.GiveUp):
            self.log.error("start.timeout", slots=slots, min_np=cfg.min_np, waited_s=waited_s)
            self.events(EventSpec("Warning", "StartTimeout", "Start", step.reason))
            return hr.finish(step.code, step.reason)
        elif now >= self.next_progress:
            self.next_progress = now + PROGRESS_EVERY_S
            self.log.info("start.waiting", slots=slots, min_np=cfg.min_np,
                          synced=self.view.synced, workers=len(self.view.pods),
                          left_out=dict(listed.left_out) if listed else {}, waited_s=waited_s)
        return None

    def _timeout(self) -> float:
        """How long the next pass may wait for triggers: the tick, or a backoff deadline."""
        timeout = self.cfg.resync_s
        if self.core.fleet is not None:
            wall = self.wall()
            due = fleet.next_due(self.core.fleet, wall)
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
        """Hand each trigger of a batch to what owns it; return (receipt time of the earliest
        view change, horovodrun's exit code)."""
        earliest, exited = None, None
        for item in batch:
            changed_at = None
            if isinstance(item, model.WatchEvent) and item.kind is Kind.SCALE:
                if item.type is not EventType.DELETED:
                    self.core, refused = on.scale_seen(self.core, item.obj,
                                                       plan.Settings.of(self.cfg))
                    self.reports.say(() if refused is None else (refused,))
            elif isinstance(item, model.WatchEvent):
                self.core, changed = self.watches.event(self.core, item)
                changed_at = item.at if changed else None
            elif isinstance(item, model.ActionDone):
                self.core = self.outcomes.done(self.core, item, now)
            elif isinstance(item, model.PolicyChanged):
                self._policy_changed(item)
            elif isinstance(item, model.SourceState):
                self.core = self.watches.source(self.core, item)
                # Only news that can change what is published (synced, reconnected) starts a
                # discovery-latency measurement; a bookmark does not.
                changed_at = item.at if item.synced or item.broken is False else None
            elif isinstance(item, model.ChildExited):
                if (child := self.horovodrun.child) is not None and item.pid in (None, child.pid):
                    exited = item.code  # (a horovodrun restarted for a stall is not news)
            elif isinstance(item, model.SignalReceived):
                self.horovodrun.on_signal(item.signum, now)
            elif isinstance(item, model.LeadershipLost):
                self._leadership_lost(item.reason, now)
            elif isinstance(item, LeadershipPaused | LeadershipResumed):
                self._leadership(item)
            if changed_at is not None:
                earliest = changed_at if earliest is None else min(earliest, changed_at)
        return earliest, exited

    # -- the pass ------------------------------------------------------------------------------

    def _manage(self, now: float) -> None:
        """Once synced: gather what the decisions read, decide (core.manage, pure), carry the
        script out in order."""
        cfg, c, view = self.cfg, self.core, self.view
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
            for host in plan.retiring_hosts(c.fleet, view.pods, published, settings.plan,
                                            c.leaving)}
        host_list = hf.host_list
        p = core.manage(c, memory.Seen(
            pods=view.pods, nodes=view.nodes, memory=self.watches.pods,
            lease_ages=self.leases.ages(now) if self.leases is not None else None,
            lease_stale=stale, first_owner=hf.first_owner, published=hf.published,
            view_render=hf.view_render,
            listed_hosts=host_list.hosts if host_list is not None and hf.published is not None
            else {},
            hooked=hooked, running=running, stopping=self.horovodrun.stop_signal is not None,
            started_at=self.horovodrun.started_or(now),
            beats=tuple(snap.beats.values()) if snap is not None else (),
            driver=snap.driver if snap is not None else None,
            ssh_clients=clients, now=now, wall=self.wall(), api_back_at=c.api_back_at,
            index=self.watches.index),
            settings)
        self.core = p.core
        self.outcomes.replacing(p.replace_from)
        self.reports.passed(p, snap, now=now, started=self.horovodrun.started_or(now))
        fl = p.core.fleet
        desired = (len(fl.active()) if fl is not None else 0) * cfg.slots_per_worker or cfg.np
        before = self.core.progress
        a = accounting.account(before, self.core.book, p.todo,
                               snap.beats.values() if snap is not None else (), view.pods,
                               desired=desired, mode=cfg.host_mode, job=cfg.job_name,
                               now=now, wall=self.wall(), saved_at=self.core.progress_saved_at)
        self.core = on.accounted(self.core, a)
        self.reports.accounted(before, a, desired)
        for todo in p.todo:
            self.core = self.carrier.carry_out(self.core, todo, now)
        if a.save and c.fleet is not None and not any(isinstance(t, SaveState) for t in p.todo):
            self.core = self.carrier.carry_out(self.core, SaveState(core.state_of(
                p.core.fleet or c.fleet, settings, p.core.quarantine.until)), now)

    # -- triggers that end the run or change its settings ----------------------------------------

    def _leadership_lost(self, reason: str, now: float) -> None:
        """Another launcher may drive the workers now: stop horovodrun at once (no grace)."""
        self.log.error("leader.lost", reason=reason)
        self.events(EventSpec("Warning", "LeadershipLost", "Lead",
                              f"{reason}; horovodrun stopped at once, exiting "
                              f"{int(ExitCode.LEADERSHIP_LOST)}"))
        self.core, failing = memory.fail(self.core, ExitCode.LEADERSHIP_LOST,
                                         f"leadership lost: {reason}", event=False)
        if failing is not None:
            self.carrier.failing(failing, now)
        self.horovodrun.kill_tree("leadership lost")

    def _leadership(self, item: LeadershipPaused | LeadershipResumed) -> None:
        """The leader Lease cannot be renewed (paused), or can again (resumed)."""
        paused = isinstance(item, LeadershipPaused)
        self.core = on.leadership(self.core, paused=paused)
        if isinstance(item, LeadershipPaused):
            self.log.warning("leader.paused", reason=item.reason)
            return
        self.log.info("leader.resumed", paused_s=round(item.paused_s, 1))
        self.events(EventSpec(
            "Normal", "LeadershipResumed", "Lead",
            f"the leader Lease was renewed again after {item.paused_s:.0f}s unreachable; "
            "training went on, nothing was created or deleted meanwhile"))

    def _policy_changed(self, change: model.PolicyChanged) -> None:
        file = str(self.cfg.policy_file)
        if change.policy is None:
            self.reports.policy_changed(file, change.problems, None, 0)
            return
        diff = reload.summary(self.cfg.policy, change.policy)
        self.cfg = cfg = replace(self.cfg, policy=change.policy)
        for adapter in (self.reports, self.horovodrun, self.hostfile, self.watches,
                        self.outcomes, self.carrier):
            adapter.cfg = cfg
        # Store the new restart limit with the state (for `status`).
        self.core = on.policy_reloaded(self.core)
        self.reports.policy_changed(file, (), diff, self.carrier.budget_left(self.core))

    def _sync_discovery(self, now: float, earliest: float | None) -> None:
        """The hosts kept on down nodes while they heartbeat (on.heard), then the host list."""
        channel, silence = self.channel, self.hang_settings.silence_s
        self.core, kept = on.heard(self.core, self.view, self.cfg.host_mode, frozenset if (
            channel is None or self.horovodrun.child is None) else lambda: beats.talking(
            channel.snapshot().beats.values(), now, silence), self.watches.index)
        self.reports.say(() if kept is None else (kept,))
        self.core = on.listed(self.core, self.hostfile.sync(
            self.core, self.view, running=self.horovodrun.child is not None, now=now,
            earliest=earliest))
