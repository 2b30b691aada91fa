"""The `timeline` picture of a job: world size, step rate and incidents by phase, over time.

`plan` is PURE: from the stored state (state["progress"]["history"] and state["incidents"], the
issue-26 contract) and the job's supervisor Events it returns a frozen Plan, all positions in
display seconds: observation gaps (> 30 s without a sample) and stretches without a training
world stay gaps, never interpolated; long uneventful stretches are squeezed to a fixed width and
marked with their real length, so incidents get the room; world-size ticks are integers; each
incident has one label, on a row where it overlaps no other. timeline_png.py draws a Plan.
Nothing here reads the cluster or the clock: the CLI and the demo pass what they read.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.decide.incidents import PHASES
from supervisor.operate import duration, percent

OPEN = "open"  # the stretch of an open incident from its last phase to the end of the record
SUPERVISOR = "elastic-supervisor.io/supervisor"  # the Events' reportingController (kube/api.py)


class TimelineError(ValueError):
    """Stored state that cannot be drawn; the message names the field and what was expected."""


class NoProgress(TimelineError):
    """The state holds no training progress yet (nothing trained, or an older supervisor)."""


@dataclass(frozen=True)
class Settings:
    gap_s: float = 30.0  # more seconds than this between two samples: not observed (a gap)
    pad_s: float = 10.0  # seconds kept at full scale on each side of an incident / world change
    quiet_s: float = 90.0  # a stretch with neither, longer than this (s), is squeezed ...
    squeezed_s: float = 20.0  # ... to this width (display s), its real length written on it
    rate_s: float = 2.0  # the step rate is taken over at least this many seconds
    chars_across: float = 105.0  # label characters that fit across the time axis of `render`
    max_ticks: int = 9  # at most this many ticks on either axis


@dataclass(frozen=True)
class Piece:
    """Real seconds [t0, t1] (epoch) drawn on display seconds [x0, x1]."""

    t0: float
    t1: float
    x0: float
    x1: float
    squeezed: bool


@dataclass(frozen=True)
class Axis:
    """The time axis: epoch seconds -> display seconds, piecewise linear, increasing."""

    pieces: tuple[Piece, ...]

    def x(self, t: float) -> float:
        """Where epoch second `t` is drawn (clamped to the axis)."""
        i = min(bisect.bisect_left([p.t1 for p in self.pieces], t), len(self.pieces) - 1)
        p = self.pieces[i]
        if t <= p.t0 or p.t1 <= p.t0:
            return p.x0
        return min(p.x1, p.x0 + (t - p.t0) * (p.x1 - p.x0) / (p.t1 - p.t0))

    @property
    def end(self) -> float:
        return self.pieces[-1].x1


@dataclass(frozen=True)
class Series:
    """One unbroken line, drawn steps-post (a value holds until the next point)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]


@dataclass(frozen=True)
class Span:
    """A stretch of an incident, named by the phase it ends in (PHASES), or OPEN."""

    phase: str
    x0: float
    x1: float


@dataclass(frozen=True)
class Incident:
    id: int | None
    label: str  # the cause and the pods, e.g. "ExitCode w1"
    kind: str
    open: bool
    x: float  # its first phase
    spans: tuple[Span, ...]
    row: int  # label row, 0 at the top; no two labels or bars on one row overlap
    label_x: float
    label_w: float  # the label's estimated width (display s)


@dataclass(frozen=True)
class Squeezed:
    x0: float
    x1: float
    real_s: float  # the real length of the stretch drawn on [x0, x1]
    text: str  # that length, written on it; "" where it does not fit


@dataclass(frozen=True)
class Mark:
    """A supervisor Event (decision) of the job."""

    x: float
    warning: bool
    reason: str


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Plan:
    job: str
    title: str
    start: float  # epoch s of display second 0: the first sample
    axis: Axis
    x_ticks: tuple[Tick, ...]
    x_label: str
    world: tuple[Series, ...]  # split at gaps and where there was no world
    world_ticks: tuple[int, ...]
    world_top: float
    desired: Series
    rate: tuple[Series, ...]  # steps/s from the history's step deltas; split at gaps
    rate_top: float
    incidents: tuple[Incident, ...]
    rows: int
    squeezed: tuple[Squeezed, ...]
    unobserved: tuple[tuple[float, float], ...]  # display spans with no sample for > gap_s
    events: tuple[Mark, ...]


