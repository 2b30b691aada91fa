"""ADAPTER: the run of horovodrun the supervisor drives: started or adopted, stop signals
forwarded with a grace, its whole process tree killed, restarted, ended.

It holds the handle (`child`), the stop signal forwarded, when the grace ends and when the run
started; the loop (loop.py) decides when (decide/start.py, core.manage) and calls it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from supervisor.channel import HookChannel
from supervisor.config import Config
from supervisor.decide import hang
from supervisor.decide.script import RestartHorovodrun
from supervisor.launch import horovodrun_env
from supervisor.metrics import Metrics
from supervisor.model import ChildExited, EventSpec
from supervisor.reports import Reports


class ChildProcess(Protocol):
    """What the loop needs from the supervised child (supervisor.proc.Child)."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def signal_group(self, sig: int) -> None: ...
    def kill_tree(self, rounds: int = 3) -> int: ...
    def reap(self) -> list[int]: ...


@dataclass
class Outcome:
    """How the run ended: the exit code and a one-line reason."""

    code: int
    reason: str


class Horovodrun:
    """One supervisor process's horovodrun: none, or one run at a time."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, reports: Reports, channel: HookChannel | None,
                 start_child: Callable[[Sequence[str], Mapping[str, str]], ChildProcess],
                 base_env: Mapping[str, str], submit: Callable[[ChildExited], None],
                 clock: Callable[[], float]) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.reports, self.channel, self.start_child = reports, channel, start_child
        self.base_env, self.submit, self.clock = base_env, submit, clock
        self.child: ChildProcess | None = None
        self.stop_signal: int | None = None  # the stop signal forwarded (or before any start)
        self.kill_at: float | None = None  # the grace after it ends: the tree is killed
        self.started_at: float | None = None  # monotonic: this run (None: none runs)

    def started_or(self, now: float) -> float:
        return self.started_at if self.started_at is not None else now

    def start(self, argv: Sequence[str], slots: int, np: int) -> None:
        cfg = self.cfg
        hook = (self.channel.new_run(self.base_env.get("PYTHONPATH"))
                if self.channel is not None else None)
        child = self.start_child(argv, horovodrun_env(cfg, self.base_env, hook))
        self.log.info("horovodrun.started", pid=child.pid, slots=slots, np=np, argv=list(argv))
        self.events(EventSpec("Normal", "HorovodrunStarted", "Start",
                              f"horovodrun started with {slots} usable slots "
                              f"(np {np}, min {cfg.min_np}, max {cfg.max_np})"))
        self.running(child, adopted=False)

    def running(self, child: ChildProcess, *, adopted: bool) -> None:
        """Supervise `child` from now on: started by `start`, or `adopted`."""
        if adopted and (code := child.poll()) is not None:
            self.log.info("horovodrun.exit_adopted", pid=child.pid, code=code)
            self.events(EventSpec("Normal", "HorovodrunExitAdopted", "Start",
                                  f"horovodrun (pid {child.pid}) started for an earlier "
                                  f"supervisor of this pod exited with {code} before that "
                                  "supervisor ended the job: its exit is the job's, training "
                                  "is not started again"))
        elif adopted:
            self.log.info("horovodrun.adopted", pid=child.pid)
            self.events(EventSpec("Normal", "HorovodrunAdopted", "Start",
                                  f"horovodrun (pid {child.pid}) started for an earlier "
                                  "supervisor of this pod still runs: supervised as it is, "
                                  "not restarted"))
        self.child = child
        self.started_at = self.clock()
        self.reports.new_run()
        if self.channel is None or not self.cfg.worker_hook:
            why = ("SUPERVISOR_WORKER_HOOK=false" if self.channel is not None
                   else "the hook is not installed")
            self.log.warning("hang_detection.off", reason=why)
            self.events(EventSpec("Warning", "HangDetectionOff", "Start",
                                  f"{why}: the training processes are left alone, so no fence "
                                  "(survivors of a frozen or partitioned worker wait for the "
                                  "Gloo timeout) and no hang detection"))
        self.metrics.horovodrun_up.set(1)
        threading.Thread(target=self._wait_child, args=(child,), name="child-waiter",
                         daemon=True).start()

    def _wait_child(self, child: ChildProcess) -> None:
        self.submit(ChildExited(child.wait(), child.pid))

    def restart(self, r: RestartHorovodrun, now: float) -> bool:
        """Training cannot go on in this run (core.manage decided): the processes told to
        exit, the whole tree killed; whether there was a run to end."""
        cfg, child = self.cfg, self.child
        if child is None:
            return False
        assert self.channel is not None
        trained_s, collectives = hang.run_progress(self.channel.snapshot().beats.values(),
                                                   self.started_or(now), now)
        self.log.error("horovodrun.restarting", reason=r.reason, why=r.why, restart=r.restart,
                       limit=cfg.horovodrun_restart_limit, lost_s=round(trained_s, 1),
                       lost_collectives=collectives)
        self.events(EventSpec("Warning", r.reason, "Restart",
                              f"{r.why}: restarting horovodrun ({r.restart} of "
                              f"{cfg.horovodrun_restart_limit}). This run trained "
                              f"{trained_s:.0f}s (up to {collectives} collectives in one "
                              "process): a script that keeps no checkpoint starts over and "
                              "loses them; one that does resumes from it"))
        self.metrics.restart_lost_training.inc(trained_s)
        self.channel.exit_run(f"{r.reason}: horovodrun is restarted")
        killed = child.kill_tree()
        self.log.info("horovodrun.killed", reason=r.reason, processes=killed)
        self.child, self.started_at = None, None
        self.reports.new_run()
        self.metrics.horovodrun_up.set(0)
        return True

    def stop(self, now: float) -> None:
        """The run ends: SIGTERM to horovodrun, its tree killed after the grace (once)."""
        if self.child is not None and self.stop_signal is None:
            self.stop_signal = signal.SIGTERM
            self.kill_at = now + self.cfg.shutdown_grace_s
            self.child.signal_group(signal.SIGTERM)

    def on_signal(self, signum: int, now: float) -> None:
        """A stop signal for the supervisor: forwarded with the grace; a second kills."""
        name = signal.Signals(signum).name
        if self.child is None:
            self.stop_signal = signum
            self.log.info("signal.received", signal=name, child=None)
            return
        if self.stop_signal is not None:
            self.log.warning("signal.repeated", signal=name)
            self.kill_tree(f"second {name}")
            return
        self.stop_signal = signum
        self.kill_at = now + self.cfg.shutdown_grace_s
        self.child.signal_group(signum)
        self.log.info("signal.forwarded", signal=name, pid=self.child.pid,
                      grace_s=self.cfg.shutdown_grace_s)
        self.events(EventSpec("Normal", "Stopping", "Stop",
                              f"{name} forwarded to horovodrun; killing its process tree after "
                              f"{self.cfg.shutdown_grace_s:g}s"))

    def kill_tree(self, why: str) -> None:
        if self.child is None:
            return
        n = self.child.kill_tree()
        self.kill_at = None
        self.log.warning("shutdown.killed_tree", reason=why, processes=n)

    def tick(self, now: float) -> None:
        """The grace of a forwarded stop is over: the tree is killed."""
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_tree("shutdown grace expired")

    def finish(self, code: int, reason: str, *, horovodrun: int | None = None) -> Outcome:
        """End the run with the job's exit `code`; `horovodrun`: horovodrun's own exit code
        where it differs from the job's (logged and posted as what horovodrun did)."""
        if self.child is not None:
            own = code if horovodrun is None else horovodrun
            leftovers = self.child.kill_tree()
            self.metrics.horovodrun_up.set(0)
            level = self.log.info if own == 0 else self.log.warning
            level("horovodrun.exited", code=own, leftovers_killed=leftovers)
            self.events(EventSpec("Normal" if own == 0 else "Warning", "HorovodrunExited",
                                  "Exit", f"horovodrun exited with {own}"))
        return Outcome(int(code), reason)
