"""A scale request written by hand into the job's scale ConfigMap (`<job>-supervisor-scale`):
only `{"workers": N}` with N a JSON integer is taken; anything else is refused with one log
line and one ScaleRefused Event naming the value and what is accepted, and the size is kept.
Driven through the loop's own handling of the ConfigMap's watch event (issue 39, item 8: `1e400`
raised OverflowError out of the loop on every retry; `true`, `"7"` and `2.9` were taken)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from supervisor.config import parse_config
from supervisor.decide import fleet
from supervisor.loop import Supervisor
from supervisor.metrics import make_metrics
from supervisor.model import EventSpec, WatchEvent
from supervisor.observe import EventType, Kind, slim
from tests.helpers import Log


def configmap(text: str, rv: str = "4711") -> dict[str, Any]:
    """The scale ConfigMap as the API server returns it (`kubectl get cm -o json`)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "job1-supervisor-scale", "namespace": "team-a", "resourceVersion": rv,
        "uid": "5d7c1b0e-8a0c-4c4f-9d53-0f6a8c1f2b11",
        "creationTimestamp": "2026-11-28T10:00:00Z"}, "data": {fleet.SCALE_KEY: text}}


def loop() -> tuple[Supervisor, Log, list[EventSpec]]:
    cfg = parse_config({"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a",
                        "SUPERVISOR_NP": "2", "SUPERVISOR_MIN_NP": "2",
                        "SUPERVISOR_MAX_NP": "4"})
    log, events = Log(), []
    sup = Supervisor(cfg, log=log, metrics=make_metrics(), events=events.append,
                     start_child=None, base_env={}, act=print,  # type: ignore[arg-type]
                     kill_ssh_clients=None, count_ssh_clients=None)  # type: ignore[arg-type]
    return sup, log, events


def seen(sup: Supervisor, text: str, rv: str = "4711") -> None:
    sup._apply([WatchEvent(Kind.SCALE, EventType.MODIFIED,
                           slim(Kind.SCALE, configmap(text, rv)), at=0.0)], 0.0)


@pytest.mark.parametrize(("text", "workers"), [
    pytest.param('{"workers": 3}', 3, id="an integer"),
    pytest.param('{"workers": 3, "requestedAt": 1764324000.5}', 3,
                 id="as `elastic-supervisor scale` writes it"),
    pytest.param('{"workers": 9}', 9, id="out of range: taken here, refused by the plan"),
])
def test_a_whole_number_of_workers_is_taken(text: str, workers: int) -> None:
    sup, _, events = loop()
    seen(sup, text)
    assert (sup.core.scale_request, events) == (workers, [])


@pytest.mark.parametrize(("text", "why"), [
    pytest.param('{"workers": 1e400}', '"workers" is Infinity, not an integer',
                 id="1e400: infinity to the JSON parser, no OverflowError"),
    pytest.param('{"workers": true}', '"workers" is true, not an integer',
                 id="true: not 1"),
    pytest.param('{"workers": "7"}', '"workers" is "7", not an integer', id="a string"),
    pytest.param('{"workers": 2.9}', '"workers" is 2.9, not an integer', id="2.9: not 2"),
    pytest.param('{"workers": 3.0}', '"workers" is 3.0, not an integer', id="3.0 neither"),
    pytest.param('{"workers": NaN}', '"workers" is NaN, not an integer', id="NaN"),
    pytest.param('{"workers": null}', '"workers" is null, not an integer', id="null"),
    pytest.param('{"replicas": 3}', 'not a JSON object with "workers"', id="another key"),
    pytest.param("[3]", 'not a JSON object with "workers"', id="a list"),
    pytest.param("3", 'not a JSON object with "workers"', id="a bare number"),
    pytest.param("{workers: 3}", "not JSON", id="not JSON"),
    pytest.param("[" * 100_000, "not JSON", id="nested past the parser's recursion limit"),
])
def test_anything_else_is_refused_once_and_the_size_kept(text: str, why: str) -> None:
    sup, log, events = loop()
    seen(sup, '{"workers": 3}', rv="1")
    seen(sup, text, rv="2")
    assert sup.core.scale_request == 3, "the size asked for before is kept"
    shown = text if len(text) <= 80 else text[:80] + "..."
    assert events == [EventSpec(
        "Warning", "ScaleRefused", "Scale",
        f"configmap job1-supervisor-scale: scale.json {shown!r} refused: {why}; expected "
        '{"workers": N}, N an integer in [2, 4] (use `elastic-supervisor scale`): the size is '
        "kept")]
    assert [(lvl, ev, f["reason"]) for lvl, ev, f in log.lines] == [
        ("error", "scale.invalid", why)]
    seen(sup, text, rv="2")  # the same version again (a relist): not said again
    assert len(events) == 1


def test_the_request_is_read_back_as_the_cli_writes_it() -> None:
    text = json.dumps({"workers": 4, "requestedAt": 1764324000.5})
    assert fleet.scale_request(text) == 4
