"""SUPERVISOR_CLEAN_POD_POLICY (mpi-operator's names and meanings) on every way out of a real
supervisor on the real control plane: success, FailJob, too few workers, start timeout, SIGTERM.

Running (the default) deletes the workers still Running or Pending, All deletes every worker
pod, None leaves them. A finished job never leaves pods running sshd."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.model import ExitCode
from tests.helpers import wait_for
from tests.integration.harness import Job, SupervisorProcess, wait_reason
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)


@dataclass(frozen=True)
class WayOut:
    env: dict[str, str]
    # Drives the job to its end once its workers run: (supervisor, job) -> None.
    end: Callable[[SupervisorProcess, Job], None]
    code: int


def finish(sup: SupervisorProcess, job: Job) -> None:
    pass  # the stand-in horovodrun exits 0 on its own (FAKE_EXIT_AFTER)


def fail_job(sup: SupervisorProcess, job: Job) -> None:
    job.terminate("job1-w1-1", 3)


def lose_workers(sup: SupervisorProcess, job: Job) -> None:
    job.terminate("job1-w1-1", 1)  # Ignore: 1 slot left of MIN_NP 2


def sigterm(sup: SupervisorProcess, job: Job) -> None:
    sup.signal(signal.SIGTERM)


WAYS = {
    "success": WayOut({"FAKE_EXIT_AFTER": "3"}, finish, 0),
    "FailJob": WayOut({"SUPERVISOR_FAIL_EXIT_CODES": "3"}, fail_job, ExitCode.POLICY_FAILED),
    "too few workers": WayOut({}, lose_workers, ExitCode.WORKERS_LOST),
    "SIGTERM": WayOut({}, sigterm, 143),
}


@pytest.mark.parametrize(("way", "policy", "left"), [
    pytest.param("success", None, [], id="success, default Running: no worker left"),
    pytest.param("FailJob", "Running", ["job1-w1-1"],
                 id="FailJob, Running: the failed worker stays for its logs"),
    pytest.param("FailJob", "All", [], id="FailJob, All: nothing stays"),
    pytest.param("too few workers", "Running", ["job1-w1-1"],
                 id="too few workers, Running: the dropped worker stays"),
    pytest.param("SIGTERM", "Running", [], id="SIGTERM, Running: no worker left"),
    pytest.param("SIGTERM", "None", ["job1-w0-1", "job1-w1-1"],
                 id="SIGTERM, None: every worker stays, still running"),
])
def test_the_clean_pod_policy_applies_on_the_way_out(
        job: Job, supervisor, way: str, policy: str | None, left: list[str]) -> None:
    w = WAYS[way]
    job.node("n1")
    env = {**w.env, **({"SUPERVISOR_CLEAN_POD_POLICY": policy} if policy else {})}
    sup = supervisor(SUPERVISOR_SHUTDOWN_GRACE_SECONDS="5", **env)
    running(job, 2)
    sup.wait_log("horovodrun.started")
    w.end(sup, job)
    assert sup.wait_exit(30) == w.code
    done = sup.wait_log("cleanup.done")
    assert done["policy"] == (policy or "Running")
    if policy == "None":
        assert done["deleted"] == []
        assert job.live() == left  # untouched: still running
    else:
        wait_for(lambda: sorted(job.pods()) == left, 10, what=f"only {left} left")
        wait_reason(job.api, job.namespace, "WorkersCleanedUp")


def test_a_start_timeout_deletes_the_workers_that_never_ran(job: Job, supervisor) -> None:
    job.node("n1")
    assert job.kubelet is not None
    job.kubelet.hold.update({"job1-w0-1", "job1-w1-1"})  # e.g. an image that cannot be pulled
    sup = supervisor(SUPERVISOR_START_TIMEOUT_SECONDS="4")
    wait_for(lambda: len(job.pods()) == 2, 10, what="2 pending workers")
    assert sup.wait_exit(30) == ExitCode.START_TIMEOUT
    assert sup.wait_log("cleanup.done")["deleted"] == ["job1-w0-1", "job1-w1-1"]
    wait_for(lambda: not job.pods(), 10, what="the pending workers deleted")


def test_a_bad_policy_value_is_refused_at_start(supervisor, job: Job, tmp_path: Path) -> None:
    sup = supervisor(SUPERVISOR_CLEAN_POD_POLICY="Always")
    assert sup.wait_exit(10) == ExitCode.CONFIG
    assert sup.output().strip() == ("elastic-supervisor: SUPERVISOR_CLEAN_POD_POLICY='Always': "
                                    "expected one of Running|All|None")
    assert job.pods() == {}
