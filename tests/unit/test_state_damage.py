"""A damaged state ConfigMap (`<job>-supervisor-state`, edited by hand or truncated) stops the
start with one line naming the ConfigMap and what is wrong, exit 4 (StateDamaged): never a
traceback, never retried for the start budget, never reset (issue 39, item 8: a list body or
`Infinity` raised AttributeError out of the start).

The text is decoded as the store decodes what the API server returns (kube.decode_state) and
read as the start reads it (startup.load_fleet), through the start's own retry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from supervisor import kube, startup
from supervisor.config import parse_config
from supervisor.decide import fleet
from supervisor.startup import load_fleet
from tests.helpers import Log

CFG = parse_config({"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a",
                    "SUPERVISOR_NP": "2"})
NAME = "configmap team-a/job1-supervisor-state"
# A state the supervisor wrote (two slots, nothing failed yet), for damage inside it.
GOOD = json.dumps(fleet.fleet_to_dict(fleet.initial(2)), sort_keys=True)


def within(**top: str) -> str:
    """GOOD with these top-level keys set to raw JSON text."""
    return GOOD[:-1] + "".join(f', "{k}": {v}' for k, v in top.items()) + "}"


class Store:
    """kube.StateStore past its GET: what the ConfigMap's state.json holds."""

    name, KEY = "job1-supervisor-state", "state.json"

    def __init__(self, raw: str) -> None:
        self.raw = raw

    def load(self) -> tuple[dict[str, Any] | None, str | None]:
        return kube.decode_state(self.raw, f"{NAME}: {self.KEY}"), "4711"


FIX = "; fix or delete it deliberately"
BUDGETS = FIX + " (deleting resets the restart budgets)"


@pytest.mark.parametrize(("raw", "message"), [
    pytest.param("[1, 2]", f"{NAME}: state.json is not a JSON object (an array: '[1, 2]'){FIX}",
                 id="a list body"),
    pytest.param("Infinity", f"{NAME}: state.json is not JSON (Infinity is not a JSON "
                 f"number){FIX}", id="Infinity"),
    pytest.param("null", f"{NAME}: state.json is not a JSON object (null: 'null'){FIX}",
                 id="null: not nothing stored (that would reset the budgets)"),
    pytest.param('"{}"', f"{NAME}: state.json is not a JSON object (a string: '\"{{}}\"'){FIX}",
                 id="a JSON string holding an object"),
    pytest.param(GOOD.replace('"total": 0', '"total": NaN'), f"{NAME}: state.json is not JSON "
                 f"(NaN is not a JSON number){FIX}", id="NaN inside"),
    pytest.param(within(progress='{"step": 1e400}'), f"{NAME}: state.json is not JSON (1e400 "
                 f"is not a finite number){FIX}", id="1e400 inside: no OverflowError"),
    pytest.param("{oops", f"{NAME}: state.json is not JSON (Expecting property name enclosed "
                 f"in double quotes: line 1 column 2 (char 1)){FIX}", id="not JSON"),
    pytest.param(within(progress="[1]"), f"{NAME}: state.json: progress: expected a mapping, "
                 f"not list{BUDGETS}", id="progress a list"),
    pytest.param(within(progress='{"seen": [1]}'), f"{NAME}: state.json: progress: 'list' "
                 f"object has no attribute 'items'{BUDGETS}", id="progress.seen a list"),
    pytest.param(within(incidents='{"a": 1}'), f"{NAME}: state.json: incidents: TypeError("
                 f"\"string indices must be integers, not 'str'\"){BUDGETS}",
                 id="incidents a mapping"),
    pytest.param(within(slowMoves='{"at": ["x"], "ranks": [0]}'), f"{NAME}: state.json: "
                 f"slowMoves.at: expected a list of times (epoch seconds), got ['x']{BUDGETS}",
                 id="a straggler move's time a string"),
    pytest.param(within(slowMoves='{"at": [], "ranks": [-1]}'), f"{NAME}: state.json: "
                 f"slowMoves.ranks: expected a list of ranks (integers >= 0), got [-1]{BUDGETS}",
                 id="a negative rank moved"),
    pytest.param(within(slots='[{"incarnation": 1}]'), f"{NAME}: state.json: slots: expected "
                 f"a mapping of slot number to slot{BUDGETS}", id="slots a list (read as before)"),
])
def test_a_damaged_state_stops_the_start_with_one_line(raw: str, message: str) -> None:
    log = Log()
    retry = startup.ApiRetry(0.5, log=log, stopping=startup.Stopping())
    with pytest.raises((kube.Damaged, ValueError)) as err:
        retry.call("read the state", lambda: load_fleet(CFG, Store(raw)))  # type: ignore[arg-type]
    said = str(err.value)
    assert said == message and "\n" not in said
    assert log.lines == [], "not retried: fixing it takes a person"


def test_the_state_as_the_supervisor_writes_it_is_read() -> None:
    got, rv, stored = load_fleet(CFG, Store(within(progress='{"step": 12, "at": 1.5}')))
    assert (got, rv, stored["progress"]) == (fleet.initial(2), "4711", {"step": 12, "at": 1.5})
