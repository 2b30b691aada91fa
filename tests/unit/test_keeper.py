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
