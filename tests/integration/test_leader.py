"""One driver per job: leader election on a coordination.k8s.io Lease, with real supervisor
processes on the real control plane. A second launcher of the same job waits as a standby and
never runs horovodrun or touches the workers; it takes over (adopting workers and budgets) when
the leader dies; a leader cut off from the API keeps training and writes nothing until it can
renew again, and stops horovodrun only when it sees another launcher holding the Lease."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor.hook.elastic_supervisor_hook.owner import OWNER_ENV
from supervisor.leader import lease_name
from supervisor.model import ExitCode
from tests.helpers import wait_for
from tests.integration.harness import Job, SupervisorProcess, event_reasons, pid_alive
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)
from tests.integration.proxy import TcpProxy


def second(control_plane: ControlPlane, namespace: str, tmp: Path, *, job: Job,
           **env: str) -> SupervisorProcess:
    """Another launcher of job1: its own directory (its own pod), the same template."""
    own = tmp / "second"
    own.mkdir(exist_ok=True)
    return SupervisorProcess(control_plane, namespace, own, **{
        "SUPERVISOR_WORKER_TEMPLATE": str(job.template(own / "worker.json")),
        "SUPERVISOR_BACKOFF_INITIAL_SECONDS": "0.5", **env}).start()


def uids(job: Job) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in job.pods().items()}


def test_a_second_launcher_waits_as_a_standby_and_never_drives_the_job(
        job: Job, supervisor, control_plane: ControlPlane, namespace: str,
        tmp_path: Path) -> None:
    job.node("n1")
    first = supervisor()
    running(job, 2)
    first.wait_log("horovodrun.started")
    before = uids(job)
    other = second(control_plane, namespace, tmp_path, job=job)
    try:
        waiting = other.wait_log("leader.waiting", timeout=15)
        assert waiting["holder"].startswith("job1-")  # the first launcher's identity
        time.sleep(3)
        assert other.records("start") == [], "a standby started horovodrun"
        assert other.proc.poll() is None
        assert uids(job) == before, "a standby created or deleted workers"
        assert not other.discovery_file.exists()
        assert "LeaderWaiting" in event_reasons(job.api, namespace)
        # A standby told to stop leaves the leader's workers alone.
        other.signal(signal.SIGTERM)
        assert other.wait_exit(15) == 143
        assert uids(job) == before and job.live() == sorted(before)
        assert first.proc.poll() is None
    finally:
        other.close()


def test_a_standby_takes_over_when_the_leader_dies(
        job: Job, supervisor, control_plane: ControlPlane, namespace: str,
        tmp_path: Path) -> None:
    job.node("n1")
    first = supervisor(SUPERVISOR_LEADER_LEASE_SECONDS="4")
    running(job, 2)
    first.wait_log("horovodrun.started")
    before = uids(job)
    other = second(control_plane, namespace, tmp_path, job=job,
                   SUPERVISOR_LEADER_LEASE_SECONDS="4")
    try:
        other.wait_log("leader.waiting", timeout=15)
        first.signal(signal.SIGKILL)  # no release: the standby waits out the lease
        killed_at = time.monotonic()
        first.wait_exit(10)
        acquired = other.wait_log("leader.acquired", timeout=20)
        took = time.monotonic() - killed_at
        assert 2 <= took < 15, f"took over {took:.1f}s after the leader died (lease 4s)"
        assert acquired["transitions"] == 1
        wait_for(lambda: other.records("start"), 20, what="the new leader's horovodrun")
        # Each leader's training processes claim their workers with its term (hook owner.py):
        # the Lease's uid and its transitions when taken; the new leader's is the newer.
        lease = client.CoordinationV1Api(job.api).read_namespaced_lease(
            lease_name("job1"), namespace)
        assert [r["hook"][OWNER_ENV] for r in first.records("start")
                + other.records("start")] == [f"{lease.metadata.uid}.0",
                                              f"{lease.metadata.uid}.1"]
        assert uids(job) == before, "the new leader must adopt, not recreate"
        other.wait_content([job.line(n) for n in sorted(before)])
    finally:
        other.close()


def named(sup: SupervisorProcess, event: str) -> list[dict]:
    return [r for r in sup.logs() if r.get("event") == event]


@contextlib.contextmanager
def proxied_leader(job: Job, control_plane: ControlPlane, namespace: str,
                   tmp_path: Path) -> Iterator[tuple[SupervisorProcess, TcpProxy, int]]:
    """A leader (lease 6 s) whose API connections go through a proxy the test can stall,
    running its stand-in horovodrun with 2 workers: (leader, proxy, the stand-in's pid)."""
    job.node("n1")
    proxy = TcpProxy(control_plane.ports["apiserver"]).forward()
    kubeconfig = proxy.kubeconfig(control_plane.kubeconfig, tmp_path / "proxied.kubeconfig")
    leader = SupervisorProcess(control_plane, namespace, tmp_path, **{
        "KUBECONFIG": str(kubeconfig), "SUPERVISOR_LEADER_LEASE_SECONDS": "6",
        "SUPERVISOR_BACKOFF_INITIAL_SECONDS": "0.5",
        "SUPERVISOR_WORKER_TEMPLATE": str(job.template(tmp_path / "worker.json"))}).start()
    try:
        running(job, 2)
        leader.wait_log("horovodrun.started")
        yield leader, proxy, wait_for(lambda: leader.records("start"), 10,
                                      what="stand-in")[0]["pid"]
    finally:
        leader.close()
        proxy.close()


def test_a_leader_cut_off_from_the_api_keeps_training_writes_nothing_and_reconciles_after(
        job: Job, control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    with proxied_leader(job, control_plane, namespace, tmp_path) as (leader, proxy, standin):
        made = len(named(leader, "worker.created"))
        proxy.stall()  # the API is gone for the supervisor: twice the lease duration
        paused = leader.wait_log("leader.paused", timeout=15)
        assert "could not renew" in paused["reason"]
        gone = sorted(job.pods())[0]  # meanwhile a worker is deleted (the API does not tell)
        job.core.delete_namespaced_pod(gone, namespace, grace_period_seconds=0)
        time.sleep(12)
        assert leader.proc.poll() is None, "the supervisor ended the run during an outage"
        assert pid_alive(standin), "training was stopped during an outage"
        assert leader.records("start")[-1]["pid"] == standin
        assert len(job.pods()) == 1, "a worker was created while not leading"
        assert len(named(leader, "worker.created")) == made
        proxy.forward()  # the API is back: renew, then reconcile what changed meanwhile
        resumed = leader.wait_log("leader.resumed", timeout=20)
        assert resumed["paused_s"] >= 12
        running(job, 2)
        created = named(leader, "worker.created")[made:]
        assert len(created) == 1 and created[0]["timestamp"] > resumed["timestamp"]
        assert pid_alive(standin) and leader.proc.poll() is None
        assert not named(leader, "leader.lost")
        assert "LeadershipResumed" in event_reasons(job.api, namespace)


def test_a_run_that_ends_while_its_leader_is_cut_off_is_judged_by_the_lease(
        job: Job, control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    """The standby took the Lease and its training processes ended the cut-off leader's (hook
    owner.py): that horovodrun exits while its launcher cannot read the Lease. Its exit is
    no verdict on the job (exit 1 would count against the Job's backoffLimit, a FailJob code
    would end it): held until the Lease is read, then LEADERSHIP_LOST (7, retried)."""
    with proxied_leader(job, control_plane, namespace, tmp_path) as (leader, proxy, standin):
        other = second(control_plane, namespace, tmp_path, job=job,
                       SUPERVISOR_LEADER_LEASE_SECONDS="6")
        try:
            other.wait_log("leader.waiting", timeout=15)
            proxy.stall()
            leader.wait_log("leader.paused", timeout=15)
            other.wait_log("leader.acquired", timeout=30)
            os.kill(standin, signal.SIGKILL)  # the new term's processes ended the old run
            held = leader.wait_log("horovodrun.exit_held", timeout=15)
            assert held["code"] == 137, held  # the stand-in's SIGKILL, shell-style (not a flag)
            time.sleep(3)
            assert leader.proc.poll() is None, "judged the job while cut off from the Lease"
            proxy.forward()
            assert leader.wait_exit(30) == ExitCode.LEADERSHIP_LOST
            assert "is held by 'job1-" in leader.wait_log("leader.lost")["reason"]
            assert not named(leader, "cleanup.done"), "a leader that lost cleaned up"
        finally:
            other.close()


def test_a_leader_that_sees_another_holder_stops_horovodrun(
        job: Job, control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    with proxied_leader(job, control_plane, namespace, tmp_path) as (leader, proxy, standin):
        other = second(control_plane, namespace, tmp_path, job=job,
                       SUPERVISOR_LEADER_LEASE_SECONDS="6")
        try:
            other.wait_log("leader.waiting", timeout=15)
            proxy.stall()  # the leader is cut off from the API; the standby is not
            leader.wait_log("leader.paused", timeout=15)
            other.wait_log("leader.acquired", timeout=30)
            # The documented price of riding out outages: the cut-off leader cannot know yet.
            assert pid_alive(standin) and leader.proc.poll() is None
            proxy.forward()  # it reads the Lease again: held by the other launcher
            assert leader.wait_exit(30) == ExitCode.LEADERSHIP_LOST
            lost = leader.wait_log("leader.lost")
            assert "is held by 'job1-" in lost["reason"]
            assert not pid_alive(standin)
            assert len(job.pods()) == 2
            assert not named(leader, "cleanup.done"), "a leader that lost cleaned up"
        finally:
            other.close()
