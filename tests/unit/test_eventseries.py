"""eventseries.Correlator: which Event writes a stream of decisions costs (client-go's
EventCorrelator semantics: series for the same Event, combined notes for similar ones, a bounded
write rate), on a fake clock."""

from __future__ import annotations

import itertools

from supervisor.eventseries import (
    AGGREGATE_AFTER,
    COMBINED,
    SERIES_WRITE_S,
    SIMILAR_WINDOW_S,
    WINDOW_S,
    Correlator,
    Write,
)
from supervisor.model import EventSpec

CHANGED = EventSpec("Normal", "WorkersChanged", "Publish", "hosts: +10.0.0.1")
RESTART = EventSpec("Warning", "WorkerRestarting", "Replace", "worker w-0: ExitCode 137")
names = (f"e{i}" for i in itertools.count())


def observe(c: Correlator, spec: EventSpec, now: float) -> list[Write]:
    return c.observe(spec, now, next(names))


def test_the_first_event_is_created_and_a_repeat_is_a_series_written_at_most_every_10_s() -> None:
    c = Correlator()
    (first,) = observe(c, CHANGED, 0.0)
    assert first.create and first.spec == CHANGED
    assert observe(c, CHANGED, 1.0) == [], "held: written with the next one"
    assert observe(c, CHANGED, 2.0) == []
    assert c.next_due() == SERIES_WRITE_S
    assert c.due(SERIES_WRITE_S - 0.1) == []
    assert c.due(SERIES_WRITE_S) == [Write(CHANGED, first.name, 3)]
    assert c.next_due() is None, "nothing held any more"
    assert observe(c, CHANGED, 25.0) == [Write(CHANGED, first.name, 4)], "due: at once"


def test_different_decisions_are_different_events() -> None:
    c = Correlator()
    a, b = observe(c, CHANGED, 0.0), observe(c, RESTART, 0.5)
    assert a[0].create and b[0].create and a[0].name != b[0].name


def test_similar_events_past_ten_notes_are_combined_into_one_series() -> None:
    c = Correlator()
    writes = [w for i in range(AGGREGATE_AFTER + 30)
              for w in observe(c, EventSpec("Normal", "WorkersChanged", "Publish",
                                            f"hosts: +10.0.0.{i}"), i * 0.1)]
    creates = [w for w in writes if w.create]
    assert len(creates) == AGGREGATE_AFTER + 1
    combined = creates[-1]
    assert combined.spec.note == COMBINED + f"hosts: +10.0.0.{AGGREGATE_AFTER}"
    (last,) = c.flush()
    assert (last.name, last.count) == (combined.name, 30)
    assert last.spec.note == combined.spec.note, "its note stays (immutable in the API)"


def test_a_storm_costs_a_bounded_number_of_writes() -> None:
    """50 decisions a second for 10 minutes, each with its own note (a Ready flip storm at
    1,000 workers): 10 Events a minute and one series write every 10 s, not 30,000 writes."""
    c = Correlator()
    writes: list[Write] = []
    for i in range(50 * 600):
        now = i / 50
        writes += observe(c, EventSpec("Normal", "WorkersChanged", "Publish", f"flip {i}"), now)
        writes += c.due(now)
    writes += c.flush()
    minutes = 600 / SIMILAR_WINDOW_S
    creates = sum(w.create for w in writes)
    assert creates <= AGGREGATE_AFTER * (minutes + 1) + 1
    assert len(writes) <= creates + 600 / SERIES_WRITE_S + 1
    combined = [w for w in writes if w.spec.note.startswith(COMBINED)]
    assert len({w.name for w in combined}) == 1, "one combined Event over the window"
    assert creates - 1 + max(w.count for w in combined) == 50 * 600, "every one counted"


def test_a_restart_every_half_minute_keeps_an_event_each() -> None:
    """A job's own decisions about its workers are never combined: fewer than
    AGGREGATE_AFTER distinct notes a minute."""
    c = Correlator()
    writes = [w for i in range(20) for w in observe(
        c, EventSpec("Warning", "WorkerRestarting", "Replace", f"worker w-{i}: 137"), i * 30.0)]
    assert [w.spec.note for w in writes] == [f"worker w-{i}: 137" for i in range(20)]


def test_after_the_window_the_same_event_is_new_again() -> None:
    c = Correlator()
    (first,) = observe(c, RESTART, 0.0)
    (again,) = observe(c, RESTART, WINDOW_S + 1)
    assert again.create and again.name != first.name


def test_flush_writes_what_is_held_and_nothing_twice() -> None:
    c = Correlator()
    (first,) = observe(c, RESTART, 0.0)
    observe(c, RESTART, 1.0)
    assert c.flush() == [Write(RESTART, first.name, 2)]
    assert c.flush() == []
