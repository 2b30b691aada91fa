"""The end of a run: whether the job ends with it, and which worker pods go
(SUPERVISOR_CLEAN_POD_POLICY, mpi-operator's names).

Cleanup runs only on a *terminal* exit of a supervisor that leads the job (`terminal`): one no
launcher follows. A launcher that a Job retries (horovodrun's exit 1, a start timeout, a lost
Lease, SIGTERM of a preempted launcher pod) leaves the workers running, and the next launcher
adopts them, their budgets untouched. What the Job does next is read from the Job itself: a
success, a `FailJob` rule of its podFailurePolicy that matches the exit code, its last attempt
(backoffLimit), a Job being deleted or already finished; a run with no Job (local, a bare pod) is
always terminal, and so is a success. Never by a standby or by a leader that lost its Lease (the
workers may be another launcher's then). A Job that cannot be read at the exit (transient errors
retried for a few seconds, or a permanent one) leaves it unknown whether a launcher follows: the
workers are kept and the supervisor says so (`cleanup.kept`, Event `WorkersKept`); deleting them
could end a job its Job retries. Only a Job that is gone (404) counts as no Job.

`Running` deletes the workers still Running or Pending, so a finished job leaves no pod (and no
GPU) running sshd, and keeps the finished ones for their logs; `All` deletes every worker pod;
`None` leaves them. Only pods the supervisor created (its job's label and a slot label) are
touched, with one deletecollection call: its time is bounded by the API timeout whatever the
number of workers. Before it deletes, the cleanup marks what it deletes in the stored state
(`fleet.released`: every active slot moves to its next incarnation), so a launcher that comes
after all (a retry the Job decided otherwise) never charges those deletions to a budget: they
are pods of older incarnations to it.

A success is recorded too (`SUCCEEDED` in the stored state: the uid of the Job whose launcher
succeeded), before the leader releases its Lease: a warm standby launcher of that Job (the
manifests' `standby` overlay, Job parallelism 2) that acquires the Lease then reads it and exits
0 at once (`already_succeeded`) instead of training the job again, and the Job completes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from supervisor import kube, startup
from supervisor.config import CleanPodPolicy, Config
from supervisor.decide import fleet
from supervisor.model import EventSpec
from supervisor.workers import LABEL_JOB, LABEL_SLOT

TERMINAL_PHASES = ("Succeeded", "Failed")
DEFAULT_BACKOFF_LIMIT = 6  # batch/v1 Job's default
FINISHED = ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")


SUCCEEDED = "succeeded"


def success_mark(code: int, owner: Mapping[str, str] | None) -> str | None:
    """What a terminal exit stores under SUCCEEDED: the uid of the supervisor's Job when the
    exit is a success (a standby of that Job then ends too), else None (nothing to store)."""
    if code != 0 or not owner or owner.get("kind") != "Job":
        return None
    return owner.get("uid") or None


def already_succeeded(stored: Mapping[str, Any] | None,
                      owner: Mapping[str, str] | None) -> bool:
    """Whether a launcher of this Job (`owner`, the supervisor's) already ended the job with
    success, by the stored state; a run with no Job never counts one (no standby there)."""
    return bool(stored and owner and owner.get("kind") == "Job" and owner.get("uid")
                and stored.get(SUCCEEDED) == owner["uid"])


def worker_selector(job: str) -> str:
    """The label selector of every worker pod the supervisor created for `job`."""
    return f"{LABEL_JOB}={job},{LABEL_SLOT}"


def selectors(policy: CleanPodPolicy, job: str) -> tuple[str, str] | None:
    """Return (label selector, field selector) of the worker pods `policy` deletes, or None
    when it deletes nothing."""
    if policy is CleanPodPolicy.NONE:
        return None
    labels = worker_selector(job)
    if policy is CleanPodPolicy.ALL:
        return labels, ""
    return labels, ",".join(f"status.phase!={p}" for p in TERMINAL_PHASES)


def terminal(code: int, job: Mapping[str, Any] | None) -> str | None:
    """Why the supervisor's exit `code` ends the job for good, or None when its Job will run
    another launcher (which adopts the workers). `job` is the launcher's batch/v1 Job as read
    now, None when there is none or when it was not read (a success ends the job whatever the
    Job says: the exit does not read it)."""
    if job is None:
        return "success" if code == 0 else "no Job runs another launcher"
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "the Job is being deleted"
    done = [c["type"] for c in status.get("conditions") or ()
            if c.get("type") in FINISHED and c.get("status") == "True"]
    if done:
        return f"the Job is {done[0]}"
    if code == 0:
        return "success"
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or ():
        codes = rule.get("onExitCodes")
        if not codes:
            continue  # onPodConditions: a disruption, not something an exit code says
        values = set(codes.get("values") or ())
        if (code in values) != (codes.get("operator") == "In"):
            continue
        if rule.get("action") == "FailJob":
            return f"exit {code} matches the Job's podFailurePolicy rule FailJob"
        if rule.get("action") == "Ignore":
            return None  # retried, not counted
        break  # Count: as the backoff limit says
    limit = spec.get("backoffLimit")
    limit = DEFAULT_BACKOFF_LIMIT if limit is None else int(limit)
    failed = int(status.get("failed") or 0)
    if failed + 1 > limit:
        return f"the Job's last attempt ({failed} failed before, backoffLimit {limit})"
    return None


# ---- carried out at the exit (runner.py calls it) ----------------------------------------

JOB_READ_BUDGET_S = 10.0  # at the exit: how long a transient error reading the Job is retried


def clean_up(cfg: Config, api: Any, store: kube.StateStore, code: int, *,
             owner: Mapping[str, str] | None, log: Any,
             events: Callable[[EventSpec], None],
             read_budget_s: float = JOB_READ_BUDGET_S) -> None:
    """On a terminal exit, delete the worker pods SUPERVISOR_CLEAN_POD_POLICY removes, after
    marking them in the state (the rules above); never raises. When the Job that says
    whether the exit is terminal cannot be read, the workers are kept."""
    policy = cfg.clean_pod_policy
    job = None
    if code != 0 and owner is not None and owner.get("kind") == "Job":
        # A success ends the job whatever its Job says; any other exit needs the Job's word.
        retry = startup.ApiRetry(read_budget_s, log=log, stopping=startup.Stopping(),
                                 phase="cleanup", budget="the exit's budget")
        try:
            job = retry.call(f"read Job {owner['name']}", lambda: kube.read_job(
                api, cfg.namespace, owner["name"], cfg.api_timeout_s))
        except kube.NotFound:
            pass  # gone (deleted with orphans): nobody runs another launcher
        except (kube.KubeError, startup.StartTimedOut) as e:
            # Unknown whether a launcher follows: deleting could end a job its Job retries.
            log.warning("cleanup.kept", job=owner["name"], code=code, policy=policy.value,
                        reason=str(e))
            events(EventSpec("Warning", "WorkersKept", "Cleanup",
                             f"exit {code}: Job {owner['name']} could not be read, so whether "
                             f"another launcher follows is unknown ({e}); the workers are kept "
                             f"(SUPERVISOR_CLEAN_POD_POLICY={policy.value} not applied): the "
                             "next launcher adopts them; if none follows, delete them with "
                             f"kubectl delete pods -l '{worker_selector(cfg.job_name)}'"))
            return
    why = terminal(code, job)
    if why is None:
        log.info("cleanup.skipped", code=code, reason="the Job runs another launcher, which "
                 "adopts the workers")
        return
    chosen = selectors(policy, cfg.job_name)
    success = success_mark(code, owner)
    try:
        if chosen is not None or success:
            _mark_end(store, release=chosen is not None, succeeded=success)
        deleted = ([] if chosen is None else
                   kube.Pods(api, cfg.namespace, cfg.api_timeout_s).delete_all(*chosen))
    except (kube.KubeError, ValueError) as e:
        log.error("cleanup.failed", policy=policy.value, reason=str(e))
        events(EventSpec("Warning", "CleanupFailed", "Cleanup",
                         f"SUPERVISOR_CLEAN_POD_POLICY={policy.value}: could not delete the "
                         f"workers: {e}"))
        return
    log.info("cleanup.done", policy=policy.value, deleted=deleted, terminal=why)
    if deleted:
        shown = ", ".join(deleted[:20]) + (f" and {len(deleted) - 20} more"
                                           if len(deleted) > 20 else "")
        events(EventSpec("Normal", "WorkersCleanedUp", "Cleanup",
                         f"SUPERVISOR_CLEAN_POD_POLICY={policy.value} ({why}): deleted "
                         f"{len(deleted)} worker pods: {shown}"))


def _mark_end(store: kube.StateStore, *, release: bool, succeeded: str | None) -> None:
    """Store every active slot at its next incarnation (fleet.released) before its pod is
    deleted (`release`), and the uid of the Job that succeeded (SUCCEEDED), in one
    write; raise KubeError or ValueError (then nothing may be deleted)."""
    stored, rv = store.load()
    if stored is None:
        return
    marked = (fleet.fleet_to_dict(fleet.released(fleet.fleet_from_dict(stored))) if release
              else {})
    store.save({**stored, **marked, **({SUCCEEDED: succeeded} if succeeded else {})},
               rv)
