"""The watches adapter says when a node goes down and comes back (supervisor/watches.py):
the supervisor keeps new workers off a down node and times its workers' loss from then, and
the 10,000-worker start that kept workers off 81 nodes left no line saying which or why.
Node objects are the captured shapes (tests/unit/shapes)."""

from __future__ import annotations

from supervisor.config import parse_config
from supervisor.decide.memory import Memory, hang_settings
from supervisor.metrics import make_metrics
from supervisor.model import WatchEvent
from supervisor.observe import EventType, Kind
from supervisor.reports import Reports
from supervisor.watches import Watches
from tests.helpers import Log
from tests.unit.shapes import node, with_condition


def test_a_node_down_and_up_again_is_said_once_each_way() -> None:
    cfg = parse_config({"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n",
                        "SUPERVISOR_NP": "2"})
    log, metrics = Log(), make_metrics()
    w = Watches(cfg, log=log, events=print, metrics=metrics, leases=None,
                reports=Reports(cfg, log=log, metrics=metrics, events=print, channel=None,
                                hang_settings=hang_settings(cfg)))
    ready, not_ready = node("node-a"), with_condition(node("node-a"), "Ready", "False")
    tainted = node("node-b", "node_unreachable")
    c = Memory()
    for i, (kind, shape, at) in enumerate([
            (EventType.ADDED, ready, 1.0), (EventType.MODIFIED, not_ready, 2.0),
            (EventType.MODIFIED, not_ready, 3.0), (EventType.MODIFIED, ready, 9.5),
            (EventType.ADDED, tainted, 10.0), (EventType.DELETED, tainted, 11.0)]):
        obj = {**shape, "metadata": {**shape["metadata"], "resourceVersion": str(100 + i)}}
        c, _ = w.event(c, WatchEvent(Kind.NODE, kind, obj, at))
    said = [(event, fields) for _, event, fields in log.lines if event.startswith("node.")]
    assert said == [
        ("node.down", {"node": "node-a", "why": "NodeNotReady"}),
        ("node.up", {"node": "node-a", "down_s": 7.5}),
        ("node.down", {"node": "node-b", "why": "NodeNotReady"}),  # Ready Unknown, tainted
    ]
    assert dict(c.node_down) == {"node-b": 10.0}, "a deleted node stays down"
