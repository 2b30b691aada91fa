"""What a real-node test's failure says of each worker pod (localcluster/job.py `pod_line`):
shapes as the API returned them for a pod the scheduler found no node for and one whose Secret
volume never mounted (CI, 2026-11-30: the log's tail held only rank 0's steps)."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster.job import pod_line

UNSCHEDULABLE: dict[str, Any] = {
    "metadata": {"name": "elastic-train-w0-10"}, "spec": {},
    "status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match pod "
                   "affinity/anti-affinity rules."}]}}
CREATING: dict[str, Any] = {
    "metadata": {"name": "elastic-train-w0-10", "deletionTimestamp": None},
    "spec": {"nodeName": "es-node-1"},
    "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "worker", "ready": False, "state": {
            "waiting": {"reason": "ContainerCreating"}}}]}}
RUNNING: dict[str, Any] = {
    "metadata": {"name": "elastic-train-w1-2", "deletionTimestamp": "2026-11-30T05:42:31Z"},
    "spec": {"nodeName": "es-node-2"},
    "status": {"phase": "Running", "containerStatuses": [{"name": "worker", "state": {
        "running": {"startedAt": "2026-11-30T05:41:00Z"}}}]}}


@pytest.mark.parametrize(("pod", "line"), [
    (UNSCHEDULABLE, "elastic-train-w0-10 on (no node): Pending; Unschedulable: 0/3 nodes are "
                    "available: 1 Insufficient cpu, 2 node(s) didn't match pod "
                    "affinity/anti-affinity rules."),
    (CREATING, "elastic-train-w0-10 on es-node-1: Pending; worker ContainerCreating: "),
    (RUNNING, "elastic-train-w1-2 on es-node-2: Running deleting"),
], ids=["unschedulable", "container creating", "running, deleting"])
def test_a_pod_line_says_where_it_is_and_why_it_waits(pod: dict[str, Any], line: str) -> None:
    assert pod_line(pod["metadata"]["name"], pod) == line


def test_a_long_message_is_cut() -> None:
    pod = {**UNSCHEDULABLE, "status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "x" * 500}]}}
    assert pod_line("p", pod) == "p on (no node): Pending; Unschedulable: " + "x" * 200