@dataclass(frozen=True)
class _Sample:
    t: float
    world: int | None
    step: int


def plan(job: str, state: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]],
         settings: Settings = Settings()) -> Plan:
    """Return what to draw for `job` from its stored state and the namespace's Events; raise
    NoProgress when there is no history yet, TimelineError when a field is malformed."""
    progress = (state or {}).get("progress")
    if not isinstance(progress, Mapping) or not progress.get("history"):
        raise NoProgress(f"job {job}: no training progress recorded yet (the state has no "
                         "progress.history): nothing to draw")
    hist = _samples(progress["history"])
    raw = (state or {}).get("incidents") or []
    if not isinstance(raw, list):
        raise TimelineError(f"incidents: expected a list, got {type(raw).__name__}")
    incidents = [_phases(i, r) for i, r in enumerate(raw)]
    start = hist[0].t
    end = max(hist[-1].t, _num(progress.get("at"), "progress.at", hist[-1].t),
              *(t for _, ph in incidents for t in ph.values()))
    busy = [(min(ph.values()), end if r.get("open") else max(ph.values()))
            for r, ph in incidents]
    busy += [(b.t, b.t) for a, b in itertools.pairwise(hist) if a.world != b.world]
    axis = _axis(start, end, busy, settings)
    x = axis.x
    world = _world(hist, end, settings.gap_s)
    desired = _desired(hist, incidents, start, end, progress.get("desired"))
    top = max([1, *(w for s in world for _, w in s), *(d for _, d in desired)])
    ticks = int_ticks(top, settings.max_ticks)
    rate = _rate(hist, settings.gap_s, settings.rate_s)
    marks = _incidents(incidents, axis, end, settings)
    squeezed = tuple(_squeezed(p, axis.end / settings.chars_across)
                     for p in axis.pieces if p.squeezed)
    return Plan(
        job=job, title=_title(job, progress, len(incidents)), start=start, axis=axis,
        x_ticks=time_ticks(axis, start, settings.max_ticks, axis.end / settings.chars_across),
        x_label=(f"time since the first step ({_clock(start)} UTC), m:ss"
                 + ("; grey hatched: a quiet stretch squeezed" if squeezed else "")
                 + (", its real length written on it" if any(q.text for q in squeezed)
                    else "")),
        world=tuple(Series(tuple(x(t) for t, _ in s), tuple(float(w) for _, w in s))
                    for s in world),
        world_ticks=ticks, world_top=ticks[-1] + 0.4 * (ticks[1] - ticks[0]),
        desired=Series(tuple(x(t) for t, _ in desired), tuple(float(d) for _, d in desired)),
        rate=tuple(Series(tuple(x(t) for t, _ in s), tuple(r for _, r in s)) for s in rate),
        rate_top=max([0.0, *(r for s in rate for _, r in s)]) * 1.15 or 1.0,
        incidents=marks, rows=max((m.row + 1 for m in marks), default=0),
        squeezed=squeezed,
        unobserved=tuple((x(a), x(b)) for a, b in _unobserved(hist, end, settings.gap_s)),
        events=_marks(events, job, start, end, axis),
    )


# ---- reading the state ----------------------------------------------------------------------

def _num(v: Any, what: str, default: float | None = None) -> float:
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise TimelineError(f"{what}: expected a number, got {v!r}")
    return float(v)


