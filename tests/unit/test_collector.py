"""The garbage collector kept off the failure path (supervisor/collector.py), on this very
interpreter's collector: what lived a while is frozen (out of every generation a collection
walks) at a pass with nothing to do, a cycle made before is collected first, every
collection's pause reaches the histogram, and uninstalling gives the objects back."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from supervisor.collector import MAX_DEFER_S, REFREEZE_S, Collector


@pytest.fixture
def collector() -> Iterator[tuple[Collector, list[tuple[int, float]]]]:
    seen: list[tuple[int, float]] = []
    c = Collector(lambda gen, s: seen.append((gen, s)))
    c.install()
    try:
        yield c, seen
    finally:
        c.uninstall()
    assert gc.get_freeze_count() == 0


def tracked(obj: object) -> bool:
    """Whether a collection of the oldest generation walks `obj`."""
    return any(o is obj for o in gc.get_objects())


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_what_lived_is_frozen_and_a_cycle_made_before_is_collected_first(
        collector: tuple[Collector, list[tuple[int, float]]]) -> None:
    c, _ = collector
    pods = {f"job1-w{i}-1": {"metadata": {"labels": {"slot": str(i)}}} for i in range(100)}
    a, b = Node(), Node()
    a.other, b.other = b, a
    cycle = weakref.ref(a)
    del a, b
    assert tracked(pods)
    frozen = c.tick(1_000.0, idle=True)
    assert frozen is not None and frozen.frozen > 100
    assert not tracked(pods) and not tracked(pods["job1-w7-1"]["metadata"])
    assert cycle() is None, "garbage in a cycle is collected before the freeze, not kept"
    c.uninstall()
    assert tracked(pods), "unfrozen: collectable again"


def test_a_freeze_waits_for_a_pass_with_nothing_to_do_but_not_for_ever(
        collector: tuple[Collector, list[tuple[int, float]]]) -> None:
    c, _ = collector
    assert c.tick(1_000.0, idle=False) is not None, "the first pass: at once"
    due = 1_000.0 + REFREEZE_S
    assert c.tick(due - 1, idle=True) is None
    assert c.tick(due, idle=False) is None, "a pass with triggers: not now"
    assert c.tick(due + MAX_DEFER_S - 1, idle=False) is None
    assert c.tick(due + 5, idle=True) is not None, "the next pass with nothing to do"
    later = due + 5 + REFREEZE_S
    assert c.tick(later + MAX_DEFER_S, idle=False) is not None, "deferred at most MAX_DEFER_S"


def test_every_collection_pause_reaches_the_histogram_at_the_next_pass(
        collector: tuple[Collector, list[tuple[int, float]]]) -> None:
    c, seen = collector
    c.tick(1_000.0, idle=True)
    assert [gen for gen, _ in seen][-1:] == [2], "the freeze's own collection, at once"
    seen.clear()
    gc.collect(0)
    gc.collect(2)
    assert seen == [], "kept until the loop's pass, never observed inside the collection"
    c.tick(1_001.0, idle=True)
    assert [gen for gen, _ in seen] == [0, 2]
    assert all(s >= 0 for _, s in seen)


def test_uninstalled_it_times_nothing() -> None:
    seen: list[tuple[int, float]] = []
    c = Collector(lambda gen, s: seen.append((gen, s)))
    c.install()
    c.uninstall()
    gc.collect(0)
    assert c.tick(0.0, idle=True) is not None
    c.uninstall()
    assert seen == []
