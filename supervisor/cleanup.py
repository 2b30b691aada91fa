"""The end of a run: which worker pods go, by SUPERVISOR_CLEAN_POD_POLICY (mpi-operator's names).

Applied on every way out of a supervisor that leads the job (success, FailJob, too few workers,
start timeout, a signal, a crash), never by a standby or by a leader that lost its Lease (the
workers may be another launcher's then). `Running` deletes the workers still Running or Pending,
so a finished job leaves no pod (and no GPU) running sshd, and keeps the finished ones for
their logs; `All` deletes every worker pod; `None` leaves them. Only pods the supervisor created
(its job's label and a slot label) are touched, with one deletecollection call: its time is
bounded by the API timeout whatever the number of workers.
"""

from __future__ import annotations

from supervisor.config import CleanPodPolicy
from supervisor.workers import LABEL_JOB, LABEL_SLOT

TERMINAL_PHASES = ("Succeeded", "Failed")


def selectors(policy: CleanPodPolicy, job: str) -> tuple[str, str] | None:
    """Return (label selector, field selector) of the worker pods `policy` deletes, or None
    when it deletes nothing."""
    if policy is CleanPodPolicy.NONE:
        return None
    labels = f"{LABEL_JOB}={job},{LABEL_SLOT}"
    if policy is CleanPodPolicy.ALL:
        return labels, ""
    return labels, ",".join(f"status.phase!={p}" for p in TERMINAL_PHASES)
