"""ADAPTER: what the loop says: each decision's log line and Event, and the reports that are
no decision (a helper container's exit, the workers' membership, a node Lease too slow to use,
the workers' PodDisruptionBudget, a closed incident, the hang watch's metrics and one-time
warnings). It owns the dedupe of what is said once (per pod incarnation, node, error or run of
horovodrun); the loop (loop.py) calls it and decides nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from supervisor.channel import HookChannel, Snapshot, unbound_note
from supervisor.config import Config
from supervisor.decide import accounting, hang, incidents, plan, progress
from supervisor.decide.beats import heartbeating
from supervisor.decide.classify import ClassifySettings, uncounted_exits
from supervisor.decide.hang import HangSettings, Verdict
from supervisor.decide.hostlist import Rendered
from supervisor.decide.memory import Pass
from supervisor.metrics import Metrics
from supervisor.model import ActionDone, EventSpec
from supervisor.nodeleases import NodeLeases

DRIVER_HELLO_WAIT_S = 30.0  # horovodrun's driver hook should have said hello by then
STALL_LOG_AFTER_S = 60.0  # no collective completed this long: said once in the log


class Reports:
    """Says what the loop decided and saw; one per supervisor process."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, channel: HookChannel | None, hang_settings: HangSettings
                 ) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.channel, self.hang_settings = channel, hang_settings
        # (pod UID, container, its restartCount): exits of helper containers already said
        self.reported_exits: set[tuple[str, str, int]] = set()
        self.lease_reported: set[str] = set()  # nodes whose Lease is too slow to use
        self.budget_said: str | None = None  # the last DisruptionBudgetMissing's error
        # this run of horovodrun: its one-time warnings said, the driver's last world logged
        self.reported: set[str] = set()
        self.world_seq = 0

    def new_run(self) -> None:
        """A new run of horovodrun (started, adopted or ended): its warnings may be said again."""
        self.reported, self.world_seq = set(), 0

    def forget_pod(self, uid: str) -> None:
        """A pod deleted: its helper containers' exits are no longer remembered."""
        self.reported_exits = {k for k in self.reported_exits if k[0] != uid}

    def say(self, notes: Sequence[plan.Note]) -> None:
        """Log each decision of a plan, and post its Event if it has one."""
        for note in notes:
            getattr(self.log, note.level)(note.event, **note.fields)
            if note.k8s is not None:
                self.events(note.k8s)

    def helper_exits(self, pod: dict[str, Any], before: Any,
                             settings: ClassifySettings) -> None:
        """A container that is neither the training one nor named by the policy ended: say so
        once (it is no failure of the worker)."""
        meta = pod["metadata"]
        restarts = {c.get("name"): int(c.get("restartCount") or 0)
                    for c in pod.get("status", {}).get("containerStatuses") or ()}
        for container, code in uncounted_exits(pod, before, settings):
            key = (meta.get("uid", ""), container, restarts.get(container, 0))
            if key in self.reported_exits:
                continue
            self.reported_exits.add(key)
            self.log.info("worker.container_exited", pod=meta["name"], container=container,
                          exit_code=code)
            self.events(EventSpec(
                "Normal", "ContainerExited", "Observe",
                f"worker {meta['name']}: container {container} exited with {code}; not the "
                "training container and no policy rule names it, so the worker trains on "
                "(SUPERVISOR_WORKER_CONTAINER, containerName)"))

    def membership(self, old: Rendered | None, new: Rendered, *, running: bool) -> None:
        old_out = old.left_out if old else {}
        changed = {name: reason.value for name, reason in new.left_out.items()
                   if old_out.get(name) is not reason}
        if changed:
            shown = dict(sorted(changed.items())[:20])
            self.log.info("workers.unusable", changed=shown, more=len(changed) - len(shown),
                          unusable=len(new.left_out))
        # (key views: at 10,000 workers two sets copied on every new host list were 5 % of
        # the loop's time while failures came in)
        before = old.hosts.keys() if old else {}.keys()
        after = new.hosts.keys()
        if before == after:
            return
        added, removed = sorted(after - before), sorted(before - after)
        left_out = {name: reason.value for name, reason in new.left_out.items()}
        self.log.info("workers.changed", added=added, removed=removed, usable=len(after),
                      left_out=left_out)
        if running:
            self.events(EventSpec("Normal", "WorkersChanged", "Discovery",
                                  f"usable workers {len(after)}; added {added}; "
                                  f"removed {removed}"))

    def slow_leases(self, leases: NodeLeases, grace_s: float) -> None:
        """Say once per node that its Lease cannot tell silence within SUPERVISOR_NODE_LEASE_
        SECONDS (NodeLeases does not use it)."""
        for node, interval in leases.too_short(grace_s).items():
            if node in self.lease_reported:
                continue
            self.lease_reported.add(node)
            note = (f"SUPERVISOR_NODE_LEASE_SECONDS={grace_s:g} is not above node {node}'s "
                    f"Lease renew interval ({interval:g} s = leaseDurationSeconds / 4): its "
                    f"Lease is not used; only its Ready condition counts. Set it above "
                    f"{interval:g}")
            self.log.warning("node_lease.not_used", node=node, renew_interval_s=interval,
                             lease_seconds=grace_s)
            self.events(EventSpec("Warning", "NodeLeaseNotUsed", "Ignore", note))

    def budget_done(self, done: ActionDone, min_available: int | None) -> None:
        """The workers' PodDisruptionBudget kept, or refused: said, never fatal (without it a
        drain may evict several workers at once, each one leaving gracefully)."""
        if done.error is None:
            self.log.info("budget.kept", budget=done.name, min_available=min_available)
            self.events(EventSpec("Normal", "DisruptionBudgetKept", "Keep",
                                  f"PodDisruptionBudget {done.name}: minAvailable "
                                  f"{min_available}: a drain or the autoscaler evicts one "
                                  "worker at a time"))
            return
        self.log.warning("budget.missing", budget=done.name, reason=done.error)
        if self.budget_said != done.error:
            self.budget_said = done.error
            self.events(EventSpec("Warning", "DisruptionBudgetMissing", "Keep",
                                  f"no PodDisruptionBudget {done.name} for the workers "
                                  f"({done.error}): a drain may evict several at once; the "
                                  "supervisor's ServiceAccount needs create and patch on "
                                  "poddisruptionbudgets (policy)"))

    def passed(self, p: Pass, snap: Snapshot | None, *, now: float, started: float) -> None:
        """A pass's counts as metrics (failures and their actions, leaves, quarantined nodes,
        horovodrun restarts) and the hang watch's reports."""
        m = self.metrics
        for cause, action in p.counts:
            m.worker_failures.labels(cause, action).inc()
        for todo in p.todo:
            if isinstance(todo, plan.Note) and todo.event == "worker.leaving":
                m.worker_leaves.labels(todo.fields["why"]).inc()
        m.nodes_quarantined.set(len(p.core.quarantine.until))
        m.slow_workers.set(len(p.core.slow.named))
        m.straggler_factor_max.set(p.core.slow.worst)
        for reason in p.restarts:
            m.horovodrun_restarts.labels(reason).inc()
        if snap is not None and p.verdict is not None:
            self.hangs(snap, p.verdict, restarting=bool(p.restarts), now=now, started=started)

    def accounted(self, before: progress.Progress, a: accounting.Accounted,
                  desired: int) -> None:
        """The progress and the incidents after a pass (accounting.account): their metrics,
        an incident's line when it opens and its phases' times, and what closed."""
        m, after = self.metrics, a.progress
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
            self.incident_closed(inc)

    def policy_changed(self, file: str, problems: Sequence[str],
                       diff: dict[str, Any] | None, budget_left: int) -> None:
        """A reloaded policy file: rejected (`diff` None: the current policy kept) or taken."""
        if diff is None:
            self.log.error("policy.rejected", file=file, problems=list(problems))
            self.events(EventSpec("Warning", "PolicyRejected", "Reload",
                                  f"{file}: kept the current policy; " + "; ".join(problems)))
            return
        self.metrics.restart_budget_left.set(budget_left)
        self.log.info("policy.reloaded", file=file, **diff)
        self.events(EventSpec("Normal", "PolicyReloaded", "Reload", f"{file}: {diff}"))

    def incident_closed(self, inc: incidents.Incident) -> None:
        phases = incidents.phase_seconds(inc)
        self.log.info("incident.closed", incident=inc.id, cause=inc.cause, kind=inc.kind,
                      pods=list(inc.pods), phases_s=phases, steps_redone=inc.redone,
                      lost_worker_s=inc.lost_ws)
        said = ", ".join(f"{k} {v:.1f}s" for k, v in phases.items() if k != "detected")
        self.events(EventSpec("Normal", "IncidentClosed", "Observe",
                              f"incident {inc.id} {inc.label()}: {said}; {inc.redone} steps "
                              f"computed again, {inc.lost_ws:.0f} worker-seconds lost"))

    def hangs(self, snap: Snapshot, verdict: Verdict, *, restarting: bool, now: float,
              started: float) -> None:
        """The hang watch's metrics, one-time warnings, and a stall too short to restart."""
        h = self
        fresh = sum(1 for b in snap.beats.values()
                    if heartbeating(b, now, self.hang_settings.silence_s))
        self.metrics.heartbeating_processes.set(fresh)
        assert self.channel is not None
        c = self.channel.counters
        for outcome, n in (("received", c.received), ("rejected", c.rejected),
                           ("invalid", c.invalid), ("failed", c.failed),
                           ("stale", c.stale_runs), ("unbound", c.unbound),
                           ("pushed", c.pushed), ("replies", c.replies)):
            self.metrics.hook_datagrams.labels(outcome).set(n)
        progress = [b.progress_at for b in snap.beats.values() if b.progress_at is not None]
        if progress:
            self.metrics.last_progress_age.set(max(0.0, now - max(progress)))
        self.warnings(verdict, snap.driver, now - started)
        d = snap.driver
        if d is not None and d.world_seq != h.world_seq:
            h.world_seq = d.world_seq
            self.log.debug("driver.world", seq=d.world_seq, hosts=sorted(d.world),
                           age_s=round(now - d.world_at, 2))
        if restarting:
            return
        if progress and now - max(progress) >= STALL_LOG_AFTER_S:
            if "stall-logged" not in h.reported:
                h.reported.add("stall-logged")
                self.log.warning("training.no_progress", seconds=round(now - max(progress)),
                                 stall_timeout_s=self.cfg.stall_timeout_s, heartbeating=fresh)
        else:
            h.reported.discard("stall-logged")

    def warnings(self, verdict: Verdict, driver: Any, running_s: float) -> None:
        """The one-time Warning Events of a run: hosts without heartbeats, the hook's problems
        and the frameworks it does not fence, a driver that never said the hook was loaded; and
        the log line of a process silent but running (once per silence)."""
        h = self
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
                f"them{unbound_note(self.channel)}"))
        self._once_per_silence("busy", "worker.silent_but_running", "state", verdict.busy)
        self._once_per_silence("unconfirmed", "worker.silent_unconfirmed", "peer_waited_s",
                               verdict.unconfirmed)
        for host, problem in verdict.problems:
            key = f"problem:{problem}"
            if key not in h.reported:
                h.reported.add(key)
                self.log.warning("hook.problem", host=host, problem=problem)
                self.events(EventSpec("Warning", "HookProblem", "Detect",
                                      f"the hook in a training process on {host}: {problem}; "
                                      "no fence and no hang detection for such processes"))
        for framework in sorted({f for _, f in verdict.unfenced}):
            key = f"unfenced:{framework}"
            if key not in h.reported:
                h.reported.add(key)
                hosts = sorted(x for x, f in verdict.unfenced if f == framework)
                self.log.warning("hook.framework_unfenced", framework=framework, hosts=hosts)
                self.events(EventSpec(
                    "Warning", "HookFrameworkUnfenced", "Detect",
                    f"training processes on {len(hosts)} host(s) {hosts[:10]} use {framework}, "
                    "which the hook does not fence (only horovod.torch and horovod.tensorflow): "
                    "no fence and no hang detection for them, and the stall rule and the "
                    "regroup hold ignore them; horovodrun's driver is hardened and pod and "
                    "node failures are handled as for any job (docs/hook.md)"))
        if driver is None and running_s >= DRIVER_HELLO_WAIT_S and "driver" not in h.reported:
            h.reported.add("driver")
            self.log.error("hook.driver_missing", waited_s=round(running_s, 1))
            self.events(EventSpec(
                "Warning", "DriverNotHardened", "Detect",
                f"horovodrun's driver has not loaded the hook after {running_s:.0f}s (python -I "
                "or -S, PYTHONPATH replaced, or SUPERVISOR_HOROVODRUN is not horovodrun): a "
                "frozen or partitioned worker can hang it for good"))

    def _once_per_silence(self, kind: str, event: str, what: str,
                          found: Sequence[tuple[str, int, float, object]]) -> None:
        """Log `event` once per silence of each (host, pid, seconds silent, `what`) found: a
        silent process not (yet) Hung, and why."""
        h = self
        keys = {f"{kind}:{host}:{pid}": (host, pid, silent, x) for host, pid, silent, x in found}
        h.reported -= {k for k in h.reported if k.startswith(f"{kind}:") and k not in keys}
        for key, (host, pid, silent, x) in keys.items():
            if key not in h.reported:
                h.reported.add(key)
                self.log.info(event, host=host, pid=pid, silent_s=round(silent, 1),
                              **{what: round(x, 1) if isinstance(x, float) else x})
