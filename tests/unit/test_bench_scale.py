"""The scale benchmarks' pure parts: an idle pass read off the supervisor's own histogram
(bench/replacement.py) and the Event writes counted off the audit log (bench/discovery.py)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from bench.discovery import event_writes_per_min
from bench.replacement import gc_pauses, idle_passes
from supervisor.metrics import PASS_BUCKETS, make_metrics
from tests.integration.harness import samples


def scraped(observed: list[float]) -> dict[str, float]:
    """What /metrics shows after the loop observed `observed` idle passes (and one busy)."""
    m = make_metrics()
    m.loop_pass.labels("events").observe(0.5)  # a busy pass is not idle
    for seconds in observed:
        m.loop_pass.labels("idle").observe(seconds)
    return samples(generate_latest(m.registry).decode())


def test_the_idle_passes_between_two_scrapes_are_counted_with_their_bounds() -> None:
    before = scraped([0.004] * 10)
    after = scraped([0.004] * 10 + [0.0015] * 98 + [0.004, 0.012])
    got = idle_passes(before, after)
    assert (got["n"], got["p50_le"], got["p99_le"], got["max_le"]) == (100, 2.0, 5.0, 15.0)
    assert got["mean"] == pytest.approx((98 * 1.5 + 4 + 12) / 100, abs=0.001)
    assert 15.0 / 1000 in PASS_BUCKETS


def test_no_idle_pass_between_the_scrapes_is_an_error_not_a_zero() -> None:
    with pytest.raises(RuntimeError, match="no idle pass"):
        idle_passes(scraped([0.001]), scraped([0.001]))


def test_the_collectors_pauses_between_two_scrapes_are_counted_by_generation() -> None:
    def pauses(observed: list[tuple[int, float]]) -> dict[str, float]:
        m = make_metrics()
        for gen, seconds in observed:
            m.gc_pause.labels(str(gen)).observe(seconds)
        return samples(generate_latest(m.registry).decode())

    before = pauses([(2, 0.3)] + [(0, 0.001)] * 5)
    after = pauses([(2, 0.3)] + [(0, 0.001)] * 5 + [(0, 0.002)] * 3 + [(2, 0.02), (2, 0.004)])
    assert gc_pauses(before, after) == {
        "gen0": {"n": 3, "total_ms": 6.0, "max_le_ms": 2.5},
        "gen2": {"n": 2, "total_ms": 24.0, "max_le_ms": 25.0}}, "gen1 saw none: left out"


def test_event_writes_are_creates_and_series_patches_of_either_group_per_minute() -> None:
    rates = {"window_s": 30.0, "requests": {
        "create events": 12, "patch events": 3, "list pods": 40, "watch pods": 1,
        "create pods": 100, "update configmaps": 9}}
    assert event_writes_per_min(rates) == 30.0
