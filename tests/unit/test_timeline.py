"""supervisor.timeline: the drawing plan from a synthetic stored state (gaps, a world change,
three incidents close together, an open one), and the PNG `render` writes, read back from its
text chunks (what the figure shows, not what the plan says)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor import cli, timeline, timeline_png
from supervisor.timeline import OPEN, Incident, NoProgress, Plan, Settings, TimelineError

T0 = 1_795_000_000.0
RATE = 2.0  # steps/s while there is a world
# (seconds since T0, world from then on; None: no world). The world goes and comes back in the
# first three incidents, grows at the scale-out, goes in the open one.
CHANGES = [(0, 4), (62.5, None), (64, 3), (72, 4), (75.3, None), (77, 3), (79, 2), (90, 3),
           (92, 4), (308, 5), (331, None), (333, 4)]
NOT_OBSERVED = (120.0, 160.0)  # no sample in between: the supervisor was not observing
AT = 340.0  # the state's record time


def history() -> list[list[Any]]:
    """A sample every 5 s and at every change of world, none while not observed."""
    times = sorted({*range(0, int(AT) + 1, 5), *(t for t, _ in CHANGES)})
    rows: list[list[Any]] = []
    step = 0.0
    for t in times:
        if NOT_OBSERVED[0] < t < NOT_OBSERVED[1]:
            continue
        if rows and rows[-1][1] is not None:  # trained since the last sample
            step += RATE * (t - rows[-1][0])
        rows.append([t, [w for c, w in CHANGES if c <= t][-1], round(step)])
    return [[T0 + t, w, s] for t, w, s in rows]


def incident(id: int, cause: str, kind: str, pods: list[str], open_: bool = False,
             **phases: float) -> dict[str, Any]:
    return {"id": id, "cause": cause, "kind": kind, "pods": pods,
            "slots": [int(p.split("-w")[1].split("-")[0]) for p in pods],
            "phases": {p: T0 + t for p, t in phases.items()}, "redone": 0, "lost_ws": 1.0,
            "open": open_}


INCIDENTS = [
    # The survivors were fenced and resumed before the kubelet reported the exit.
    incident(1, "ExitCode", "failure", ["job1-w1-1"], detected=64.5, fenced=62.5,
             resumed=64, created=64.6, scheduled=65, started=66, joined=72, full=72),
    incident(2, "NodeNotReady", "failure", ["job1-w2-1"], detected=75, fenced=75.3,
             resumed=77, created=76, scheduled=80, started=85, joined=92, full=92),
    incident(3, "Evicted", "leave", ["job1-w3-1"], detected=78, resumed=79, created=79.5,
             joined=90, full=90),
    incident(4, "ScaleOut", "scale", ["job1-w4-1"], detected=300, created=300.2,
             scheduled=300.5, started=303, joined=308, full=308),
    incident(5, "Hung", "failure", ["job1-w0-1"], open_=True, detected=330, fenced=331,
             resumed=333),
]


def state(**progress: Any) -> dict[str, Any]:
    return {"ledger": {"total": 3}, "incidents": INCIDENTS, "progress": {
        "step": 600, "redone": 7, "rate": 2.0, "world": 4, "desired": 5, "training": True,
        "since": T0, "at": T0 + AT, "wall_s": AT, "training_s": 330.0, "full_s": 280.0,
        "goodput": 280 / AT, "goodput_any": 330 / AT, "productive_ws": 1200.0,
        "lost_ws": 160.0, "history": history(), **progress}}


def event(reason: str, at: float, *, name: str = "job1-x7k2p", kind: str = "Pod",
          type_: str = "Warning", controller: str = timeline.SUPERVISOR) -> dict[str, Any]:
    when = dt.datetime.fromtimestamp(T0 + at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"reason": reason, "type": type_, "eventTime": when, "reportingController": controller,
            "regarding": {"kind": kind, "name": name}}


EVENTS = [
    event("WorkerRestarting", 64.6),
    event("WorkerCreated", 64.7, type_="Normal"),
    event("JobLevel", 100, name="job1", kind="Job", type_="Normal"),
    event("OtherJob", 70, name="job2-x7k2p"),
    event("OtherController", 70, controller="kubelet"),
    event("BeforeTheFirstStep", -20),
    event("AfterTheRecord", AT + 5),
]


@pytest.fixture(scope="module")
def drawn_plan() -> Plan:
    return timeline.plan("job1", state(), EVENTS)


def covers(xs: tuple[float, ...], x: float) -> bool:
    return xs[0] < x < xs[-1]


# ---- series ---------------------------------------------------------------------------------

def test_the_world_is_split_at_every_gap_and_wherever_there_was_no_world(
        drawn_plan: Plan) -> None:
    x = drawn_plan.axis.x
    holes = [(62.5, 64), (75.3, 77), NOT_OBSERVED, (331, 333)]
    assert len(drawn_plan.world) == len(holes) + 1
    for a, b in holes:
        middle = x(T0 + (a + b) / 2)
        assert not any(covers(s.xs, middle) for s in drawn_plan.world), (a, b)
    first = drawn_plan.world[0]
    assert set(first.ys) == {4.0}
    assert first.xs[-1] == x(T0 + 62.5), "held until the sample where the world went"
    assert drawn_plan.world[2].xs[-1] == x(T0 + 120), "not held across what was not observed"
    assert drawn_plan.world[-1].xs[-1] == drawn_plan.axis.end, "held until the record's time"
    assert drawn_plan.unobserved == ((x(T0 + 120), x(T0 + 160)),)


def test_the_step_rate_comes_from_the_step_deltas_and_stops_at_the_gap(
        drawn_plan: Plan) -> None:
    x = drawn_plan.axis.x
    assert len(drawn_plan.rate) == 2
    assert not any(covers(s.xs, x(T0 + 140)) for s in drawn_plan.rate)
    rates = [r for s in drawn_plan.rate for r in s.ys]
    assert min(rates) == 0.0, "flat while there was no world"
    assert max(rates) == pytest.approx(RATE, abs=0.5)
    steady = drawn_plan.rate[0]
    i = steady.xs.index(x(T0 + 40))
    assert steady.ys[i] == pytest.approx(RATE)
    assert drawn_plan.rate_top > max(rates)


def test_the_desired_size_before_a_scale_is_what_trained_before_it(drawn_plan: Plan) -> None:
    x = drawn_plan.axis.x
    assert list(zip(drawn_plan.desired.xs, drawn_plan.desired.ys, strict=True)) == [
        (0.0, 4.0), (x(T0 + 300), 5.0), (drawn_plan.axis.end, 5.0)]


@pytest.mark.parametrize(("top", "most", "ticks"), [
    (1, 9, (0, 1)),
    (5, 9, (0, 1, 2, 3, 4, 5)),
    (4.5, 9, (0, 1, 2, 3, 4, 5)),
    (9, 9, (0, 2, 4, 6, 8, 10)),
    (17, 9, (0, 5, 10, 15, 20)),
    (1000, 9, (0, 200, 400, 600, 800, 1000)),
], ids=str)
def test_world_ticks_are_integers_from_zero_past_the_top(top: float, most: int,
                                                         ticks: tuple[int, ...]) -> None:
    assert timeline.int_ticks(top, most) == ticks


def test_the_world_axis_has_integer_ticks_up_to_the_largest_size(drawn_plan: Plan) -> None:
    assert drawn_plan.world_ticks == (0, 1, 2, 3, 4, 5)
    assert all(isinstance(t, int) for t in drawn_plan.world_ticks)
    assert drawn_plan.world_top > 5


# ---- incidents ------------------------------------------------------------------------------

def occupied(i: Incident) -> tuple[float, float]:
    return (min(i.x, i.label_x), max([i.label_x + i.label_w, *(s.x1 for s in i.spans)]))


def test_one_label_per_incident_on_rows_where_nothing_overlaps(drawn_plan: Plan) -> None:
    assert [i.label for i in drawn_plan.incidents] == [
        "ExitCode w1", "NodeNotReady w2", "Evicted w3", "ScaleOut w4", "Hung w0 (open)"]
    close = drawn_plan.incidents[:3]
    assert len({i.row for i in close}) == 3, "three incidents within 15 s: three rows"
    assert drawn_plan.rows == 1 + max(i.row for i in drawn_plan.incidents)
    for a, b in itertools.combinations(drawn_plan.incidents, 2):
        if a.row == b.row:
            (a0, a1), (b0, b1) = occupied(a), occupied(b)
            assert a1 < b0 or b1 < a0, (a.label, b.label)
    assert drawn_plan.incidents[3].row == 0, "a later incident reuses the first row"
    assert all(i.label_x >= 0 and i.label_x + i.label_w <= drawn_plan.axis.end
               for i in drawn_plan.incidents)


def test_an_incident_is_shaded_by_phase_in_time_order(drawn_plan: Plan) -> None:
    x = drawn_plan.axis.x
    killed = drawn_plan.incidents[0]
    assert killed.x == x(T0 + 62.5), "it starts at its first phase (fenced before detected)"
    assert [s.phase for s in killed.spans] == [
        "resumed", "detected", "created", "scheduled", "started", "joined"]
    for a, b in itertools.pairwise(killed.spans):
        assert a.x1 == b.x0 and a.x0 < a.x1
    assert killed.spans[-1].x1 == x(T0 + 72)


def test_an_open_incident_runs_to_the_end_of_the_record(drawn_plan: Plan) -> None:
    hung = drawn_plan.incidents[-1]
    assert hung.open
    assert [s.phase for s in hung.spans] == ["fenced", "resumed", OPEN]
    assert hung.spans[-1].x1 == drawn_plan.axis.end


@pytest.mark.parametrize(("raw", "text"), [
    ({"cause": "ExitCode", "pods": ["job1-w1-3"], "slots": [1]}, "ExitCode w1"),
    ({"cause": "ScaleOut", "pods": [], "slots": [3, 4]}, "ScaleOut w3,w4"),
    ({"cause": "NodeNotReady", "pods": ["j-w1-1", "j-w2-1", "j-w3-1", "j-w4-1"]},
     "NodeNotReady w1,w2+2"),
    ({"cause": "Stall", "pods": [], "slots": []}, "Stall"),
    ({"cause": "Hung", "pods": ["custom-pod"], "open": True}, "Hung custom-pod (open)"),
], ids=["a pod", "slots only", "many pods", "nobody", "a pod not named by the supervisor"])
def test_a_label_is_the_cause_and_who(raw: dict[str, Any], text: str) -> None:
    assert timeline.label(raw) == text


# ---- the time axis --------------------------------------------------------------------------

def test_a_long_quiet_stretch_is_squeezed_and_marked_with_its_real_length(
        drawn_plan: Plan) -> None:
    s = Settings()
    # Quiet from 10 s after the last of the three incidents to 10 s before the scale-out.
    (sq,) = drawn_plan.squeezed
    assert sq.real_s == pytest.approx((300 - s.pad_s) - (92 + s.pad_s))
    assert sq.x1 - sq.x0 == s.squeezed_s
    assert sq.text == "3m08s"
    assert drawn_plan.axis.end == pytest.approx(AT - sq.real_s + s.squeezed_s)
    assert not any(sq.x0 < t.x < sq.x1 for t in drawn_plan.x_ticks), "no tick in it"
    xs = [drawn_plan.axis.x(T0 + t) for t in range(0, int(AT) + 1)]
    assert xs == sorted(xs), "time only moves forward"
    assert "squeezed" in drawn_plan.x_label


@pytest.mark.parametrize(("busy", "squeezed"), [
    ([], []),
    ([(500, 510)], [(0, 490), (520, 1000)]),
    ([(100, 110), (150, 160)], [(170, 1000)]),
    ([(0, 1000)], []),
], ids=["nothing happened: nothing squeezed", "one incident: the quiet on both sides",
        "a short quiet stretch stays", "busy throughout"])
def test_which_stretches_are_squeezed(busy: list[tuple[float, float]],
                                      squeezed: list[tuple[float, float]]) -> None:
    axis = timeline._axis(0.0, 1000.0, busy, Settings())
    assert [(p.t0, p.t1) for p in axis.pieces if p.squeezed] == squeezed
    assert axis.x(1000.0) == axis.end


def test_time_ticks_are_labelled_with_the_real_time(drawn_plan: Plan) -> None:
    (sq,) = drawn_plan.squeezed
    for tick in drawn_plan.x_ticks:
        minutes, seconds = tick.label.split(":")
        assert tick.x == drawn_plan.axis.x(T0 + 60 * int(minutes) + int(seconds)), tick
    assert drawn_plan.x_ticks[0] == timeline.Tick(0.0, "0:00")
    assert any(t.x > sq.x1 for t in drawn_plan.x_ticks), "the real time after a squeeze too"
    gaps = [b.x - a.x for a, b in itertools.pairwise(drawn_plan.x_ticks)]
    assert min(gaps) >= 8 * drawn_plan.axis.end / Settings().chars_across, "labels apart"


# ---- events, title, errors ------------------------------------------------------------------

def test_only_the_jobs_supervisor_events_in_the_record_are_marked(drawn_plan: Plan) -> None:
    assert [(m.reason, m.warning) for m in drawn_plan.events] == [
        ("WorkerRestarting", True), ("WorkerCreated", False), ("JobLevel", False)]


def test_the_title_gives_both_goodputs(drawn_plan: Plan) -> None:
    assert "goodput 82.4 % training at the size asked for, 97.1 % training at all" in \
        drawn_plan.title
    assert "5 incidents" in drawn_plan.title and "7 computed again" in drawn_plan.title


@pytest.mark.parametrize(("stored", "error", "says"), [
    (None, NoProgress, "no training progress recorded yet"),
    ({"ledger": {}}, NoProgress, "no training progress"),
    ({"progress": {"history": []}}, NoProgress, "no training progress"),
    ({"progress": {"history": [[T0, 2, 0], [T0 + 5, "2", 10]]}}, TimelineError,
     r"progress.history[1]: expected [epoch s, world or null, step], got"),
    ({"progress": {"history": [[T0, 2, None]]}}, TimelineError,
     "progress.history[0][2]: expected a number, got None"),
    ({"progress": {"history": [[T0, 2, 0]]}, "incidents": [{"id": 1, "phases": {}}]},
     TimelineError, "incidents[0].phases: expected at least 'detected'"),
], ids=["no state", "no progress key", "an empty history", "a world that is not an integer",
        "a step that is not a number", "an incident without phases"])
def test_what_cannot_be_drawn_is_named(stored: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as e:
        timeline.plan("job1", stored, [])
    assert says in str(e.value)


def test_a_single_sample_is_drawn() -> None:
    p = timeline.plan("job1", {"progress": {"history": [[T0, 2, 0]], "at": T0}}, [])
    assert [s.ys for s in p.world] == [(2.0,)]
    assert p.world_ticks == (0, 1, 2) and p.incidents == () and p.rate == ()


# ---- the PNG --------------------------------------------------------------------------------

def test_the_png_shows_integer_ticks_and_one_readable_label_per_incident(
        drawn_plan: Plan, tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    drawn = timeline_png.render(drawn_plan, png)
    meta = timeline_png.read_png_text(png)
    shown = json.loads(meta[timeline_png.METADATA_KEY])
    assert shown == json.loads(drawn.to_json())
    assert shown["world_ticks"] == ["0", "1", "2", "3", "4", "5"]
    assert shown["labels"] == [i.label for i in drawn_plan.incidents]
    boxes = shown["boxes"]
    assert len(boxes) == len(INCIDENTS)
    for (a, la), (b, lb) in itertools.combinations(zip(boxes, shown["labels"], strict=True), 2):
        apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
        assert apart, f"{la!r} overlaps {lb!r}: {a} {b}"
    assert shown["squeezed"] == ["3m08s"]
    assert meta["Title"].startswith("job1: goodput 82.4 %")


def test_a_png_without_text_chunks_reads_as_none(tmp_path: Path) -> None:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))

    png = tmp_path / "plain.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0,
                                                                      0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b""))
    assert timeline_png.read_png_text(png) == {}
    with pytest.raises(ValueError, match="not a PNG"):
        timeline_png.read_png_text(Path(__file__))


# ---- the command ----------------------------------------------------------------------------

@pytest.mark.parametrize(("stored", "code", "says"), [
    (None, 1, "no supervisor state for job job1 in ns1 (configmap "
              "ns1/job1-supervisor-state): nothing to draw"),
    ({"ledger": {}}, 1, "job job1: no training progress recorded yet"),
    ({"progress": {"history": [[T0, "x", 0]]}}, 1,
     "configmap ns1/job1-supervisor-state: progress.history[0]"),
], ids=["no state", "no progress yet", "a malformed history"])
def test_the_command_says_why_it_draws_nothing(stored: Any, code: int, says: str,
                                               tmp_path: Path) -> None:
    got, line = cli.draw_timeline("job1", "ns1", stored, [], tmp_path / "t.png")
    assert (got, says in line, "\n" in line) == (code, True, False), line
    assert not (tmp_path / "t.png").exists()


def test_the_command_takes_a_job_a_namespace_and_a_file() -> None:
    args = cli.build_parser().parse_args(["timeline", "--job", "j", "-n", "ns", "-o", "x.png"])
    assert (args.job, args.namespace, args.png) == ("j", "ns", Path("x.png"))
    assert cli.build_parser().parse_args(["timeline", "--job", "j"]).png is None


def test_the_command_writes_the_png(tmp_path: Path) -> None:
    png = tmp_path / "out" / "t.png"
    code, line = cli.draw_timeline("job1", "ns1", state(), EVENTS, png)
    assert (code, line) == (0, f"wrote {png} (5 incidents)")
    assert timeline_png.METADATA_KEY in timeline_png.read_png_text(png)


def test_without_matplotlib_the_command_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(timeline_png.RendererMissing):
        timeline_png.render(timeline.plan("job1", state(), []), Path("/nonexistent/t.png"))
    assert cli.main(["timeline", "--job", "job1", "-n", "ns1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["elastic-supervisor: the timeline needs matplotlib, which is not installed: "
                   "pip install 'elastic-supervisor[demo]'"]
