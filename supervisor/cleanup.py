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

from collections.abc import Mapping
from typing import Any

from supervisor.config import CleanPodPolicy
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
