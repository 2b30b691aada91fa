"""Admission refuses worker creates on the real API server (a ResourceQuota, a namespace
enforcing PodSecurity `restricted`): the 403 is not the supervisor's own permission, so the job
is not failed. The create waits and is retried with backoff, the job trains on within MIN_NP,
and a `ReplacementBlocked` Warning Event carries the API's reason."""

from __future__ import annotations

import time

from kubernetes import client

from tests.helpers import wait_for
from tests.integration.harness import Job, supervisor_events
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)


def blocked_notes(api: client.ApiClient, namespace: str) -> list[str]:
    return [e.get("note", "") for e in supervisor_events(api, namespace)
            if e["reason"] == "ReplacementBlocked"]


def quota_used(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    q = core.read_namespaced_resource_quota(name, namespace)
    return dict((q.status and q.status.used) or {})


def test_a_replacement_refused_by_a_quota_waits_and_the_job_trains_on(
        job: Job, supervisor, api_client: client.ApiClient, namespace: str) -> None:
    core = job.core
    job.node("n1")
    sup = supervisor(SUPERVISOR_MIN_NP="1")
    running(job, 2)
    sup.wait_log("horovodrun.started")
    # The team's quota is cut to one pod: the two running ones stay, nothing new is admitted.
    core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}})
    wait_for(lambda: quota_used(core, namespace, "pods").get("pods") == "2", 30,
             what="the quota controller counting the pods")
    job.terminate("job1-w0-1", 137)
    blocked = sup.wait_log("worker.create_blocked", timeout=15, pod="job1-w0-2")
    assert "exceeded quota" in blocked["reason"]
    notes = wait_for(lambda: blocked_notes(api_client, namespace), 10,
                     what="a ReplacementBlocked Event")
    assert "job1-w0-2" in notes[0] and "exceeded quota: pods" in notes[0]
    # The job goes on with the worker it has.
    sup.wait_content([job.line("job1-w1-1")])
    time.sleep(3)
    assert sup.proc.poll() is None, f"the supervisor exited with {sup.proc.returncode}"
    assert job.live() == ["job1-w1-1"]
    retries = [e for e in sup.logs() if e.get("event") == "worker.create_blocked"]
    assert len(retries) >= 2, "the refused create is tried again"
    assert len(retries) <= 6, f"{len(retries)} attempts in a few seconds: no backoff"
    # The quota is raised: the replacement is created at the next attempt.
    core.patch_namespaced_resource_quota("pods", namespace, {"spec": {"hard": {"pods": "2"}}})
    assert running(job, 2, timeout=60) == ["job1-w0-2", "job1-w1-1"]
    created = sup.wait_log("worker.created", pod="job1-w0-2")
    assert created["refused_before"] >= 2
    sup.wait_content([job.line("job1-w0-2"), job.line("job1-w1-1")])
    assert sup.proc.poll() is None


def test_workers_refused_by_pod_security_wait_until_the_namespace_admits_them(
        job: Job, supervisor, api_client: client.ApiClient, namespace: str) -> None:
    core = job.core
    job.node("n1")
    # The harness's worker template sets no securityContext: `restricted` refuses it.
    core.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    sup = supervisor()
    blocked = sup.wait_log("worker.create_blocked", timeout=15, pod="job1-w0-1")
    assert 'violates PodSecurity "restricted' in blocked["reason"]
    notes = wait_for(lambda: blocked_notes(api_client, namespace), 10,
                     what="a ReplacementBlocked Event")
    assert any("violates PodSecurity" in n for n in notes)
    time.sleep(2)
    assert sup.proc.poll() is None, f"the supervisor exited with {sup.proc.returncode}"
    assert job.pods() == {}
    core.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})
    running(job, 2, timeout=60)
    sup.wait_log("horovodrun.started", timeout=20)
