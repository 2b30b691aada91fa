"""worker_image/train.py under real horovodrun (elastic, Gloo), without Kubernetes.

The workers are fake hosts of this machine (localcluster.sshd: an OpenSSH sshd each on its own
loopback address, reached by horovodrun over ssh with a key): what is tested here is the training
script and Horovod, quickly; the same script in the real images on real nodes under the
supervisor is tests/e2e/test_main_job.py. The discovery script `cat`s a file the test writes.
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

import psutil
import pytest

from localcluster.job import horovod_records
from localcluster.sshd import FakeHost, KeyPair
from tests.e2e.jobs import COMMIT_EVERY, steps_of
from tests.helpers import wait_for

BIN = Path(sys.executable).parent
TRAIN = Path(__file__).resolve().parents[2] / "worker_image" / "train.py"
SSH_PORT = 2222


def tree(host: FakeHost) -> list[psutil.Process]:
    """The fake host's sshd and everything below it (its sessions call setsid)."""
    assert host.proc is not None
    root = psutil.Process(host.proc.pid)
    return [root, *root.children(recursive=True)]


def command_line(p: psutil.Process) -> str:
    """`p`'s command line; empty once it exited (a zombie has none: sessions come and go)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


class Training:
    """One horovodrun run of train.py; rank 0's JSON lines are collected as they come."""

    def __init__(self, workdir: Path, key: KeyPair, steps: int) -> None:
        self.workdir = workdir
        self.hostfile = workdir / "hostfile"
        script = workdir / "discover_hosts.sh"
        script.write_text(f"#!/bin/sh\nexec cat {self.hostfile}\n")
        script.chmod(0o755)
        self.argv = [
            str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
            "--slots-per-host", "1", "--host-discovery-script", str(script),
            "--ssh-port", str(SSH_PORT), "--ssh-identity-file", str(key.private),
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
def key(tmp_path: Path) -> KeyPair:
    return KeyPair.generate(tmp_path / "keys")


@pytest.fixture
def workers(key: KeyPair, tmp_path: Path) -> Iterator[dict[str, FakeHost]]:
    """Two fake hosts, sshd on 127.0.0.2 and 127.0.0.3: address -> host."""
    hosts = {a: FakeHost(a, SSH_PORT, key, tmp_path / a).start()
             for a in ("127.0.0.2", "127.0.0.3")}
    yield hosts
    for h in hosts.values():
        h.stop()


@pytest.fixture
def training(tmp_path: Path, key: KeyPair) -> Iterator[Any]:
    made: list[Training] = []

    def make(steps: int) -> Training:
        made.append(Training(tmp_path, key, steps))
        return made[-1]

    yield make
    for t in made:
        t.close()


def test_trains_to_the_target_on_two_hosts(
        workers: dict[str, FakeHost], training: Any) -> None:
    run = training(steps=30)
    run.set_hosts(list(workers))
    run.start()

    def trains_in(host: FakeHost) -> bool:
        return any("train.py" in command_line(p) for p in tree(host))

    wait_for(lambda: all(trains_in(h) for h in workers.values()), 60,
             what="a train.py process below each fake host's sshd")
    assert run.wait(90) == 0, run.tail()

    steps = steps_of(run.records())
    assert [r["step"] for r in steps] == list(range(1, 31)), run.tail()
    assert {r["size"] for r in steps} == {2}
    assert {r["lr"] for r in steps} == {0.02}, "base lr x world size"
    assert {r["host"] for r in steps} <= set(workers)
    assert [r["step"] for r in steps if r["committed"]] == [5, 10, 15, 20, 25, 30]
    assert [r for r in run.records() if r.get("event") == "reset"] == []
    assert run.records()[-1] | {"time": 0} == {"event": "done", "step": 30, "size": 2, "time": 0}


def test_a_killed_worker_host_is_dropped_and_training_continues_without_losing_commits(
        workers: dict[str, FakeHost], training: Any) -> None:
    target = 120
    run = training(steps=target)
    run.set_hosts(list(workers))
    run.start()
    wait_for(lambda: run.last_step() >= 12, 60, what="training past step 12")

    # Kill the host that does NOT run rank 0, so that rank 0's output stays complete.
    rank0 = steps_of(run.records())[-1]["host"]
    victim = next(h for a, h in workers.items() if a != rank0)
    for proc in tree(victim):  # the whole "pod": sshd, sessions, the training process
        proc.kill()
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
