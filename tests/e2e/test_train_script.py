"""worker_image/train.py under real horovodrun (elastic, Gloo) on worker pods of the node agent.

The workers are real pods on the local control plane: sshds on their pod IPs, reached by
horovodrun over ssh with the job's key. The discovery script `cat`s a file the test writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from tests.e2e.training import COMMIT_EVERY, TRAIN, horovod_records, steps_of
from tests.helpers import wait_for
from tests.pods import SSH_PORT, AgentPods, agent_pods, container_state, worker_pod

BIN = Path(sys.executable).parent


class Training:
    """One horovodrun run of train.py; rank 0's JSON lines are collected as they come."""

    def __init__(self, workdir: Path, pods: AgentPods, steps: int) -> None:
        self.workdir, self.pods = workdir, pods
        self.hostfile = workdir / "hostfile"
        script = workdir / "discover_hosts.sh"
        script.write_text(f"#!/bin/sh\nexec cat {self.hostfile}\n")
        script.chmod(0o755)
        self.argv = [
            str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
            "--slots-per-host", "1", "--host-discovery-script", str(script),
            "--ssh-port", str(SSH_PORT), "--ssh-identity-file", str(pods.key.private),
            # Without it horovodrun probes NICs over ssh and wants >= 2 hosts to start.
            "--network-interface", "lo",
            # A replacement must finish hvd.init() within it; survivors of a dead peer may
            # wait this long: generous for a loaded 2-core machine.
            "--gloo-timeout-seconds", "60", "--start-timeout", "60", "--elastic-timeout", "60",
            sys.executable, str(TRAIN), "--steps", str(steps),
            "--commit-every", str(COMMIT_EVERY)]
        self.output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def set_hosts(self, ips: list[str]) -> None:
        """Write the discovery file atomically: one `ip:1` line per worker."""
        tmp = self.hostfile.with_suffix(".tmp")
        tmp.write_text("".join(f"{ip}:1\n" for ip in ips))
        tmp.rename(self.hostfile)

    def start(self) -> Training:
        self.proc = subprocess.Popen(self.argv, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env=dict(os.environ))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))

    def records(self) -> list[dict[str, Any]]:
        """rank 0's JSON lines so far, in order."""
        return horovod_records("\n".join(list(self.output)))

    def last_step(self) -> int:
        return max((r["step"] for r in self.records() if "loss" in r), default=0)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None and self._reader is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"horovodrun still running after {timeout}s; output tail:\n{self.tail()}")
        self._reader.join(10)
        return code

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output[-lines:])

    def close(self) -> None:
        """Stop horovodrun's whole session if it still runs (a failed test)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def pods(control_plane: ControlPlane, core: client.CoreV1Api, namespace: str,
         tmp_path: Path) -> Iterator[AgentPods]:
    with agent_pods(control_plane, core, namespace, tmp_path / "keys") as p:
        yield p


@pytest.fixture
def workers(pods: AgentPods) -> dict[str, str]:
    """Two running worker pods: name -> pod IP."""
    for name in ("w0", "w1"):
        pods.core.create_namespaced_pod(pods.namespace,
                                        worker_pod(name, pods.agent.node_selector))
    return {name: pods.wait_running(name)["status"]["podIP"] for name in ("w0", "w1")}


@pytest.fixture
def training(tmp_path: Path, pods: AgentPods) -> Iterator[Any]:
    made: list[Training] = []

    def make(steps: int) -> Training:
        made.append(Training(tmp_path, pods, steps))
        return made[-1]

    yield make
    for t in made:
        t.close()


def test_trains_to_the_target_on_two_worker_pods(
        pods: AgentPods, workers: dict[str, str], training: Any) -> None:
    run = training(steps=30)
    run.set_hosts(list(workers.values()))
    run.start()

    def trains_in(pod: str) -> bool:
        return any("train.py" in " ".join(p.cmdline()) for p in pods.processes(pod))

    wait_for(lambda: trains_in("w0") and trains_in("w1"), 60,
             what="a train.py process inside each worker pod's tree")
    assert run.wait(90) == 0, run.tail()

    steps = steps_of(run.records())
    assert [r["step"] for r in steps] == list(range(1, 31)), run.tail()
    assert {r["size"] for r in steps} == {2}
    assert {r["lr"] for r in steps} == {0.02}, "base lr x world size"
    assert {r["host"] for r in steps} <= set(workers.values())
    assert [r["step"] for r in steps if r["committed"]] == [5, 10, 15, 20, 25, 30]
    assert [r for r in run.records() if r.get("event") == "reset"] == []
    assert run.records()[-1] | {"time": 0} == {"event": "done", "step": 30, "size": 2, "time": 0}


def test_a_killed_worker_pod_is_dropped_and_training_continues_without_losing_commits(
        pods: AgentPods, workers: dict[str, str], training: Any) -> None:
    target = 120
    run = training(steps=target)
    run.set_hosts(list(workers.values()))
    run.start()
    wait_for(lambda: run.last_step() >= 12, 60, what="training past step 12")

    # Kill the pod that does NOT host rank 0, so that rank 0's output stays complete.
    rank0 = steps_of(run.records())[-1]["host"]
    victim = next(name for name, ip in workers.items() if ip != rank0)
    pods.agent.kill(pods.ref(victim), signal.SIGKILL)
    assert container_state(pods.wait_terminated(victim))["terminated"]["exitCode"] == 137
    run.set_hosts([rank0])  # what the supervisor does when it sees the pod failed

    assert run.wait(90) == 0, run.tail()
    records = run.records()
    resets = [i for i, r in enumerate(records) if r.get("event") == "reset"]
    assert resets, f"no reset: the kill came too late? {run.tail()}"
    reset_at = resets[0]
    before, after = steps_of(records[:reset_at]), steps_of(records[reset_at:])
    assert {r["size"] for r in before} == {2} and {r["size"] for r in after} == {1}
    assert {r["lr"] for r in after} == {0.01}, "lr rescaled to the new world size"
    last_commit = max(r["step"] for r in before if r["committed"])
    redone = before[-1]["step"] + 1 - last_commit  # the failed step included
    assert after[0]["step"] == last_commit + 1, "resumed right after the last commit"
    assert 1 <= redone <= COMMIT_EVERY
    assert [r["step"] for r in after] == list(range(last_commit + 1, target + 1))
    assert records[-1]["event"] == "done" and records[-1]["step"] == target
    assert all(r["size"] == 1 for r in records[reset_at:] if r.get("event") == "reset")


def test_sigterm_makes_a_worker_exit_143_at_once(tmp_path: Path) -> None:
    """A worker that exited 0 on SIGTERM would make horovodrun end the whole job."""
    proc = subprocess.Popen([sys.executable, str(TRAIN), "--steps", "100000"], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert (first["step"], first["size"]) == (1, 1), first
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
        assert '"event": "sigterm"' in proc.communicate()[1]
    finally:
        proc.kill()
        proc.wait()
