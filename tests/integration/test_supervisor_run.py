"""`elastic-supervisor run` as a real process on the real control plane, with a stand-in
horovodrun that polls the real discovery script: the start gate, the discovery file following
pods and nodes, signal forwarding, exit-code propagation, tree killing, restart adoption."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane, free_ports
from localcluster.kubelet import set_node_ready, set_pod_ready
from supervisor.model import ExitCode
from tests.helpers import NODE_GRACE_S, wait_for
from tests.integration.harness import (
    Job,
    SupervisorProcess,
    event_reasons,
    pid_alive,
    scrape,
    service_account_kubeconfig,
)


@pytest.fixture
def job(api_client: client.ApiClient, namespace: str) -> Iterator[Job]:
    j = Job(api_client, namespace)
    yield j
    j.close()


@pytest.fixture
def supervisor(control_plane: ControlPlane, namespace: str, tmp_path: Path):
    started: list[SupervisorProcess] = []

    def make(**env: str) -> SupervisorProcess:
        s = SupervisorProcess(control_plane, namespace, tmp_path, **env)
        started.append(s)
        return s

    yield make
    for s in started:
        s.close()


def test_start_gate_then_the_file_follows_pods_and_nodes(
    job: Job, supervisor, api_client: client.ApiClient, namespace: str
) -> None:
    core = job.core
    n1, n2 = job.node("n1"), job.node("n2")
    job.worker("w0", n1)
    metrics_port = free_ports(1)[0]
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_MAX_NP="4",
                     SUPERVISOR_METRICS_PORT=str(metrics_port)).start()

    # Synced with 1 of min 2 slots: the file is there, horovodrun is not started.
    sup.wait_content([job.line("w0")])
    sup.wait_log("start.waiting", slots=1)
    assert sup.records("start") == []

    job.worker("w1", n2)
    start = wait_for(lambda: sup.records("start"), 10, what="horovodrun start")[0]
    # the stand-in horovodrun records its start, then calls the discovery script
    first = wait_for(lambda: sup.records("discover"), 10, what="the first discovery call")[0]
    assert first["rc"] == 0, "the first discovery call must succeed"
    assert sorted(first["out"].splitlines()) == sorted([job.line("w0"), job.line("w1")])
    assert start["argv"][:6] == ["-np", "2", "--min-np", "2", "--max-np", "4"]
    assert start["argv"][-2:] == ["python", "train.py"]
    assert start["discovery_file"] == str(sup.discovery_file)

    set_pod_ready(core, namespace, "w1", False)
    sup.wait_content([job.line("w0")])
    set_pod_ready(core, namespace, "w1", True)
    sup.wait_content([job.line("w0"), job.line("w1")])

    job.worker("w2", n1, running=False)  # scheduled, not started yet: not usable
    time.sleep(0.5)
    assert sup.content() == "".join(sorted(f"{job.line(w)}\n" for w in ("w0", "w1")))
    job.start("w2")
    sup.wait_content([job.line("w0"), job.line("w1"), job.line("w2")])

    # The stand-in kubelet must stop renewing first: it reports Ready=True again within a
    # second of seeing anything else, and the host would come back before the wait saw it gone.
    job.heartbeats.silence(n2)
    set_node_ready(core, n2, "False")
    sup.wait_content([job.line("w0"), job.line("w2")])
    job.heartbeats.resume(n2)
    sup.wait_content([job.line("w0"), job.line("w1"), job.line("w2")])

    # A node that stops heartbeating is marked Unknown + tainted by the real controller-manager.
    job.heartbeats.silence(n2)
    sup.wait_content([job.line("w0"), job.line("w2")], timeout=NODE_GRACE_S + 10)

    core.delete_namespaced_pod("w0", namespace, grace_period_seconds=30)  # graceful: Terminating
    sup.wait_content([job.line("w2")])

    # Whatever happened, the script never printed an empty host list with success.
    discovers = sup.records("discover")
    assert all(r["out"].strip() for r in discovers if r["rc"] == 0)
    assert len(discovers) > 10

    metrics = scrape(metrics_port)
    assert metrics["elastic_supervisor_horovodrun_up"] == 1
    assert metrics["elastic_supervisor_workers_usable"] == 1
    assert metrics["elastic_supervisor_workers_listed"] == 3
    assert metrics["elastic_supervisor_discovery_writes_total"] >= 7
    assert metrics["elastic_supervisor_discovery_latency_seconds_count"] >= 7
    assert 0 <= metrics['elastic_supervisor_watch_last_event_age_seconds{kind="pod"}'] < 30
    assert 'elastic_supervisor_watch_last_event_age_seconds{kind="node"}' in metrics
    # The collector (collector.py) froze what lived at a pass and times every collection.
    assert metrics['elastic_supervisor_gc_pause_seconds_count{generation="2"}'] >= 1
    assert metrics['elastic_supervisor_gc_pause_seconds_count{generation="0"}'] >= 1

    sup.signal(signal.SIGTERM)
    assert sup.wait_exit() == 143
    assert [r["signum"] for r in sup.records("signal")] == [signal.SIGTERM]
    sup.wait_log("supervisor.exited", code=143)
    reasons = wait_for(lambda: (r := event_reasons(api_client, namespace))
                       and "HorovodrunExited" in r and r, 10, what="events")
    assert reasons[0] == "HorovodrunStarted"
    assert "WorkersChanged" in reasons and "Stopping" in reasons


def test_horovodrun_exit_code_is_propagated_and_leftovers_killed(job: Job, supervisor) -> None:
    n1 = job.node("n1")
    job.worker("w0", n1)
    sup = supervisor(SUPERVISOR_NP="1", FAKE_EXIT_AFTER="1", FAKE_EXIT_CODE="7",
                     FAKE_GRANDCHILD="1").start()
    assert sup.wait_exit() == 7
    grandchild = sup.records("grandchild")[0]["pid"]
    assert not pid_alive(grandchild), "an orphan of horovodrun's tree survived"
    exited = sup.wait_log("horovodrun.exited", code=7)
    assert exited["leftovers_killed"] >= 1


def test_orphans_of_the_tree_are_reaped_while_it_runs(job: Job, supervisor) -> None:
    job.worker("w0", job.node("n1"))
    sup = supervisor(SUPERVISOR_NP="1", FAKE_ORPHAN="1").start()
    orphan = wait_for(lambda: sup.records("orphan"), 10, what="orphan started")[0]["pid"]
    # It exits after 1 s as a child of the supervisor (subreaper): no zombie may stay behind.
    wait_for(lambda: not Path(f"/proc/{orphan}").exists(), 10, what="orphan reaped")
    assert sup.proc is not None and sup.proc.poll() is None, "the supervisor must keep running"


def test_a_horovodrun_that_exits_0_on_the_forwarded_sigterm_still_ends_the_job_143(
        job: Job, supervisor) -> None:
    """Stopped is not finished: a 0 would make the Job Succeeded with its training cut short."""
    job.worker("w0", job.node("n1"))
    sup = supervisor(SUPERVISOR_NP="1", FAKE_TERM_CODE="0").start()
    wait_for(lambda: sup.records("start"), 10, what="stand-in started")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit() == 143
    assert [r["signum"] for r in sup.records("signal")] == [signal.SIGTERM]
    exited = sup.wait_log("supervisor.exited", code=143)
    assert "stopped, not finished" in exited["reason"]
    sup.wait_log("horovodrun.exited", code=0)  # what horovodrun itself did


def test_grace_expiry_kills_the_whole_tree(job: Job, supervisor) -> None:
    job.worker("w0", job.node("n1"))
    sup = supervisor(SUPERVISOR_NP="1", SUPERVISOR_SHUTDOWN_GRACE_SECONDS="1",
                     FAKE_IGNORE_TERM="1", FAKE_GRANDCHILD="1").start()
    wait_for(lambda: sup.records("grandchild"), 10, what="stand-in started")
    t0 = time.monotonic()
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit() == 128 + signal.SIGKILL
    took = time.monotonic() - t0
    assert 1.0 <= took < 5, f"killed after {took:.1f}s, grace was 1s"
    assert sup.records("signal"), "SIGTERM was not forwarded first"
    assert not pid_alive(sup.records("grandchild")[0]["pid"])
    sup.wait_log("shutdown.killed_tree", reason="shutdown grace expired")


def test_start_timeout_fails_with_its_own_code_and_a_warning_event(
    supervisor, api_client: client.ApiClient, namespace: str
) -> None:
    sup = supervisor(SUPERVISOR_NP="2", SUPERVISOR_START_TIMEOUT_SECONDS="2").start()
    assert sup.wait_exit() == ExitCode.START_TIMEOUT
    entry = sup.wait_log("start.timeout")
    assert entry["slots"] == 0 and entry["min_np"] == 2
    assert sup.records("start") == []
    wait_for(lambda: "StartTimeout" in event_reasons(api_client, namespace), 10,
             what="StartTimeout event")


def test_a_restarted_supervisor_adopts_workers_and_writes_the_same_file(
    job: Job, supervisor
) -> None:
    n1, n2 = job.node("n1"), job.node("n2")
    job.worker("w0", n1)
    job.worker("w1", n2)
    pods_before = [p.metadata.uid for p in job.core.list_namespaced_pod(job.namespace).items]
    first = supervisor(SUPERVISOR_NP="2").start()
    wait_for(lambda: first.records("start"), 10, what="first horovodrun")
    content = first.content()
    assert content is not None and len(content.splitlines()) == 2
    standin_pid = first.records("start")[0]["pid"]

    first.signal(signal.SIGKILL)
    assert first.wait_exit() == -signal.SIGKILL
    # horovodrun does not outlive its supervisor (PDEATHSIG), even on SIGKILL.
    wait_for(lambda: not pid_alive(standin_pid), 10, what="stand-in gone with its supervisor")

    second = supervisor(SUPERVISOR_NP="2").start()
    # It waits until the killed one's leader Lease expires (SUPERVISOR_LEADER_LEASE_SECONDS).
    second.wait_log("leader.acquired", timeout=30)
    wait_for(lambda: second.records("start"), 10, what="second horovodrun")
    assert second.content() == content
    # The stand-in logs its start before it runs the discovery script: wait for that too.
    [discover, *_] = wait_for(lambda: second.records("discover"), 10,
                              what="the second horovodrun's discovery")
    assert discover["out"] == content
    pods_after = [p.metadata.uid for p in job.core.list_namespaced_pod(job.namespace).items]
    assert pods_after == pods_before, "a restart must not create or delete workers"


def test_bad_configuration_exits_2_with_one_line_per_problem(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    sup = SupervisorProcess(control_plane, namespace, tmp_path, SUPERVISOR_NP="many",
                            SUPERVISOR_HOST_MOD="ip").start()
    assert sup.wait_exit() == ExitCode.CONFIG
    lines = sup.output().strip().splitlines()
    assert lines == [
        "elastic-supervisor: SUPERVISOR_HOST_MOD: unknown variable (did you mean "
        "SUPERVISOR_HOST_MODE?); see `elastic-supervisor explain`",
        "elastic-supervisor: SUPERVISOR_NP='many': expected an integer >= 1",
    ]


def test_missing_permission_is_fatal_and_named(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str, tmp_path: Path,
    job: Job,
) -> None:
    kubeconfig = service_account_kubeconfig(control_plane, api_client, namespace, [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}],
        tmp_path / "sa.kubeconfig")
    job.worker("w0", job.node("n1"))
    sup = SupervisorProcess(control_plane, namespace, tmp_path, KUBECONFIG=str(kubeconfig),
                            SUPERVISOR_NP="1").start()
    assert sup.wait_exit() == ExitCode.KUBE_FATAL
    fatal = sup.wait_log("kube.fatal")
    assert fatal["kind"] == "node"
    assert 'cannot list resource "nodes"' in fatal["reason"]
    assert sup.records("start") == []



def test_explain_validates_like_run_and_prints_the_argv(tmp_path: Path) -> None:
    import subprocess
    import sys

    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SUPERVISOR_JOB_NAME": "job1",
            "SUPERVISOR_NAMESPACE": "team-a"}
    bad = subprocess.run([sys.executable, "-m", "supervisor", "explain"], capture_output=True,
                         text=True, env={**base, "SUPERVISOR_NP": "0"}, check=False)
    assert bad.returncode == ExitCode.CONFIG
    assert bad.stderr == "elastic-supervisor: SUPERVISOR_NP='0': expected an integer >= 1\n"
    good = subprocess.run([sys.executable, "-m", "supervisor", "explain", "--", "python",
                           "train.py", "a b"], capture_output=True, text=True,
                          env={**base, "SUPERVISOR_NP": "2"}, check=False)
    assert good.returncode == 0, good.stderr
    assert "  SUPERVISOR_NP" in good.stdout and "[env]" in good.stdout
    argv_line = good.stdout.split("never through a shell):\n")[1].splitlines()[0]
    assert argv_line.endswith("python train.py 'a b'")
    assert "  Restart  exit codes 128-255  [default: exit codes 128-255" in good.stdout
    policy = tmp_path / "policy.yaml"
    policy.write_text("faultTolerantPolicy:\n- exitCodes: 3\n  action: FailJob\n"
                      "- exceptionalEvent: nodeLost\n  action: Restart\n")
    bad_policy = subprocess.run(
        [sys.executable, "-m", "supervisor", "explain"], capture_output=True, text=True,
        env={**base, "SUPERVISOR_NP": "2", "SUPERVISOR_POLICY_FILE": str(policy)}, check=False)
    assert bad_policy.returncode == ExitCode.CONFIG
    assert bad_policy.stderr.startswith(
        f"elastic-supervisor: SUPERVISOR_POLICY_FILE={str(policy)!r}: "
        "faultTolerantPolicy[1].exceptionalEvent: 'nodeLost' is not one of")
    policy.write_text("faultTolerantPolicy:\n- exitCodes: 3\n  action: FailJob\n")
    ok_policy = subprocess.run(
        [sys.executable, "-m", "supervisor", "explain"], capture_output=True, text=True,
        env={**base, "SUPERVISOR_NP": "2", "SUPERVISOR_POLICY_FILE": str(policy)}, check=False)
    assert ok_policy.returncode == 0, ok_policy.stderr
    assert "  FailJob  exit codes 3  [faultTolerantPolicy[0]]" in ok_policy.stdout
