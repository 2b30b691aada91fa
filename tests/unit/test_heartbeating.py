"""beats.heartbeating, the one "fresh heartbeat" rule, on records of real heartbeats.

Each record is a datagram a training process sent on an H200 (shapes/h200_stuck_work0.jsonl.gz:
rank 0 mid-training, and its process watcher's report), folded through the supervisor's own
record keeping (heartbeats.updated, heartbeats.watched) at a receipt time of the test's
choosing, then judged at `now`. The hang watch's rule (silence_s, exclusive) and progress's
(FRESH_S, inclusive) differ only at their boundary; both are in the table.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.decide.beats import Beat, heartbeating
from supervisor.decide.hang import HangSettings
from supervisor.decide.progress import FRESH_S
from supervisor.heartbeats import updated, watched

SILENCE_S = HangSettings().silence_s  # SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS's default, 3 s
HEARD = 100.0  # when the supervisor received the heartbeat (monotonic)
ADDR = ("127.0.0.1", 4000)


def recorded(t: str, rank: int) -> dict[str, Any]:
    """The first datagram of type `t` from the process of `rank` once it trained (rank set)."""
    path = Path(__file__).parent / "shapes" / "h200_stuck_work0.jsonl.gz"
    with gzip.open(path, "rt") as f:
        bodies = [json.loads(line).get("body") for line in f]
    senders = {b["s"] for b in bodies if b and b["t"] == "hb" and b.get("rank") == rank}
    return next(b for b in bodies if b and b["t"] == t
                and (b.get("rank") == rank if t == "hb" else b.get("of") in senders))


HB = recorded("hb", 0)
PS = recorded("ps", 0)


def heard(at: float = HEARD) -> Beat:
    """Rank 0's record after its heartbeat arrived at `at`."""
    b = updated(None, HB, ADDR, at)
    assert b is not None and b.rank == 0 and b.bye_at is None
    return b


def said_bye(at: float) -> Beat:
    """Its record after the bye its Beater sends on the way out, received at `at`."""
    bye = {"t": "bye", "s": HB["s"], "n": HB["n"] + 1, "run": HB["run"], "pid": HB["pid"],
           "host": HB["host"], "lr": HB["lr"]}
    b = updated(heard(), bye, ADDR, at)
    assert b is not None and b.bye_at == at
    return b


@pytest.mark.parametrize(("beat", "now", "within", "inclusive", "expected"), [
    pytest.param(heard(), HEARD, SILENCE_S, False, True,
                 id="a heartbeat received just now is fresh"),
    pytest.param(heard(), HEARD + 2.5, SILENCE_S, False, True,
                 id="one 2.5 s old is fresh while the silence bound is 3 s"),
    pytest.param(heard(), HEARD + SILENCE_S, SILENCE_S, False, False,
                 id="one exactly silence_s old is silent: the hang watch's bound is exclusive"),
    pytest.param(heard(), HEARD + 60, SILENCE_S, False, False,
                 id="one a minute old is silent"),
    pytest.param(heard(), HEARD + FRESH_S, FRESH_S, True, True,
                 id="one exactly FRESH_S old still shows its world: progress's bound is inclusive"),
    pytest.param(heard(), HEARD + FRESH_S, FRESH_S, False, False,
                 id="the same age under an exclusive bound is not fresh"),
    pytest.param(heard(), HEARD + 2.25, FRESH_S, True, False,
                 id="one a quarter second past FRESH_S shows no world"),
    pytest.param(said_bye(HEARD + 1), HEARD + 1, SILENCE_S, False, False,
                 id="a process that said bye is not heartbeating, however recent its word"),
    pytest.param(said_bye(HEARD + 1), HEARD + 1, FRESH_S, True, False,
                 id="nor under progress's bound"),
    pytest.param(watched(heard(), PS, HEARD + 5), HEARD + 5, SILENCE_S, False, False,
                 id="its watcher's report just now does not make a 5 s old heartbeat fresh"),
    pytest.param(watched(heard(), PS, HEARD + 5), HEARD + 2, SILENCE_S, False, True,
                 id="and changes nothing for a heartbeat that is fresh"),
])
def test_heartbeating(beat: Beat, now: float, within: float, inclusive: bool,
                      expected: bool) -> None:
    assert heartbeating(beat, now, within, inclusive=inclusive) is expected
