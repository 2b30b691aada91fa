"""The accounting after each pass (supervisor/decide/accounting.py): the progress from rank 0's
heartbeats, the incidents from the pass's script and the captured pod shapes, and when the state
is due to be saved for them."""

from __future__ import annotations

from dataclasses import replace

from supervisor.decide import accounting, progress, script
from supervisor.decide.beats import Beat
from supervisor.decide.hostlist import HostMode
from supervisor.decide.incidents import Book
from tests.unit.test_incidents import JOB, create, failed, pod

T0 = 1.8e9
MONO = 1000.0  # the monotonic clock at T0


def rank0(step: int, at: float, size: int = 2) -> Beat:
    return Beat(sender="r0", host="10.1.0.10", pid=1, local_rank=0, first_seen=MONO,
                last_seen=at, progress_at=at, rank=0, size=size, inits=1, steps=step)


def run(passes: list[tuple[float, int, tuple[object, ...]]], pods: dict[str, object],
        ) -> list[accounting.Accounted]:
    """Passes at (seconds after T0, rank 0's step, the script); each result in turn."""
    out: list[accounting.Accounted] = []
    p, book, saved = progress.Progress(), Book(), 0.0
    for dt, step, todo in passes:
        a = accounting.account(p, book, todo, [rank0(step, MONO + dt)], pods,  # type: ignore[arg-type]
                               desired=2, mode=HostMode.POD_IP, job=JOB, now=MONO + dt,
                               wall=T0 + dt, saved_at=saved)
        p, book, saved = a.progress, a.book, a.saved_at
        out.append(a)
    return out


def test_a_quiet_job_saves_its_progress_every_ten_seconds_and_no_more() -> None:
    pods = {f"{JOB}-w{i}-1": pod(i, 1, "running", f"10.1.0.{10 + i}") for i in range(2)}
    got = run([(float(t), 10 * t, ()) for t in range(0, 25)], pods)
    assert got[-1].progress.step == 240
    saves = [t for t, a in enumerate(got) if a.save]
    # the first pass only sees where rank 0 stands; its step grows from the second
    assert saves == [1, 11, 21], "the first pass with progress, then every SAVE_EVERY_S"
    assert [got[t].saved_at for t in saves] == [T0 + 1, T0 + 11, T0 + 21]
    assert got[5].saved_at == T0 + 1, "kept between two saves"


def test_an_incident_is_saved_as_it_moves_on_and_closed_once() -> None:
    pods = {f"{JOB}-w{i}-1": pod(i, 1, "running", f"10.1.0.{10 + i}") for i in range(2)}
    first = run([(0.0, 100, ()), (1.0, 101, (failed(f"{JOB}-w1-1"),
                                             script.Fence(frozenset({"10.1.0.11"})),
                                             create(1, 2)))], pods)
    opened = first[-1]
    assert [(i.cause, ph) for i, ph in opened.reached][:1] == [("ExitCode", "detected")]
    assert opened.save and opened.saved_at == T0 + 1, "saved at once: an incident moved on"
    assert opened.closed == () and opened.book.incidents[0].open
    # the survivor trains alone, the replacement is scheduled, starts, joins: full size
    p, book, saved = opened.progress, opened.book, opened.saved_at
    closed = []
    for dt, stage, size, ranks in [(2.0, "scheduled", 1, 1), (3.0, "running", 1, 1),
                                   (5.0, "running", 2, 2), (6.0, "running", 2, 2),
                                   (7.0, "running", 2, 2)]:
        pods[f"{JOB}-w1-2"] = pod(1, 2, stage, "10.1.0.21")
        beats = [replace(rank0(int(100 + dt), MONO + dt, size), inits=1 + (size == 2))]
        if ranks == 2:
            beats.append(Beat(sender="r1", host="10.1.0.21", pid=2, local_rank=0,
                              first_seen=MONO + 5, last_seen=MONO + dt, progress_at=MONO + dt,
                              rank=1, size=2, inits=1, steps=int(100 + dt)))
        a = accounting.account(p, book, (), beats, pods, desired=2, mode=HostMode.POD_IP,
                               job=JOB, now=MONO + dt, wall=T0 + dt, saved_at=saved)
        p, book, saved = a.progress, a.book, a.saved_at
        closed += [(dt, i.id) for i in a.closed]
        if a.reached:
            assert a.save and a.saved_at == T0 + dt, "an incident moved on: saved now"
    assert closed == [(5.0, 1)], "closed once, in the pass that reached full size"
    assert not book.incidents[0].open
