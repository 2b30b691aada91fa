"""`python -m supervisor.keeper` (supervisor/keeper.py): the sidecar's supervisor is started again
at once when a signal kills it, not after the kubelet's CrashLoopBackOff; its own exit codes
and a stop signal end the keeping. The decision as a table, then the real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.job import supervisor_processes
from supervisor.keeper import AFTER_S, WINDOW_S, Exit, Restart, decide
from tests.helpers import wait_for

CASES = {
    "an exit code is the supervisor's answer": (3, False, [], Exit(3, "its own exit code")),
    "so is 0": (0, False, [], Exit(0, "its own exit code")),
    "SIGKILL: again at once": (-9, False, [], Restart(0.0)),
    "the second kill within the window: after a pause": (-9, False, [10.0], Restart(AFTER_S[1])),
    "kills long ago do not count": (-9, False, [-WINDOW_S, 0.0], Restart(AFTER_S[1])),
    "a forwarded stop ends it": (-15, True, [], Exit(143, "stopped")),
    "too many kills: the kubelet takes over": (
        -9, False, [float(i) for i in range(len(AFTER_S))],
        Exit(137, f"killed {len(AFTER_S) + 1} times within {WINDOW_S:g}s")),
}


@pytest.mark.parametrize("name", CASES)
def test_decide(name: str) -> None:
    returncode, stopping, restarts, want = CASES[name]
    assert decide(returncode, stopping=stopping, restarts=restarts, now=60.0) == want


CHILD = """
import os, signal, sys, time
open(sys.argv[1], "a").write(str(os.getpid()) + "\\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(sys.argv[2])))
time.sleep(60)
"""


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_a_killed_child_is_back_at_once_and_a_stop_is_forwarded(tmp_path: Path) -> None:
    started = tmp_path / "pids"
    keeper = subprocess.Popen(
        [sys.executable, "-m", "supervisor.keeper", "--", sys.executable, "-c", CHILD,
         str(started), "7"], stderr=subprocess.PIPE, text=True)
    try:
        [first] = wait_for(lambda: pids(started), 10, what="the first child")
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: pids(started)[1:], 5, what="the child started again")[0]
        assert second != first
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) == 7, "the child's own exit code, passed through"
    finally:
        keeper.kill()
        err = keeper.communicate()[1]
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [(e["event"], e.get("signal"), e.get("exit_code")) for e in events] == [
        ("keeper.restarting", 9, None), ("keeper.exit", None, 7)], err
    assert events[0]["after_s"] == 0, "the first restart at once (its decision, not a timing)"
    assert len(pids(started)) == 2


def test_an_exit_code_ends_the_keeping_and_no_command_is_bad_input(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "supervisor.keeper", "--", sys.executable,
                           "-c", "raise SystemExit(3)"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 3 and "keeper.restarting" not in done.stderr
    bad = subprocess.run([sys.executable, "-m", "supervisor.keeper"], capture_output=True,
                         text=True, timeout=30, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "supervisor.keeper: no command: expected `python -m supervisor.keeper -- CMD...`, e.g. "
        "`python -m supervisor.keeper -- elastic-supervisor run`")



WARM = """
import json, os, signal, sys, time
from supervisor import keeper
keeper.WARM_AFTER_S = 0.3
started = sys.argv[1]
def entry(args):
    open(started, "a").write(f"{os.getpid()} fork {os.getppid()} {' '.join(args[2:])}\\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    time.sleep(60)
    return 0
def warm():
    open(started + ".warm", "w").close()
    return entry
def log(event, **kw):
    print(json.dumps({"event": event, **kw}), file=sys.stderr, flush=True)
child = ("import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()} exec\\\\n'); "
         "time.sleep(60)")
sys.exit(keeper.keep([sys.executable, "-c", child, started], log=log, warm=warm))
"""


def test_once_warm_the_keeper_starts_the_supervisor_again_as_a_fork_of_itself(
        tmp_path: Path) -> None:
    """The first supervisor is exec'd; once it ran WARM_AFTER_S (0.3 s here), the keeper has
    its main imported, and the next one is a fork of the keeper running it with CMD's args."""
    started = tmp_path / "started"
    keeper = subprocess.Popen([sys.executable, "-c", WARM, str(started)],
                              stderr=subprocess.PIPE, text=True)

    def lines() -> list[list[str]]:
        return [x.split(" ", 3) for x in started.read_text().splitlines()] \
            if started.exists() else []

    try:
        [first] = wait_for(lines, 10, what="the first supervisor")
        assert first[1:] == ["exec"]
        wait_for(lambda: Path(f"{started}.warm").exists(), 10, what="the keeper warm")
        os.kill(int(first[0]), signal.SIGKILL)
        second = wait_for(lambda: lines()[1:], 5, what="the supervisor started again")[0]
        assert second[1:] == ["fork", str(keeper.pid), str(started)], "CMD's args, its child"
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) == 7, "the forked supervisor's own exit code, passed through"
    finally:
        keeper.kill()
        err = keeper.communicate()[1]
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [(e["event"], e.get("warm")) for e in events] == [
        ("keeper.warm", None), ("keeper.restarting", True), ("keeper.exit", None)], err


def test_the_supervisor_is_found_exec_d_or_forked_by_its_keeper_never_the_keeper() -> None:
    """localcluster.job.supervisor_processes, on the command lines of a launcher pod's
    processes (the tests kill the supervisor they find)."""
    keeper = ["python", "-m", "supervisor.keeper", "--", "elastic-supervisor", "run"]
    exec_d = ["/opt/venv/bin/python3", "/opt/venv/bin/elastic-supervisor", "run"]
    es_run = ["/bin/sh", "/opt/elastic-supervisor/bin/es-run", "python", "train.py"]
    horovodrun = ["/opt/venv/bin/python3", "/opt/venv/bin/horovodrun", "-np", "2"]
    pause, shim = 1, 2
    # Sidecar mode, the first supervisor (exec'd by the keeper), then a warm restart's fork.
    assert supervisor_processes({10: (keeper, shim), 11: (exec_d, 10), 20: (es_run, pause),
                                 21: (horovodrun, 20)}) == [11]
    assert supervisor_processes({10: (keeper, shim), 12: (keeper, 10),
                                 20: (es_run, pause)}) == [12]
    assert supervisor_processes({10: (keeper, shim)}) == [], "the keeper alone: none"
    # The launcher container's own supervisor (no keeper), horovodrun its child.
    launcher = [*exec_d, "--", "python", "train.py"]
    assert supervisor_processes({7: (launcher, shim), 8: (horovodrun, 7)}) == [7]
