"""The actuator's outcomes, for the loop: what each one decides and says.

An action (a create, a delete, a state save, the PodDisruptionBudget) comes back as an
`ActionDone` trigger. This adapter asks the decisions what it changes (`decide.on`: a create
done, refused by admission or failed; an error for good ends the run) and returns the memory
they returned, which the loop keeps; it logs each outcome once, posts the Events and keeps the
replacement-latency metric (when each replacement's failure was seen, until it is created).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from supervisor.config import Config
from supervisor.decide import fleet, on
from supervisor.decide.memory import Memory
from supervisor.metrics import Metrics
from supervisor.model import ActionDone, EventSpec
from supervisor.reports import Reports


class Outcomes:
    """Each action's outcome, decided on and said; written only by the loop's thread."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, reports: Reports) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.reports = reports
        self.replace_from: dict[str, float] = {}  # new pod -> its predecessor's failure seen

    def replacing(self, since: Mapping[str, float]) -> None:
        """The replacements a pass asked for, and when each one's failure was seen."""
        self.replace_from.update(since)

    def done(self, c: Memory, done: ActionDone, now: float) -> Memory:
        if done.fatal:
            crashed = done.note == "bug"
            c = on.fatal(c, f"{done.what} {done.name}: {done.error}", crashed=crashed)
            assert c.fatal is not None
            self.log.error("supervisor.crashed" if crashed else "kube.fatal",
                           action=done.what, name=done.name, reason=done.error)
            self.events(EventSpec("Warning", "SupervisorCrashed" if crashed
                                  else "KubernetesAccessDenied", "Act", c.fatal[1]))
            return c
        if done.retrying:
            self.log.warning("kube.retrying", action=done.what, name=done.name,
                             reason=done.error)
            return c
        if done.refused:
            c, note = on.create_refused(c, done.name, done.error or "", now)
            self.reports.say((note,))
            return c
        if done.what == "budget":
            self.reports.budget_done(done, c.budget)
            return c
        if done.error is not None:
            self.log.error("worker.create_failed" if done.what == "create" else "kube.failed",
                           action=done.what, name=done.name, reason=done.error)
            if done.what == "create":
                c, notes = on.create_failed(c, done.name, f"cannot create {done.name}: "
                                            f"{done.error}", self.cfg.job_name)
                self.reports.say(notes)
            return c
        if done.began_at is not None:
            self.metrics.api_write.labels(done.what).observe(max(0.0, done.at - done.began_at))
        if done.what == "create":
            return self._created(c, done)
        if done.what == "delete":
            self.log.info("worker.deleted", pod=done.name, note=done.note or None)
        elif done.note:  # the ConfigMap had been deleted: stored again, budgets included
            self.log.warning("state.recreated", note=done.note)
            self.events(EventSpec("Warning", "StateRecreated", "Save",
                                  f"state ConfigMap {fleet.state_name(self.cfg.job_name)}: "
                                  f"{done.note}; created again from the supervisor's memory"))
        else:
            self.log.debug("state.saved")
        return c

    def _created(self, c: Memory, done: ActionDone) -> Memory:
        self.metrics.workers_created.inc()
        started = self.replace_from.pop(done.name, None)
        latency = None if started is None else max(0.0, done.at - started)
        if latency is not None:
            self.metrics.replacement_latency.observe(latency)
        c, blocked = on.created(c, done.name)
        self.log.info("worker.created", pod=done.name, note=done.note or None,
                      replacement_latency_ms=None if latency is None
                      else round(latency * 1000, 2),
                      refused_before=blocked.attempts if blocked else 0,
                      **create_split(done, started))
        self.events(EventSpec("Normal", "WorkerCreated", "Create",
                              f"created worker pod {done.name}"
                              + (f" ({done.note})" if done.note else "")))
        return c


def create_split(done: ActionDone, failure_seen: float | None) -> dict[str, float]:
    """Where a create's time went, in ms: the pass (the failure seen -> the create handed to the
    actuator; replacements only), queued (handed -> its first try: behind the state save handed
    before it), the pod's call (its retries included), then its host key's Secret (the pod is
    in the API before it). Parts not known are left out."""
    out: dict[str, float] = {}
    handed, began, pod = done.started_at, done.began_at, done.pod_at
    if failure_seen is not None and handed is not None:
        out["pass_ms"] = max(0.0, handed - failure_seen)
    if handed is not None and began is not None:
        out["queued_ms"] = max(0.0, began - handed)
    if began is not None and pod is not None:
        out["pod_ms"] = max(0.0, pod - began)
        out["secret_ms"] = max(0.0, done.at - pod)
    return {k: round(v * 1000, 2) for k, v in out.items()}
