"""Operating a job on the real control plane: `scale` (out, in, rollback, out of range) and
`status` (table and JSON), run as real CLI processes against a real supervisor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from kubernetes import client

from localcluster.controlplane import ControlPlane, free_ports
from supervisor.model import ExitCode
from tests.helpers import wait_for
from tests.integration.harness import Job, event_reasons, scrape
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)


def cli(cp: ControlPlane, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "KUBECONFIG": str(cp.kubeconfig)}
    return subprocess.run([sys.executable, "-m", "supervisor", *args, "--job", "job1",
                           "--namespace", namespace], capture_output=True, text=True, env=env,
                          check=False, timeout=60)


def test_scale_out_then_in_while_running(control_plane: ControlPlane, job: Job, supervisor,
                                         api_client: client.ApiClient, namespace: str) -> None:
    job.node("n1")
    port = free_ports(1)[0]
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_MIN_NP="1", SUPERVISOR_MAX_NP="3",
                     SUPERVISOR_METRICS_PORT=str(port))
    running(job, 2)
    wait_for(lambda: sup.records("start"), 10, what="the stand-in horovodrun running")
    out = cli(control_plane, namespace, "scale", "--add", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("job1: desired workers 2 -> 3")
    assert running(job, 3) == ["job1-w0-1", "job1-w1-1", "job1-w2-1"]
    sup.wait_content([job.line(n) for n in ("job1-w0-1", "job1-w1-1", "job1-w2-1")])
    assert sup.wait_log("scale.applied")["workers_to"] == 3
    out = cli(control_plane, namespace, "scale", "--workers", "1")
    assert out.returncode == 0, out.stderr
    assert running(job, 1) == ["job1-w0-1"]
    sup.wait_content([job.line("job1-w0-1")])
    removed = {e["pod"] for e in sup.logs() if e.get("event") == "scale.worker_removed"}
    assert removed == {"job1-w1-1", "job1-w2-1"}
    # Removed from the discovery file before being deleted, never seen as failures.
    assert not [e for e in sup.logs() if e.get("event") == "worker.failed"]
    def both_posted() -> bool:
        reasons = event_reasons(api_client, namespace)
        return reasons.count("Scaled") == 2 and reasons.count("WorkerRemoved") == 2

    wait_for(both_posted, 5, what="Scaled and WorkerRemoved Events")
    assert sup.proc.poll() is None
    metrics = scrape(port)
    p = "elastic_supervisor_"
    assert (metrics[f"{p}workers_desired"], metrics[f"{p}workers_live"],
            metrics[f"{p}workers_usable"], metrics[f"{p}workers_created_total"]) == (1, 1, 1, 3)
    assert metrics[f"{p}restart_budget_left"] == 100  # scaling is not restarting
    assert not [k for k in metrics if k.startswith(f"{p}worker_failures_total")]


def test_scale_requests_outside_the_range_are_refused(control_plane: ControlPlane, job: Job,
                                                      supervisor) -> None:
    job.node("n1")
    supervisor(SUPERVISOR_NP="2", SUPERVISOR_MIN_NP="2", SUPERVISOR_MAX_NP="3")
    running(job, 2)
    wait_for(lambda: "limits" in json.loads(job.core.read_namespaced_config_map(
        "job1-supervisor-state", job.namespace).data["state.json"]), 10, what="state saved")
    out = cli(control_plane, job.namespace, "scale", "--workers", "5")
    assert out.returncode == ExitCode.CONFIG
    assert out.stderr == ("elastic-supervisor: scale job1: 5 workers is outside [2, 3] (the "
                          "job's MIN_NP / MAX_NP divided by SLOTS_PER_WORKER); refused\n")
    out = cli(control_plane, job.namespace, "scale", "--remove", "1")
    assert out.returncode == ExitCode.CONFIG and "1 workers is outside [2, 3]" in out.stderr
    assert "job1-supervisor-scale" not in {
        c.metadata.name for c in job.core.list_namespaced_config_map(job.namespace).items}


def test_the_supervisor_refuses_an_out_of_range_request_written_directly(
        job: Job, supervisor, api_client: client.ApiClient, namespace: str) -> None:
    job.node("n1")
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_MIN_NP="2", SUPERVISOR_MAX_NP="3")
    running(job, 2)
    job.core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "job1-supervisor-scale"},
        "data": {"scale.json": json.dumps({"workers": 9})}})
    refused = sup.wait_log("scale.refused")
    assert refused["workers"] == 9 and "outside [2, 3]" in refused["reason"]
    wait_for(lambda: "ScaleRefused" in event_reasons(api_client, namespace), 5,
             what="a ScaleRefused Event")
    assert job.live() == ["job1-w0-1", "job1-w1-1"]


def test_a_scale_out_that_never_runs_is_rolled_back(control_plane: ControlPlane, job: Job,
                                                    supervisor, api_client: client.ApiClient,
                                                    namespace: str) -> None:
    job.node("n1")
    assert job.kubelet is not None
    job.kubelet.hold.add("job1-w2-1")  # e.g. its image cannot be pulled
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_MAX_NP="3",
                     SUPERVISOR_SCALE_OUT_TIMEOUT_SECONDS="2")
    running(job, 2)
    assert cli(control_plane, namespace, "scale", "--workers", "3").returncode == 0
    rolled = sup.wait_log("scale.rolled_back", timeout=15)
    assert rolled["pod"] == "job1-w2-1"
    wait_for(lambda: "job1-w2-1" not in job.pods(), 10, what="the pod deleted again")
    assert job.live() == ["job1-w0-1", "job1-w1-1"]
    wait_for(lambda: "ScaleOutRolledBack" in event_reasons(api_client, namespace), 5,
             what="a ScaleOutRolledBack Event")
    status = json.loads(cli(control_plane, namespace, "status", "--output", "json").stdout)
    assert (status["desired"], status["requested"], status["live"]) == (2, 3, 2)
    # --add counts from the desired 2 the supervisor keeps, not from the request for 3.
    job.kubelet.hold.discard("job1-w2-1")
    again = cli(control_plane, namespace, "scale", "--add", "1")
    assert again.returncode == 0, again.stderr
    assert "desired workers 2 -> 3" in again.stdout


def normalize(text: str) -> str:
    text = re.sub(r"\b10\.\d+\.\d+\.\d+\b", "<ip>", text)
    text = re.sub(r"t-[0-9a-f]{8}", "<ns>", text)
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<time>", text)


def test_status_shows_workers_budgets_and_decisions(control_plane: ControlPlane, job: Job,
                                                    supervisor, namespace: str) -> None:
    job.node("n1")
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_RESTART_LIMIT="10")
    running(job, 2)
    job.terminate("job1-w1-1", 137)
    running(job, 2)
    sup.wait_log("worker.created", pod="job1-w1-2")
    wait_for(lambda: '"total": 1' in job.core.read_namespaced_config_map(
        "job1-supervisor-state", namespace).data["state.json"], 10, what="state saved")
    table = cli(control_plane, namespace, "status")
    assert table.returncode == 0, table.stderr
    lines = [re.sub(" {2,}", "  ", line.rstrip())  # columns: two spaces apart at least
             for line in normalize(table.stdout).splitlines()]
    assert lines[:6] == [
        "job job1 in <ns>: desired 2, live 2, listed 3; restarts 1/10 used, 9 left",
        "",
        "WORKER  SLOT  INC  HOST  NODE  STATE  READY  RESTARTS",
        "job1-w0-1  0  1  <ip>  <ns>-n1  Running  True  0",
        "job1-w1-1  1  1  <ip>  <ns>-n1  exited 137  False  0",
        "job1-w1-2  1  2  <ip>  <ns>-n1  Running  True  0",
    ]
    # the stand-in horovodrun trains nothing: no step yet; the failure is an incident, its
    # replacement created (it never joins a world here)
    assert lines[7] == "PROGRESS: no training step seen yet", lines
    assert lines[8].startswith("LAST INCIDENT #1 ExitCode w1 (failure, open): "), lines
    assert "created +" in lines[8], lines
    assert lines[10] == "LAST DECISIONS"
    decisions = "\n".join(lines[11:])
    assert "Warning  WorkerRestarting  worker job1-w1-1 (slot 1)" in decisions
    assert "Normal  WorkerCreated  created worker pod job1-w1-2" in decisions
    data = json.loads(cli(control_plane, namespace, "status", "--output", "json").stdout)
    assert (data["desired"], data["live"], data["listed"]) == (2, 2, 3)
    assert data["restarts"] == {"used": 1, "limit": 10, "left": 9}
    assert [(w["pod"], w["slot"], w["incarnation"], w["state"]) for w in data["workers"]] == [
        ("job1-w0-1", 0, 1, "Running"), ("job1-w1-1", 1, 1, "exited 137"),
        ("job1-w1-2", 1, 2, "Running")]
    [incident] = data["incidents"]
    assert (incident["cause"], incident["kind"], incident["pods"], incident["open"]) == (
        "ExitCode", "failure", ["job1-w1-1"], True)
    assert incident["replacements"] == ["job1-w1-2"] and "created" in incident["phases"]


def test_status_of_an_unknown_job_says_so(control_plane: ControlPlane, namespace: str,
                                          tmp_path: Path) -> None:
    out = cli(control_plane, namespace, "scale", "--workers", "2")
    assert out.returncode == ExitCode.CONFIG
    assert "no supervisor state for job job1" in out.stderr
    drawing = cli(control_plane, namespace, "timeline", "-o", str(tmp_path / "t.png"))
    assert drawing.returncode == 1
    assert drawing.stderr.strip() == (
        f"elastic-supervisor: no supervisor state for job job1 in {namespace} (configmap "
        f"{namespace}/job1-supervisor-state): nothing to draw")
    assert not (tmp_path / "t.png").exists()
    status = cli(control_plane, namespace, "status")
    assert status.returncode == 0
    assert status.stdout.startswith(f"job job1 in {namespace}: desired None, live 0, listed 0")
