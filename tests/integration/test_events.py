"""Events as series on the real API server (issue 27, item 9): a storm of decisions costs a
bounded number of writes, nothing is lost from the counts, and the API accepts the series."""

from __future__ import annotations

import datetime as dt

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


def test_the_api_server_selects_the_supervisors_events_by_their_controller(
        api_client: client.ApiClient, namespace: str) -> None:
    # What `status` reads: the kubelet's Events about the workers stay on the server.
    core = client.CoreV1Api(api_client)
    for i in range(3):
        core.create_namespaced_event(namespace, {
            "metadata": {"name": f"w{i}.kubelet"},
            "involvedObject": {"kind": "Pod", "name": f"w{i}", "namespace": namespace},
            "reason": "Started", "message": "Started container worker", "type": "Normal",
            "source": {"component": "kubelet"}, "reportingComponent": "kubelet"})
    regarding = {**REGARDING, "namespace": namespace}
    for i in range(2):
        client.EventsV1Api(api_client).create_namespaced_event(namespace, kube.event_body(
            namespace, eventseries.Write(EventSpec("Warning", "WorkerHung", "Detect",
                                                   f"worker w{i}"), f"launcher-0.{i}"),
            kube.micro_time(dt.datetime.now(dt.UTC)), instance="launcher-0",
            regarding=regarding))
    assert len(kube.list_events(api_client, namespace)) == 5
    mine = kube.list_events(api_client, namespace, controller=kube.REPORTING_CONTROLLER)
    assert sorted(e["note"] for e in mine) == ["worker w0", "worker w1"]
