"""`python -m supervisor.keeper -- CMD...`: the sidecar container's first process, which keeps
CMD (the supervisor, `elastic-supervisor run`) running in the container. A module of its own,
not a subcommand: it starts CMD 0.2 s after its own start, where the command line's imports
(the Kubernetes client) took 0.85 s, and a supervisor that must name bad input before the
kubelet stops the pod has no time to lose.

Why: a native sidecar's container is restarted by the kubelet, with its CrashLoopBackOff: at
once the first time, then after 10 s, 20 s, ... until it has run 10 minutes. A supervisor
SIGKILLed twice within 10 minutes was back only after the kubelet's 10 s (the soak, seed 2:
its one violation, a host list that still named a killed worker meanwhile). The keeper starts
it again at once instead; the restarted supervisor adopts the run (sidecar mode: it takes over
the Lease of a holder of this pod that is gone, and finds horovodrun through es-run).

PURE: `decide`, what to do when CMD ended. ADAPTER: `keep`, the process: it starts CMD, forwards
SIGTERM, SIGINT and SIGHUP to it, reaps every orphan that ends up with it (none in the sidecar,
whose pod shares one process namespace under the pause process; all of CMD's where the keeper is
a container's PID 1), and carries out `decide`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from supervisor.config import LogFormat, LogLevel
from supervisor.logs import make_logger
from supervisor.proc import exit_code

# CMD ended by a signal nobody forwarded (SIGKILL, an OOM kill, a crash) is started again,
# after AFTER_S[n] for its n-th restart within WINDOW_S; past the last, the keeper ends with
# CMD's status and the kubelet takes over (with its own backoff).
AFTER_S = (0.0, 0.5, 1.0, 2.0, 5.0)
WINDOW_S = 300.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Restart:
    after_s: float


@dataclass(frozen=True)
class Exit:
    code: int
    why: str


def decide(returncode: int, *, stopping: bool, restarts: Sequence[float],
           now: float) -> Restart | Exit:
    """PURE: what to do once CMD ended with Popen's `returncode` (negative: killed by that
    signal). `stopping`: the keeper forwarded a stop signal to it; `restarts`: when (monotonic)
    it was restarted before."""
    code = exit_code(returncode)
    if returncode >= 0:
        return Exit(code, "its own exit code")  # the supervisor's answer, whatever it is
    if stopping:
        return Exit(code, "stopped")
    recent = [t for t in restarts if now - t < WINDOW_S]
    if len(recent) >= len(AFTER_S):
        return Exit(code, f"killed {len(recent) + 1} times within {WINDOW_S:g}s")
    return Restart(AFTER_S[len(recent)])


def keep(cmd: Sequence[str], *, log: Callable[..., None],
         clock: Callable[[], float] = time.monotonic) -> int:
    """ADAPTER: run `cmd` until `decide` says to end; return the exit code."""
    stopping: list[int] = []
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child and child[-1].poll() is None:
            child[-1].send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    restarts: list[float] = []
    while True:
        proc = subprocess.Popen(list(cmd))
        child.append(proc)
        if stopping:  # a stop signal came while it started
            proc.send_signal(stopping[0])
        returncode = _wait_reaping(proc)
        now = clock()
        step = decide(returncode, stopping=bool(stopping), restarts=restarts, now=now)
        if isinstance(step, Exit):
            log("keeper.exit", exit_code=step.code, why=step.why, pid=proc.pid)
            return step.code
        log("keeper.restarting", pid=proc.pid, signal=-returncode,
            restarts=len(restarts) + 1, after_s=step.after_s)
        restarts.append(now)
        time.sleep(step.after_s)
        if stopping:
            log("keeper.exit", exit_code=exit_code(returncode), why="stopped", pid=proc.pid)
            return exit_code(returncode)


def _wait_reaping(proc: subprocess.Popen[bytes]) -> int:
    """Wait for `proc`, reaping any other child that ends meanwhile (orphans of CMD are the
    keeper's where it is a container's PID 1); return proc's returncode."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere (Popen's own poll)
            return proc.wait()
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode


def main(cmd: Sequence[str]) -> int:
    if not cmd:
        print("supervisor.keeper: no command: expected `python -m supervisor.keeper -- CMD...`, "
              "e.g. `python -m supervisor.keeper -- elastic-supervisor run`", file=sys.stderr)
        return 2
    log = make_logger(LogFormat.JSON, LogLevel.INFO, component="keeper")
    return keep(cmd, log=log.info)


if __name__ == "__main__":  # python -m supervisor.keeper -- CMD...: what the sidecar runs
    sys.exit(main(sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]))
