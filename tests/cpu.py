"""The machine's CPU time per test, beside pytest's durations: what to cut when the suite is
too slow on two cores (a lane beside another one is slower only if the two want more CPU than
there is).

Busy core-seconds are read from /proc/stat (the whole machine's user, nice, system, irq,
softirq and steal time) around each test's setup, call and teardown, so they hold the real
nodes' kubelets, containers and training processes, which are no children of pytest; what
another pytest run beside this one uses at the same time is in them too. The slowest
CPU_REPORTED are listed at the end, with the run's total and its share of the cores.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from pathlib import Path

import pytest

CPU_REPORTED = 15
STAT = Path("/proc/stat")
# A file to append one JSON line per test to (its node id, wall seconds and the machine's busy
# core-seconds over its setup, call and teardown): `python -m bench.suite` sets it and sums the
# lines by file into its record.
TIMES_ENV = "ES_TEST_TIMES"
_USED = pytest.StashKey[dict[str, float]]()
_START = pytest.StashKey[tuple[float, float]]()


def busy_core_s() -> float | None:
    """The machine's busy CPU time so far, in core-seconds; None where /proc/stat is not."""
    try:
        fields = STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    ticks = [int(x) for x in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_USED] = {}
    start = busy_core_s()
    if start is not None:
        session.config.stash[_START] = (start, time.monotonic())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    before, began = busy_core_s(), time.monotonic()
    try:
        return (yield)
    finally:
        after = busy_core_s()
        if before is not None and after is not None:
            item.config.stash[_USED][item.nodeid] = after - before
            if times := os.environ.get(TIMES_ENV):
                with open(times, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"test": item.nodeid,
                                        "wall_s": round(time.monotonic() - began, 2),
                                        "core_s": round(after - before, 1)}) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    used = config.stash.get(_USED, {})
    start = config.stash.get(_START, None)
    now = busy_core_s()
    if not used or start is None or now is None:
        return
    wall = time.monotonic() - start[1]
    total = now - start[0]
    cores = os.cpu_count() or 1
    terminalreporter.write_sep("=", f"most CPU of the machine ({CPU_REPORTED})")
    for nodeid, s in sorted(used.items(), key=lambda kv: -kv[1])[:CPU_REPORTED]:
        terminalreporter.write_line(f"{s:8.1f} core-s  {nodeid}")
    terminalreporter.write_line(
        f"{total:8.1f} core-s in {wall:.0f} s: {total / max(wall, 1e-9) / cores:.0%} of "
        f"{cores} cores")
