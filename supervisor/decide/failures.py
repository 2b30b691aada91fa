"""PURE: the decisions on the failures the loop classified: per failure, the policy's rule
(policy.decide through fleet.on_failure, the restart budgets), which pods to delete, what to
say, and whether the job fails (a FailJob rule). core.manage calls `on_failures` once a pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.decide import fleet
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.fleet import Fleet
from supervisor.decide.plan import HUNG_GRACE_S, Note, Settings
from supervisor.decide.policy import Action, Decision, Policy
from supervisor.decide.script import DeletePod
from supervisor.model import EventSpec
from supervisor.observe import Obj
from supervisor.workers import pod_name


def containers_run(pod: Obj) -> bool:
    """Every container of the pod is running (its phase says Running for a while after its
    container ended: the kubelet reports Failed only once the pod is torn down)."""
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    return bool(statuses) and all("running" in (cs.get("state") or {}) for cs in statuses)


@dataclass(frozen=True)
class Failed:
    """One failure the loop classified: the pod as seen, and when."""

    failure: Failure
    pod: Obj
    seen_at: float  # monotonic


@dataclass(frozen=True)
class Decided:
    fleet: Fleet | None
    deletes: tuple[DeletePod, ...] = ()
    notes: tuple[Note, ...] = ()
    replace_from: Mapping[str, float] = field(default_factory=dict)  # new pod -> failure seen
    counts: tuple[tuple[str, str], ...] = ()  # (cause, action) of each decision taken
    fail: str | None = None  # a FailJob rule matched (POLICY_FAILED): why


def on_failures(f: Fleet | None, failed: list[Failed], policy: Policy, s: Settings,
                wall: float) -> Decided:
    """Decide on each failure in turn (policy.decide through fleet.on_failure, the budgets in
    the fleet's ledger): the new fleet, the pods to delete (a pod on a lost node or a hung one
    is force-deleted, an idle one whose training process died gracefully), the Events, when
    each replacement's clock started, and whether the job fails. `f` None: the supervisor does
    not own the workers (decisions are taken and said, nothing is replaced)."""
    d = _Deciding(f, policy, s)
    for x in failed:
        d.decide(x, wall)
    return Decided(d.fleet, tuple(d.deletes), tuple(d.notes), d.replace_from,
                   tuple(d.counts), d.fail)


@dataclass
class _Deciding:
    """`on_failures` under way (local to one call)."""

    fleet: Fleet | None
    policy: Policy
    s: Settings
    deletes: list[DeletePod] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    replace_from: dict[str, float] = field(default_factory=dict)
    counts: list[tuple[str, str]] = field(default_factory=list)
    fail: str | None = None

    def decide(self, x: Failed, wall: float) -> None:
        fl, pod, s = x.failure, x.pod, self.s
        found = fleet.slot_of(pod, s.job) if self.fleet is not None else None
        if (found is not None and fl.cause is Cause.NODE_NOT_READY
                and pod["metadata"].get("deletionGracePeriodSeconds") != 0):
            # On a lost node the pod would stay Terminating forever: force it out (also when
            # an earlier supervisor decided already but did not get to delete it).
            self.deletes.append(DeletePod(fl.pod, fl.uid, 0))
        elif (found is not None and fl.cause is Cause.HUNG
              and not pod["metadata"].get("deletionTimestamp")):
            # Its node is Ready: the kubelet kills the hung process (SIGKILL after the short
            # grace) and only then is the pod gone, so its GPU is not handed out while the
            # process may still hold it (a force delete would free it in the API at once).
            # Its replacement waits for that (fleet.wanted); should the node go down meanwhile,
            # core forces the delete.
            self.deletes.append(DeletePod(fl.pod, fl.uid, HUNG_GRACE_S))
        elif (found is not None and fl.cause is Cause.EXIT_CODE and containers_run(pod)
              and not pod["metadata"].get("deletionTimestamp")):
            # Its training process died but the container lives on (the driver saw it): an
            # idle pod Horovod will never use again. A graceful delete: its kubelet is fine.
            self.deletes.append(DeletePod(fl.pod, fl.uid, None))
        elif (found is not None and fl.cause is Cause.NOT_STARTED
              and not pod["metadata"].get("deletionTimestamp")):
            # Nothing of it runs; its kubelet tears down what it set up (a graceful delete).
            self.deletes.append(DeletePod(fl.pod, fl.uid, None))
        why = ("SUPERVISOR_WORKER_TEMPLATE is not set: the supervisor does not create workers"
               if self.fleet is None else "not created by this supervisor (no slot label)")
        new, d = fleet.on_failure(self.fleet or Fleet(), fl, found, self.policy, wall,
                                  unmanaged_reason=why)
        if d is None:
            self.notes.append(Note("info", "worker.failure_handled_before", {
                "pod": fl.pod, "cause": fl.cause.value, "slot": found[0] if found else None}))
            return
        if self.fleet is not None:
            self.fleet = new
        self.counts.append((fl.cause.value, d.action.value))
        self.notes.append(self.note(x, d, found))
        if d.action is Action.RESTART and found is not None:
            self.replace_from[pod_name(s.job, found[0], found[1] + 1)] = x.seen_at + d.delay_s
        if d.action is Action.FAIL_JOB and self.fail is None:
            self.fail = f"{fl.pod}: {fl.cause.value} ({fl.detail}) matched {d.rule} -> FailJob"

    def note(self, x: Failed, d: Decision, found: tuple[int, int] | None) -> Note:
        fl = x.failure
        limit = self.policy.budgets.restart_limit
        used = self.fleet.ledger.total if self.fleet is not None else 0
        cause = fl.cause.value if fl.exit_code is None else f"{fl.cause.value} {fl.exit_code}"
        if d.action is Action.RESTART:
            assert found is not None
            then = pod_name(self.s.job, found[0], found[1] + 1)
            reason, outcome = "WorkerRestarting", (
                f"replacing it with {then}" + (f" in {d.delay_s:.1f}s (backoff)" if d.delay_s
                                               else ""))
        elif d.action is Action.FAIL_JOB:
            reason, outcome = "JobFailing", "failing the job"
        elif d.refused:
            reason, outcome = "RestartRefused", f"dropping it: {d.refused}"
        else:
            reason, outcome = "WorkerDropped", "dropping it (Ignore)"
        slot = f" (slot {found[0]})" if found else ""
        free = ("" if d.action is not Action.RESTART or d.counted else
                " (never started: not counted)" if fl.cause is Cause.NOT_STARTED else
                " (a disruption: not counted)")
        note = (f"worker {fl.pod}{slot} on node {fl.node or '-'}: {cause}: {fl.detail}; "
                f"rule {d.rule!r}: {d.action.value}; {outcome}; restarts used {used}/{limit}"
                f"{free}")
        return Note("warning", "worker.failed", {
            "pod": fl.pod, "slot": found[0] if found else None, "node": fl.node,
            "cause": fl.cause.value, "exit_code": fl.exit_code, "container": fl.container,
            "detail": fl.detail, "rule": d.rule, "action": d.action.value,
            "refused": d.refused, "delay_s": d.delay_s, "counted": d.counted,
            "restarts_used": used, "restart_limit": limit},
            EventSpec("Warning", reason, d.action.value, note))
