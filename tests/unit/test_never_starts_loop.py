"""A worker that never starts, driven through the loop (loop.Supervisor) with the watch
events the reflectors hand it: the view keeps the kubelet's waiting reason and message
(observe.slim), the loop's own clock runs past SUPERVISOR_WORKER_START_TIMEOUT_SECONDS, and the
actuator is asked to delete the pod and create its replacement, with a WorkerRestarting Event
that quotes the kubelet. Before the bound: nothing (issue 39, item 7)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.config import parse_config
from supervisor.decide import fleet
from supervisor.decide.script import CreatePod, DeletePod, SaveState
from supervisor.loop import Supervisor
from supervisor.metrics import make_metrics
from supervisor.model import ActionDone, EventSpec, SourceState, WatchEvent
from supervisor.observe import EventType, Kind, slim
from supervisor.workers import LABEL_INCARNATION, LABEL_JOB, LABEL_ROLE, LABEL_SLOT
from tests.helpers import Log
from tests.unit import shapes

TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels: {app: x}
spec:
  restartPolicy: Never
  containers:
  - name: worker
    image: worker:1
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def loop(clock: Clock, ops: list[Any], events: list[EventSpec]) -> Supervisor:
    cfg = parse_config({"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "default",
                        "SUPERVISOR_WORKER_SELECTOR": "app=x", "SUPERVISOR_NP": "2",
                        "SUPERVISOR_MIN_NP": "1", "SUPERVISOR_MAX_NP": "2",
                        "SUPERVISOR_WORKER_TEMPLATE": "/etc/edl/worker.yaml",
                        "SUPERVISOR_WORKER_HOOK": "false"},
                       read_text=lambda _: TEMPLATE)
    return Supervisor(cfg, log=Log(), metrics=make_metrics(), events=events.append,
                      start_child=None, base_env={}, act=ops.append,  # type: ignore[arg-type]
                      kill_ssh_clients=None, count_ssh_clients=None,  # type: ignore[arg-type]
                      workers=fleet.initial(2), clock=clock, wall=lambda: 1.7e9 + clock.now)


def labelled(p: dict[str, Any], slot: int) -> dict[str, Any]:
    p["metadata"]["labels"] = {"app": "x", LABEL_JOB: "job1", LABEL_ROLE: "worker",
                               LABEL_SLOT: str(slot), LABEL_INCARNATION: "1"}
    return p


def test_a_worker_stuck_after_a_kube_apiserver_restart_is_replaced_after_the_bound() -> None:
    clock, ops, events = Clock(), [], []
    sup = loop(clock, ops, events)
    stuck = labelled(shapes.not_started("config_error_no_relationship", "job1-w0-1",
                                        node="node-a"), 0)
    runs = labelled(shapes.pod("job1-w1-1", ip="10.1.0.11", node="node-b"), 1)
    items: list[Any] = [
        WatchEvent(Kind.NODE, EventType.ADDED, slim(Kind.NODE, shapes.node(n)), clock.now)
        for n in ("node-a", "node-b")]
    items += [WatchEvent(Kind.POD, EventType.ADDED, slim(Kind.POD, p), clock.now)
              for p in (stuck, runs)]
    items += [SourceState(k, clock.now, synced=True) for k in (Kind.POD, Kind.NODE)]
    sup._apply(items, clock.now)
    sup._manage(clock.now)
    before = [op for op in ops if isinstance(op, DeletePod | CreatePod)]
    assert before == [], "adopted as they are"
    clock.now += 599.0
    sup._manage(clock.now)
    assert [op for op in ops if isinstance(op, DeletePod | CreatePod)] == []
    clock.now += 1.0
    sup._manage(clock.now)
    acts = [op for op in ops if isinstance(op, DeletePod | CreatePod | SaveState)]
    assert [type(op).__name__ for op in acts[-3:]] == ["DeletePod", "SaveState", "CreatePod"]
    assert (acts[-3].name, acts[-3].grace_s) == ("job1-w0-1", None)  # type: ignore[union-attr]
    created = acts[-1].body  # type: ignore[union-attr]
    assert created["metadata"]["name"] == "job1-w0-2"
    preferred = created["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchFields"][0]["values"] == ["node-a"]
    restarting = [e for e in events if e.reason == "WorkerRestarting"]
    assert len(restarting) == 1 and "no relationship found between node" in restarting[0].note
    assert "NotStarted" in restarting[0].note and "not counted" in restarting[0].note
    assert sup.core.fleet is not None and sup.core.fleet.ledger.total == 0


def test_a_replacement_placed_ahead_that_cannot_be_created_keeps_the_worker() -> None:
    """A create refused for good (not by admission, which backs off) is not asked for again
    each pass: the cordoned worker stays, and the slot is not dropped."""
    clock, ops, events = Clock(), [], []
    sup = loop(clock, ops, events)
    sup.core = replace(sup.core, moving={"job1-w0-1": "job1-w0-2"})
    sup._apply([ActionDone("create", "job1-w0-2", clock.now, error="the pod is invalid")],
               clock.now)
    assert sup.core.staying == {"job1-w0-1"}
    assert sup.core.fleet == fleet.initial(2), "no slot dropped"
    assert [e.reason for e in events] == ["WorkerStays"]
