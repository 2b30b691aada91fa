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

Warm restarts: a supervisor started again spends most of its start importing its modules (the
Kubernetes client among them: 1.7 to 3 s on a busy two-core node, the soak's seed 12, where a
host list went unchanged that long after a worker and the supervisor were killed together).
When CMD is `elastic-supervisor ...`, the keeper imports those modules itself once the first
supervisor has run WARM_AFTER_S (not before: the first start comes first), and starts each
later one as a fork of itself that runs the command line's `main` at once. A forked supervisor
has the keeper's command line (`ps` shows two `python -m supervisor.keeper -- ...`: the parent
is the keeper); nothing else tells them apart.

PURE: `decide`, what to do when CMD ended. ADAPTER: `keep`, the process: it starts CMD, forwards
SIGTERM, SIGINT and SIGHUP to it, reaps every orphan that ends up with it (none in the sidecar,
whose pod shares one process namespace under the pause process; all of CMD's where the keeper is
a container's PID 1), and carries out `decide`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from supervisor.config import LogFormat, LogLevel
from supervisor.logs import make_logger
from supervisor.proc import exit_code

# CMD ended by a signal nobody forwarded (SIGKILL, an OOM kill, a crash) is started again,
# after AFTER_S[n] for its n-th restart within WINDOW_S; past the last, the keeper ends with
# CMD's status and the kubelet takes over (with its own backoff).
AFTER_S = (0.0, 0.5, 1.0, 2.0, 5.0)
WINDOW_S = 300.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WARM_AFTER_S = 5.0  # the first supervisor's own start comes first
POLL_S = 0.05  # how often the keeper looks whether CMD ended, until it is warm

Entry = Callable[[list[str]], int]  # a command line's main: its args (no program) -> exit code


class Child(Protocol):
    """CMD as the keeper runs it: a subprocess.Popen, or a fork of the keeper (`Forked`)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...


class Forked:
    """A fork of the keeper that runs an imported main (see the module's doc)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)


def fork(entry: Entry, args: Sequence[str]) -> Forked:
    """Start `entry(args)` in a fork of this process (single-threaded: the keeper starts no
    thread); the child ends with its exit code, as an exec'd CMD would."""
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 70  # an exception of ours: the supervisor's INTERNAL
    try:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        code = entry(list(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # said, and the child ends like a crashed CMD
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(int(code))


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
         clock: Callable[[], float] = time.monotonic,
         warm: Callable[[], Entry] | None = None) -> int:
    """ADAPTER: run `cmd` until `decide` says to end; return the exit code. `warm`: imports
    CMD's modules into the keeper and returns its main (called once, WARM_AFTER_S after the
    first start): each later CMD is then a fork that runs it (`fork`)."""
    stopping: list[int] = []
    child: list[Child] = []
    entry: list[Entry] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child and child[-1].poll() is None:
            child[-1].send_signal(signum)

    def warmed() -> None:
        if warm is not None and not entry:
            t0 = clock()
            entry.append(warm())
            log("keeper.warm", imported_s=round(clock() - t0, 2))

    for sig in FORWARDED:
        signal.signal(sig, forward)
    restarts: list[float] = []
    while True:
        proc: Child = fork(entry[0], cmd[1:]) if entry else subprocess.Popen(list(cmd))
        child.append(proc)
        if stopping:  # a stop signal came while it started
            proc.send_signal(stopping[0])
        returncode = _wait_reaping(proc, clock=clock, then=None if entry or warm is None
                                   else (clock() + WARM_AFTER_S, warmed))
        now = clock()
        step = decide(returncode, stopping=bool(stopping), restarts=restarts, now=now)
        if isinstance(step, Exit):
            log("keeper.exit", exit_code=step.code, why=step.why, pid=proc.pid)
            return step.code
        log("keeper.restarting", pid=proc.pid, signal=-returncode,
            restarts=len(restarts) + 1, after_s=step.after_s, warm=bool(entry))
        restarts.append(now)
        time.sleep(step.after_s)
        if stopping:
            log("keeper.exit", exit_code=exit_code(returncode), why="stopped", pid=proc.pid)
            return exit_code(returncode)


def _wait_reaping(proc: Child, *, clock: Callable[[], float] = time.monotonic,
                  then: tuple[float, Callable[[], None]] | None = None) -> int:
    """Wait for `proc`, reaping any other child that ends meanwhile (orphans of CMD are the
    keeper's where it is a container's PID 1); return proc's returncode. `then`: (when, what)
    to do once while waiting (the warm-up): the keeper looks every POLL_S until then."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if then is not None else 0)
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere (Popen's own poll)
            return proc.wait()
        if pid == 0 and then is not None:  # nothing ended yet
            if clock() >= then[0]:
                then[1]()
                then = None
            else:
                time.sleep(POLL_S)
            continue
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode


def supervisor_main() -> Entry:
    """The command line's main with the supervisor proper imported (what `run` imports)."""
    from supervisor import cli  # noqa: PLC0415 (the keeper itself starts without it)
    importlib.import_module("supervisor.runner")  # what cli.main imports for `run`
    return cli.main


def main(cmd: Sequence[str]) -> int:
    if not cmd:
        print("supervisor.keeper: no command: expected `python -m supervisor.keeper -- CMD...`, "
              "e.g. `python -m supervisor.keeper -- elastic-supervisor run`", file=sys.stderr)
        return 2
    log = make_logger(LogFormat.JSON, LogLevel.INFO, component="keeper")
    ours = Path(cmd[0]).name == "elastic-supervisor"
    return keep(cmd, log=log.info, warm=supervisor_main if ours else None)


if __name__ == "__main__":  # python -m supervisor.keeper -- CMD...: what the sidecar runs
    sys.exit(main(sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]))