def _samples(history: Any) -> list[_Sample]:
    """The history rows [epoch s, world or null, step] as samples, oldest first."""
    if not isinstance(history, list):
        raise TimelineError(f"progress.history: expected a list, got {type(history).__name__}")
    out = []
    for i, row in enumerate(history):
        if not isinstance(row, list | tuple) or len(row) != 3 or not (
                row[1] is None or (isinstance(row[1], int) and not isinstance(row[1], bool))):
            raise TimelineError(f"progress.history[{i}]: expected [epoch s, world or null, "
                                f"step], got {row!r}")
        out.append(_Sample(_num(row[0], f"progress.history[{i}][0]"), row[1],
                           int(_num(row[2], f"progress.history[{i}][2]"))))
    return sorted(out, key=lambda s: s.t)


def _phases(i: int, raw: Any) -> tuple[Mapping[str, Any], dict[str, float]]:
    """(the incident, its phases reached: name -> epoch s); raise on one without any."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("phases"), Mapping):
        raise TimelineError(f"incidents[{i}]: expected an object with phases, got {raw!r}")
    ph = {p: _num(raw["phases"][p], f"incidents[{i}].phases.{p}")
          for p in PHASES if raw["phases"].get(p) is not None}
    if not ph:
        raise TimelineError(f"incidents[{i}].phases: expected at least 'detected', got "
                            f"{dict(raw['phases'])!r}")
    return raw, ph


# ---- the time axis --------------------------------------------------------------------------

def _axis(start: float, end: float, busy: Sequence[tuple[float, float]],
          s: Settings) -> Axis:
    """Squeeze each stretch longer than quiet_s that is pad_s away from everything busy."""
    merged: list[list[float]] = []
    for a, b in sorted((max(start, a - s.pad_s), min(end, b + s.pad_s)) for a, b in busy):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    quiet, t = [], start
    for a, b in merged:
        if a > t:
            quiet.append((t, a))
        t = max(t, b)
    if end > t:
        quiet.append((t, end))
    pieces: list[Piece] = []
    t, x = start, 0.0
    for a, b in quiet:
        if not merged or b - a <= s.quiet_s:
            continue
        if a > t:
            pieces.append(Piece(t, a, x, x + a - t, False))
            x += a - t
        pieces.append(Piece(a, b, x, x + s.squeezed_s, True))
        x, t = x + s.squeezed_s, b
    if end > t or not pieces:
        pieces.append(Piece(t, end, x, x + end - t, False))
    return Axis(tuple(pieces))


def _nice(least: float, steps: Sequence[float]) -> float:
    return next((v for v in steps if v >= least), steps[-1])


def _squeezed(p: Piece, char: float) -> Squeezed:
    text = duration(p.t1 - p.t0)
    return Squeezed(p.x0, p.x1, p.t1 - p.t0, text if (len(text) + 1) * char <= p.x1 - p.x0
                    else "")


def time_ticks(axis: Axis, start: float, most: int, char: float) -> tuple[Tick, ...]:
    """Ticks labelled with the real time since `start`, only where time is drawn to scale (none
    inside a squeezed stretch): at round times, and where a squeezed stretch ends; never
    closer than a label's width (`char`: one character's width)."""
    step = _nice(axis.end / most, (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800,
                                   3600, 7200, 10800, 21600, 43200, 86400))
    reals: list[float] = []
    for before, p in zip((None, *axis.pieces), axis.pieces, strict=False):
        if p.squeezed:
            continue
        if before is not None and before.squeezed:
            reals.append(p.t0 - start)
        reals += [k * step for k in range(math.ceil((p.t0 - start) / step - 1e-9),
                                          math.floor((p.t1 - start) / step + 1e-9) + 1)]
    out: list[Tick] = []
    for real in sorted(set(reals)):
        x = axis.x(start + real)
        if not out or x - out[-1].x >= max(0.6 * step, 8 * char):
            out.append(Tick(x, _clock_s(real)))
    return tuple(out)


def int_ticks(top: float, most: int) -> tuple[int, ...]:
    """Integer ticks from 0 past `top`, at most `most`, 1-2-5 spaced."""
    steps = [m * 10 ** e for e in range(10) for m in (1, 2, 5)]
    step = next(v for v in steps if math.ceil(top / v) + 1 <= most)
    return tuple(range(0, math.ceil(top / step) * step + 1, step))


# ---- series ---------------------------------------------------------------------------------

def _world(hist: Sequence[_Sample], end: float, gap: float) -> list[list[tuple[float, int]]]:
    """Runs of samples with a world: a run ends where the world goes (held until that sample),
    before a gap, or at the end of the record (held until then)."""
    out: list[list[tuple[float, int]]] = []
    run: list[tuple[float, int]] = []
    for i, s in enumerate(hist):
        if s.world is None:
            continue
        run.append((s.t, s.world))
        nxt = hist[i + 1] if i + 1 < len(hist) else None
        if nxt is None:
            if 0 < end - s.t <= gap:
                run.append((end, s.world))
        elif nxt.t - s.t > gap:
            pass
        elif nxt.world is None:
            run.append((nxt.t, s.world))
        else:
            continue
        out.append(run)
        run = []
    return out


def _rate(hist: Sequence[_Sample], gap: float, least: float) -> list[list[tuple[float, float]]]:
    """Steps/s from the step deltas, as steps-post runs split at gaps. Each rate is taken over
    `least` seconds at least while the world stays the same (steps are integers: over 0.3 s one
    step more is 3 steps/s more), and never across a change of world."""
    out = []
    for run in _observed(hist, gap):
        windows: list[tuple[_Sample, _Sample]] = []
        for a, b in itertools.pairwise(run):
            if b.t <= a.t:
                continue
            if windows and windows[-1][0].world == a.world and (
                    windows[-1][1].t - windows[-1][0].t < least):
                windows[-1] = (windows[-1][0], b)
            else:
                windows.append((a, b))
        merged: list[tuple[_Sample, _Sample]] = []
        for w in windows:  # a world's short rest joins its window before
            if merged and merged[-1][0].world == w[0].world and w[1].t - w[0].t < least:
                merged[-1] = (merged[-1][0], w[1])
            else:
                merged.append(w)
        if merged:
            points = [(a.t, max(0, b.step - a.step) / (b.t - a.t)) for a, b in merged]
            out.append([*points, (merged[-1][1].t, points[-1][1])])
    return out


def _observed(hist: Sequence[_Sample], gap: float) -> list[list[_Sample]]:
    """The history split where more than `gap` seconds pass between two samples."""
    runs = [[hist[0]]]
    for a, b in itertools.pairwise(hist):
        if b.t - a.t > gap:
            runs.append([])
        runs[-1].append(b)
    return runs


def _unobserved(hist: Sequence[_Sample], end: float, gap: float) -> list[tuple[float, float]]:
    ts = [s.t for s in hist] + [end]
    return [(a, b) for a, b in itertools.pairwise(ts) if b - a > gap]


def _desired(hist: Sequence[_Sample], incidents: Sequence[tuple[Mapping[str, Any],
                                                                 dict[str, float]]],
             start: float, end: float, now: Any) -> list[tuple[float, int]]:
    """The desired size over time as steps-post points. Only the current one is stored: before
    each scale incident it is inferred as the world trained just before that incident."""
    scales = sorted(min(ph.values()) for r, ph in incidents if r.get("kind") == "scale")
    last_world = next((s.world for s in reversed(hist) if s.world is not None), 1)
    desired = int(now) if isinstance(now, int) and not isinstance(now, bool) else last_world
    points = [(end, desired)]
    for t in reversed(scales):
        if not start < t < end:
            continue
        before = [s.world for s in hist if s.t <= t and s.world is not None]
        points.append((t, desired))
        desired = before[-1] if before else desired
    points.append((start, desired))
    return points[::-1]


# ---- incidents and events -------------------------------------------------------------------

def label(raw: Mapping[str, Any]) -> str:
    """The cause and who it hit: "ExitCode w1", "ScaleOut w2,w3", "Hung w0 (open)"."""
    who = [_short(str(p)) for p in raw.get("pods") or ()] or [
        f"w{s}" for s in raw.get("slots") or ()]
    named = ",".join(who[:2]) + (f"+{len(who) - 2}" if len(who) > 2 else "")
    return (f"{raw.get('cause') or 'incident'}{' ' + named if named else ''}"
            f"{' (open)' if raw.get('open') else ''}")


def _short(pod: str) -> str:
    m = re.search(r"-(w\d+)-\d+$", pod)  # workers.pod_name: <job>-w<slot>-<incarnation>
    return m.group(1) if m else pod


def _spans(ph: Mapping[str, float], is_open: bool, end: float, axis: Axis) -> tuple[Span, ...]:
    """Between consecutive phases in time order (a phase can come before an earlier one:
    survivors may resume before the kubelet reports the exit), named by the phase reached."""
    order = sorted(ph.items(), key=lambda kv: (kv[1], PHASES.index(kv[0])))
    spans = [Span(b[0], axis.x(a[1]), axis.x(b[1])) for a, b in itertools.pairwise(order)]
    if is_open:
        spans.append(Span(OPEN, axis.x(order[-1][1]), axis.x(end)))
    return tuple(s for s in spans if s.x1 > s.x0)


def _incidents(incidents: Sequence[tuple[Mapping[str, Any], dict[str, float]]], axis: Axis,
               end: float, s: Settings) -> tuple[Incident, ...]:
    """Each incident with its spans, and its label on the first row where neither its label
    nor its bar meets another's (incidents in time order)."""
    char = axis.end / s.chars_across
    rows: list[float] = []  # where each row is taken up to
    out = []
    for raw, ph in sorted(incidents, key=lambda i: min(i[1].values())):
        text = label(raw)
        spans = _spans(ph, bool(raw.get("open")), end, axis)
        x = axis.x(min(ph.values()))
        width = (len(text) + 1) * char
        label_x = max(0.0, min(x, axis.end - width))
        lo, hi = min(x, label_x), max([label_x + width, *(sp.x1 for sp in spans)])
        row = next((r for r, taken in enumerate(rows) if taken + char <= lo), len(rows))
        if row == len(rows):
            rows.append(hi)
        rows[row] = hi
        out.append(Incident(raw.get("id"), text, str(raw.get("kind") or ""),
                            bool(raw.get("open")), x, spans, row, label_x, width))
    return tuple(out)


