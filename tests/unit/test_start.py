"""When horovodrun starts and how the run ends (supervisor/decide/start.py), as tables."""

from __future__ import annotations

import pytest

from supervisor.decide.start import (
    End,
    GiveUp,
    Sizes,
    Start,
    Wait,
    ended,
    gate,
    job_exit_code,
    not_started,
)
from supervisor.model import ExitCode

SIZES = Sizes(np=4, min_np=2, max_np=8)


@pytest.mark.parametrize(("kw", "step"), [
    pytest.param(dict(synced=True, published=True, slots=4), Start(4), id="NP usable: start"),
    pytest.param(dict(synced=True, published=True, slots=2), Start(4),
                 id="MIN_NP usable, first start: -np NP (its workers are being created)"),
    pytest.param(dict(synced=True, published=True, slots=3, restart=True), Start(3),
                 id="a restart: -np the usable slots"),
    pytest.param(dict(synced=True, published=True, slots=1), Wait(), id="below MIN_NP: wait"),
    pytest.param(dict(synced=True, published=False, slots=4), Wait(),
                 id="the file withdrawn: horovodrun would read no host"),
    pytest.param(dict(synced=False, published=True, slots=4), Wait(), id="not synced: wait"),
    pytest.param(dict(synced=True, published=True, slots=1, waited_s=601.0),
                 GiveUp(ExitCode.START_TIMEOUT,
                        "only 1 of 2 slots usable after 600s (synced=True)"),
                 id="START_TIMEOUT_SECONDS over: give up, exit 3"),
    pytest.param(dict(synced=True, published=True, slots=4, waited_s=900.0), Start(4),
                 id="late but enough: start"),
])
def test_the_start_gate(kw: dict[str, object], step: object) -> None:
    args: dict[str, object] = {"restart": False, "waited_s": 1.0, "timeout_s": 600.0, **kw}
    assert gate(SIZES, **args) == step  # type: ignore[arg-type]


@pytest.mark.parametrize(("horovodrun", "stop_signal", "code"), [
    pytest.param(0, None, 0, id="finished"),
    pytest.param(1, None, 1, id="failed"),
    pytest.param(0, 15, 143, id="0 after a forwarded SIGTERM: stopped, not finished"),
    pytest.param(0, 2, 130, id="0 after a forwarded SIGINT"),
    pytest.param(143, 15, 143, id="ended by the forwarded SIGTERM"),
    pytest.param(1, 15, 1, id="failed while stopping: its own code"),
])
def test_the_job_exit_code_never_says_finished_after_a_stop(
        horovodrun: int, stop_signal: int | None, code: int) -> None:
    assert job_exit_code(horovodrun, stop_signal) == code


@pytest.mark.parametrize(("exited", "kw", "end"), [
    pytest.param(0, {}, End(0, "horovodrun exited with 0"), id="finished"),
    pytest.param(1, {"failing": (6, "restart budget spent")}, End(6, "restart budget spent"),
                 id="the supervisor ended the run: its code and reason"),
    pytest.param(0, {"stop_signal": 15},
                 End(143, "horovodrun exited with 0 after signal 15 was forwarded: stopped, "
                     "not finished", horovodrun=0), id="stopped"),
])
def test_how_a_run_ends(exited: int, kw: dict[str, object], end: End) -> None:
    args: dict[str, object] = {"failing": None, "stop_signal": None, **kw}
    assert ended(exited, **args) == end  # type: ignore[arg-type]


def test_the_hooks_refusal_names_the_driver_hooks_problems_and_is_said() -> None:
    end = ended(ExitCode.HOOK_REFUSED, failing=None, stop_signal=None,
                driver_problems=("Horovod 0.27.0 is not 0.28.x",))
    assert (end.code, end.reason) == (ExitCode.HOOK_REFUSED, (
        "the hook refused to run horovodrun's elastic driver unhardened: "
        "Horovod 0.27.0 is not 0.28.x"))
    assert end.note is not None and end.note.k8s is not None
    assert (end.note.event, end.note.k8s.reason) == ("hook.driver_refused", "DriverRefused")
    bare = ended(ExitCode.HOOK_REFUSED, failing=None, stop_signal=None)
    assert bare.reason.endswith("unhardened: see horovodrun's output")


def test_before_a_start_only_the_runs_failure_or_a_stop_ends_it() -> None:
    assert not_started(failing=None, stop_signal=None) is None
    assert not_started(failing=(3, "x"), stop_signal=15) == End(3, "x")
    assert not_started(failing=None, stop_signal=15) == End(
        143, "stopped by signal 15 before start")
