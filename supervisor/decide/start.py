"""PURE: when horovodrun starts, with what -np, and what code the run ends with.

`gate` is asked on each pass while no horovodrun runs: start it once the view is synced, the
host list is published and it has MIN_NP slots; give up after START_TIMEOUT_SECONDS; or wait.
`ended` turns horovodrun's exit (and what the supervisor knew when it came) into the job's.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.decide.plan import Note
from supervisor.model import EventSpec, ExitCode


@dataclass(frozen=True)
class Sizes:
    """The job's sizes in slots (SUPERVISOR_NP, MIN_NP, MAX_NP)."""

    np: int
    min_np: int
    max_np: int


@dataclass(frozen=True)
class Start:
    np: int  # horovodrun -np


@dataclass(frozen=True)
class GiveUp:
    code: int
    reason: str


@dataclass(frozen=True)
class Wait:
    pass


@dataclass(frozen=True)
class End:
    """How the run ends: the job's exit code, why, and horovodrun's own code (None: the
    same, or no horovodrun)."""

    code: int
    reason: str
    horovodrun: int | None = None
    note: Note | None = None  # the decision to say, where the end is one


def start_np(sizes: Sizes, usable_slots: int, *, restart: bool) -> int:
    """The -np of a start of horovodrun: NP for the job's first (its workers are being created:
    training starts at full size), the slots usable now within [MIN_NP, MAX_NP] for a restart
    (horovodrun waits for -np slots before it trains: NP would keep a restart idle until a
    replacement that may never come)."""
    if not restart:
        return sizes.np
    return max(sizes.min_np, min(usable_slots, sizes.max_np))


def gate(sizes: Sizes, *, synced: bool, published: bool, slots: int, restart: bool,
         waited_s: float, timeout_s: float) -> Start | GiveUp | Wait:
    """Whether to start horovodrun now (`slots`: usable in the host list; `restart`: this
    supervisor restarted horovodrun before; `waited_s`: since the gate opened)."""
    if synced and published and slots >= sizes.min_np:
        return Start(start_np(sizes, slots, restart=restart))
    if waited_s > timeout_s:
        return GiveUp(ExitCode.START_TIMEOUT, f"only {slots} of {sizes.min_np} slots usable after "
                      f"{timeout_s:g}s (synced={synced})")
    return Wait()


def job_exit_code(horovodrun: int, stop_signal: int | None) -> int:
    """The job's exit code once horovodrun ended with `horovodrun` (shell-style): its own,
    except a 0 after the supervisor forwarded it the stop signal `stop_signal`, which is
    128 + that signal. An elastic horovodrun can end 0 on a forwarded SIGTERM (seen after a
    restart of it on real nodes); stopped is not finished, and a 0 would make the Job Succeeded
    with its training cut short."""
    if horovodrun == 0 and stop_signal is not None:
        return 128 + stop_signal
    return horovodrun


def ended(exited: int, *, failing: tuple[int, str] | None, stop_signal: int | None,
          driver_problems: tuple[str, ...] = ()) -> End:
    """The job's end once horovodrun exited with `exited`: the run's own failure first (the
    supervisor ended it), then the hook's refusal to run the driver unhardened (what the driver
    hook said last: `driver_problems`), then horovodrun's code (stopped is not finished:
    job_exit_code)."""
    if failing is not None:
        return End(*failing)
    if exited == ExitCode.HOOK_REFUSED:
        why = ("the hook refused to run horovodrun's elastic driver unhardened: "
               + ("; ".join(driver_problems) or "see horovodrun's output"))
        return End(exited, why, note=Note("error", "hook.driver_refused",
                                           {"problems": list(driver_problems)},
                                           EventSpec("Warning", "DriverRefused", "Start", why)))
    code = job_exit_code(exited, stop_signal)
    if code != exited:
        return End(code, f"horovodrun exited with {exited} after signal {stop_signal} was "
                   "forwarded: stopped, not finished", horovodrun=exited)
    return End(exited, f"horovodrun exited with {exited}")


def not_started(*, failing: tuple[int, str] | None, stop_signal: int | None) -> End | None:
    """The run ends before horovodrun started: its own failure, or a stop signal."""
    if failing is not None:
        return End(*failing)
    if stop_signal is not None:
        return End(128 + stop_signal, f"stopped by signal {stop_signal} before start")
    return None
