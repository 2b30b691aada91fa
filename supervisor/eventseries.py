"""PURE: which Event writes the supervisor makes, as client-go's EventCorrelator decides them.

Every decision is logged (one line each, nothing is lost there); its Kubernetes Event is a
summary for `kubectl describe` and `status`, and must not cost the API server a write per pod
change at 1,000 workers. All Events are about the launcher pod, so:

- the same Event again (type, reason, action and note) within WINDOW_S is not a new object:
  the existing one's `series` (count, lastObservedTime) is updated;
- similar Events (same type, reason and action) with AGGREGATE_AFTER different notes within
  SIMILAR_WINDOW_S already: the next ones are combined into one Event whose note is the first
  of them, prefixed "(combined from similar events): " (a note is immutable in
  events.k8s.io/v1; every one is in the log), counted in its series;
- a series is written at most once per SERIES_WRITE_S: the updates in between are kept and
  written with the next one, or when their time comes (`due`), or at the end (`flush`).

So one reason costs at most AGGREGATE_AFTER creates per SIMILAR_WINDOW_S, one combined Event per
WINDOW_S, and one patch per SERIES_WRITE_S for each, whatever the rate of decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from supervisor.model import EventSpec

WINDOW_S = 600.0  # client-go: a series lasts 10 minutes
AGGREGATE_AFTER = 10  # client-go's defaultAggregateMaxEvents
# Similar notes are combined only past AGGREGATE_AFTER within this (client-go: 10 minutes):
# a job's decisions about its workers (a restart every few minutes) keep an Event each; a storm
# (a Ready flip storm at 1,000 workers) does not.
SIMILAR_WINDOW_S = 60.0
SERIES_WRITE_S = 10.0  # a series' count is written at most this often
MAX_SERIES = 4096  # the series remembered (the least recently seen are forgotten)
COMBINED = "(combined from similar events): "


@dataclass(frozen=True)
class Write:
    """One API write: create Event `name` (count 1) or patch Event `name`'s series to
    `count`."""

    spec: EventSpec
    name: str
    count: int = 1

    @property
    def create(self) -> bool:
        return self.count == 1


@dataclass
class _Series:
    name: str
    count: int
    last_seen: float
    written_count: int
    written_at: float
    spec: EventSpec


class Correlator:
    """The series and similar-event windows of one recorder (its thread only)."""

    def __init__(self) -> None:
        self._series: OrderedDict[tuple[str, str, str, str], _Series] = OrderedDict()
        # per (type, reason, action): the notes with a series of their own, last seen when
        self._notes: dict[tuple[str, str, str], dict[str, float]] = {}

    def observe(self, spec: EventSpec, now: float, new_name: str) -> list[Write]:
        """The writes to make now for one more Event `spec` seen at `now`; a new Event is
        called `new_name`."""
        similar = (spec.type, spec.reason, spec.action)
        notes = self._notes.setdefault(similar, {})
        for note, at in list(notes.items()):
            if now - at > SIMILAR_WINDOW_S:
                del notes[note]
        if spec.note in notes or len(notes) < AGGREGATE_AFTER:
            notes[spec.note] = now  # one of the first notes of the window: its own series
            key = (*similar, spec.note)
        else:
            spec = replace(spec, note=COMBINED + spec.note)
            key = (*similar, COMBINED)
        s = self._series.get(key)
        if s is None or now - s.last_seen > WINDOW_S:
            self._series[key] = _Series(new_name, 1, now, 1, now, spec)
            self._series.move_to_end(key)
            while len(self._series) > MAX_SERIES:
                self._series.popitem(last=False)
            return [Write(spec, new_name)]
        s.count, s.last_seen = s.count + 1, now  # its note stays: immutable in the API
        self._series.move_to_end(key)
        return self._due_one(s, now)

    def due(self, now: float) -> list[Write]:
        """Series updates whose time has come."""
        return [w for s in list(self._series.values()) for w in self._due_one(s, now)]

    def next_due(self) -> float | None:
        """When the next held update is due (None: none is held)."""
        times = [s.written_at + SERIES_WRITE_S for s in self._series.values()
                 if s.count > s.written_count]
        return min(times) if times else None

    def flush(self) -> list[Write]:
        """Every held update, now (the recorder stops)."""
        return [w for s in self._series.values() for w in self._write(s, s.written_at)]

    def _due_one(self, s: _Series, now: float) -> list[Write]:
        if s.count == s.written_count or now - s.written_at < SERIES_WRITE_S:
            return []
        return self._write(s, now)

    @staticmethod
    def _write(s: _Series, now: float) -> list[Write]:
        if s.count == s.written_count:
            return []
        s.written_count, s.written_at = s.count, now
        return [Write(s.spec, s.name, s.count)]
