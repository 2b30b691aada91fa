"""THE LOOP: the one consumer of the trigger queue; owns the view and the horovodrun child.

Reflector threads put watch events and their own news on the queue, a waiter thread puts the
child's exit, signal handlers put signals. Each pass drains everything queued (coalescing bursts),
applies it to the view, and then, level-triggered from the whole view: renders the discovery
lines, publishes or withdraws the file (pure `discovery.decide`), starts horovodrun once the view
is synced and MIN_NP slots are usable, forwards signals and kills the tree after the grace period.
A pass runs at least every RESYNC_SECONDS even without events (staleness, start timeout, reaping).

Decisions are logged once each under a dotted name and, where they change the job, posted as
Kubernetes Events through the injected `events` callable (never blocking).
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from supervisor import discovery
from supervisor.config import Config
from supervisor.discovery import Publish, Rendered
from supervisor.launch import horovodrun_argv, horovodrun_env
from supervisor.metrics import Metrics
from supervisor.model import (
    ChildExited,
    EventSpec,
    ExitCode,
    SignalReceived,
    SourceState,
    Trigger,
    WatchEvent,
)
from supervisor.observe import ClusterView, Unusable

PROGRESS_EVERY_S = 5.0


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
class LoopState:
    """Mutable state owned by the loop thread."""

    view: ClusterView = field(default_factory=ClusterView)
    # host string -> UID of the first pod that had it (Horovod blacklists names for good)
    first_owner: dict[str, str] = field(default_factory=dict)
    published: str | None = None  # current discovery content; None while withdrawn
    rendered: Rendered | None = None
    child: ChildProcess | None = None
    stop_signal: int | None = None
    kill_at: float | None = None
    fatal: str | None = None
    crashed: bool = False


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.log, self.metrics, self.events = cfg, log, metrics, events
        self.start_child, self.base_env, self.clock = start_child, base_env, clock
        self.queue: queue.Queue[Trigger] = queue.Queue()
        self.state = LoopState()

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
        env = horovodrun_env(cfg, self.base_env)
        started_at = self.clock()
        next_progress = started_at
        self._sync_discovery(started_at, None)  # withdraw a file left by a previous run
        while True:
            batch = self._drain(cfg.resync_s)
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
            self._sync_discovery(now, earliest)
            st = self.state
            if exited is not None:
                return self._finish(exited, f"horovodrun exited with {exited}")
            if st.child is None:
                if st.stop_signal is not None:
                    return self._finish(128 + st.stop_signal,
                                        f"stopped by signal {st.stop_signal} before start")
                slots = st.rendered.slots(cfg.slots_per_worker) if st.rendered else 0
                if st.view.synced and st.published is not None and slots >= cfg.min_np:
                    self._start(argv, env, slots)
                elif now - started_at > cfg.start_timeout_s:
                    why = (f"only {slots} of {cfg.min_np} slots usable after "
                           f"{cfg.start_timeout_s:g}s (synced={st.view.synced})")
                    self.log.error("start.timeout", slots=slots, min_np=cfg.min_np,
                                   waited_s=round(now - started_at, 1))
                    self.events(EventSpec("Warning", "StartTimeout", "Start", why))
                    return self._finish(ExitCode.START_TIMEOUT, why)
                elif now >= next_progress:
                    next_progress = now + PROGRESS_EVERY_S
                    self.log.info("start.waiting", slots=slots, min_np=cfg.min_np,
                                  synced=st.view.synced, workers=len(st.view.pods),
                                  left_out=dict(st.rendered.left_out) if st.rendered else {},
                                  waited_s=round(now - started_at, 1))
            else:
                st.child.reap()
                if st.kill_at is not None and now >= st.kill_at:
                    self._kill_tree("shutdown grace expired")

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
            if isinstance(item, WatchEvent):
                if st.view.apply(item.kind, item.type, item.obj):
                    earliest = item.at if earliest is None else min(earliest, item.at)
                health = st.view.health[item.kind]
                health.last_event_at = item.at
            elif isinstance(item, SourceState):
                self._source_state(item)
                # Only news that can change what is published (synced, reconnected) starts a
                # discovery-latency measurement; a bookmark does not.
                if item.synced or item.broken is False:
                    earliest = item.at if earliest is None else min(earliest, item.at)
            elif isinstance(item, ChildExited):
                exited = item.code
            elif isinstance(item, SignalReceived):
                self._on_signal(item.signum, now)
        return earliest, exited

    def _source_state(self, s: SourceState) -> None:
        health = self.state.view.health[s.kind]
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
        rendered = discovery.render(st.view, cfg.slots_per_worker, cfg.host_mode,
                                    st.first_owner)
        self._report_membership(st.rendered, rendered)
        st.rendered = rendered
        self.metrics.workers_listed.set(len(st.view.pods))
        self.metrics.workers_usable.set(len(rendered.lines))
        decision = discovery.decide(st.view.synced, st.view.broken_for(now), cfg.staleness_s,
                                    rendered)
        if isinstance(decision, Publish):
            if decision.content == st.published:
                return
            discovery.write_atomic(cfg.discovery_file, decision.content)
            written = self.clock()
            for host in rendered.hosts:
                st.first_owner.setdefault(host, st.view.pods[rendered.hosts[host]][
                    "metadata"]["uid"])
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
        for name, reason in new.left_out.items():
            if reason is Unusable.HOST_REUSED:
                self.log.warning("host.reused", pod=name)

    def _start(self, argv: Sequence[str], env: Mapping[str, str], slots: int) -> None:
        st = self.state
        child = self.start_child(argv, env)
        st.child = child
        self.metrics.horovodrun_up.set(1)
        self.log.info("horovodrun.started", pid=child.pid, slots=slots, argv=list(argv))
        self.events(EventSpec("Normal", "HorovodrunStarted", "Start",
                              f"horovodrun started with {slots} usable slots "
                              f"(np {self.cfg.np}, min {self.cfg.min_np}, max {self.cfg.max_np})"))
        threading.Thread(target=self._wait_child, args=(child,), name="child-waiter",
                         daemon=True).start()

    def _wait_child(self, child: ChildProcess) -> None:
        self.submit(ChildExited(child.wait()))

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