def _marks(events: Iterable[Mapping[str, Any]], job: str, start: float, end: float,
           axis: Axis) -> tuple[Mark, ...]:
    """The job's supervisor Events in the record's window: about its launcher pod (the Job's
    pods are <job>-xxxxx) or its Job."""
    pod = re.compile(rf"{re.escape(job)}-[a-z0-9]{{5}}")
    out = []
    for e in events:
        reg = e.get("regarding") or {}
        name = str(reg.get("name") or "")
        if e.get("reportingController") != SUPERVISOR or not (
                (reg.get("kind") == "Job" and name == job) or pod.fullmatch(name)):
            continue
        t = _epoch(e.get("eventTime"))
        if t is not None and start <= t <= end:
            out.append(Mark(axis.x(t), e.get("type") == "Warning", str(e.get("reason") or "")))
    return tuple(sorted(out, key=lambda m: m.x))


def _epoch(text: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---- words ----------------------------------------------------------------------------------

def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _clock_s(s: float) -> str:
    """m:ss, or h:mm:ss from an hour."""
    s = round(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


def _title(job: str, p: Mapping[str, Any], incidents: int) -> str:
    lost = p.get("lost_ws")
    return (f"{job}: goodput {percent(p.get('goodput'))} training at the size asked for, "
            f"{percent(p.get('goodput_any'))} training at all\n"
            f"{duration(float(p.get('wall_s') or 0))} since the first step, step "
            f"{p.get('step', '-')} ({p.get('redone', 0)} computed again), {incidents} "
            f"incident{'s' * (incidents != 1)}"
            + (f", {lost:.0f} worker-seconds lost" if isinstance(lost, int | float) else ""))
