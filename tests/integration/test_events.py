"""Events as series on the real API server (issue 27, item 9): a storm of decisions costs a
bounded number of writes, nothing is lost from the counts, and the API accepts the series."""

from __future__ import annotations

from kubernetes import client

from supervisor import eventseries, kube
from supervisor.model import EventSpec

REGARDING = {"apiVersion": "v1", "kind": "Pod", "name": "launcher", "namespace": "x"}


def test_a_storm_of_decisions_becomes_a_few_events_with_series(api_client: client.ApiClient,
                                                               namespace: str) -> None:
    errors: list[kube.KubeError] = []
    rec = kube.EventRecorder(api_client, namespace, regarding={**REGARDING,
                                                               "namespace": namespace},
                             instance="launcher-0", on_error=errors.append)
    flips = 300
    for i in range(flips):  # a Ready flip storm: each changes the file
        rec.record(EventSpec("Normal", "WorkersChanged", "Publish", f"hosts: -10.0.{i}.1"))
    for _ in range(20):
        rec.record(EventSpec("Warning", "WorkerRestarting", "Replace", "worker w-0: 137"))
    rec.close(timeout=30)
    assert errors == []
    events = kube.list_events(api_client, namespace)
    count = {e["note"]: (e.get("series") or {}).get("count", 1) for e in events}
    assert len(events) == eventseries.AGGREGATE_AFTER + 2, sorted(count)
    assert count["worker w-0: 137"] == 20
    combined = [n for n in count if n.startswith(eventseries.COMBINED)]
    first = eventseries.AGGREGATE_AFTER  # the first note past the ten with their own Event
    assert combined == [eventseries.COMBINED + f"hosts: -10.0.{first}.1"], combined
    assert sum(c for n, c in count.items() if n.startswith(("hosts", "(combined"))) == flips
    assert rec.posted + rec.updated < 20, (rec.posted, rec.updated)
