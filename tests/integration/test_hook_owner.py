"""Never two horovodruns' training on one worker (issue 39 item 3): training processes in fresh
interpreters with the hook, as horovodrun starts them on one worker, for supervisors of
different terms (the leader Lease's uid and leaseTransitions, ELASTIC_SUPERVISOR_HOOK_OWNER).

The process of a newer term kills those of older terms before the user's script runs; one of
an older term (the old horovodrun's respawn) exits 75 before it runs; processes of another job,
with another owner file (another worker on this machine) or without a term are never
touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from supervisor.hook import HOOK_DIR
from supervisor.hook.elastic_supervisor_hook import owner, wire

KEY = wire.new_key()
JOB = "3f1c2a9e-5b7d-4e21-9a0c-6d8e7f1b2c3d"  # a Lease's uid
# A training process as horovodrun starts it; its script reports, then trains "forever" with a
# child of its own (as a DataLoader's worker would be).
# (Once the child says it is up, its hook has claimed the worker too.)
SCRIPT = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); "
          "time.sleep(120)'], stdout=subprocess.PIPE)\n"
          "child.stdout.readline()\n"
          "print('training', child.pid, flush=True)\n"
          "time.sleep(120)\n")


def training(term: str | None, owner_file: Path, host: str = "127.0.0.5") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ELASTIC_SUPERVISOR_", "HOROVOD_"))}
    env.update({"PYTHONPATH": str(HOOK_DIR), "ELASTIC_SUPERVISOR_HOOK_KEY": KEY.hex(),
                "ELASTIC_SUPERVISOR_HOOK_PORT": "9", "HOROVOD_HOSTNAME": host,
                "HOROVOD_LOCAL_RANK": "0", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                owner.OWNER_FILE_ENV: str(owner_file)})
    if term is not None:
        env[owner.OWNER_ENV] = term if "." in term else f"{JOB}.{term}"
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def started(p: subprocess.Popen[str]) -> int:
    """The pid of the process's child, once it trains."""
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("training"), (line, p.poll())
    return int(line.split()[1])


def gone(pid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_newer_terms_process_kills_the_older_runs_and_an_older_ones_exits(
        tmp_path: Path) -> None:
    worker, elsewhere = tmp_path / "owner", tmp_path / "other-worker-owner"
    procs = []
    try:
        old = training("1", worker)
        procs.append(old)
        old_child = started(old)
        assert worker.read_text() == "1\n"
        bystanders = [training("1", elsewhere), training(None, worker),
                      training("other-job.1", worker)]
        procs += bystanders
        for b in bystanders:
            started(b)

        new = training("2", worker)
        procs.append(new)
        started(new)  # the old run was killed before the user's script ran
        assert old.wait(10) == -signal.SIGKILL
        assert gone(old_child), "the old run's child was killed with it"
        assert worker.read_text() == "2\n"
        assert new.stderr is not None
        claimed = json.loads(new.stderr.readline())
        assert claimed["event"] == "hook.claimed" and claimed["term"] == 2
        assert old.pid in claimed["killed"] and old_child in claimed["killed"]
        assert all(b.poll() is None for b in bystanders), "another worker's or job's, no term"

        respawn = training("1", worker)  # the old horovodrun starts its worker again
        _, err = respawn.communicate(timeout=30)
        assert respawn.returncode == owner.SUPERSEDED
        said = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert [(s["event"], s["term"], s["owner"]) for s in said] == [
            ("hook.superseded", 1, 2)], err
        assert new.poll() is None and worker.read_text() == "2\n"

        same = training("2", worker)  # a restart by the same leader: its own term
        procs.append(same)
        started(same)
        assert new.poll() is None, "a process of the same term is not killed"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_term_that_is_not_a_number_claims_nothing(tmp_path: Path) -> None:
    worker = tmp_path / "owner"
    p = training(f"{JOB}.two", worker)
    try:
        started(p)
        assert not worker.exists()
        assert p.stderr is not None
        assert f"ELASTIC_SUPERVISOR_HOOK_OWNER='{JOB}.two': expected <the job's Lease uid>." in (
            p.stderr.readline())
    finally:
        p.kill()
        p.wait()
