"""Node blips are not node loss, and many nodes down together are held (issue 15, item 5).

On the real control plane: a kubelet stand-in (localcluster.kubelet.Heartbeats) that posts
Ready=False and is back a second later, as a kubelet does after a PLEG hiccup; nodes whose
Leases stop being renewed, marked NotReady by the real node-lifecycle controller.
"""

from __future__ import annotations

import time

from kubernetes import client

from localcluster.kubelet import ready_condition
from tests.helpers import NODE_GRACE_S, wait_for
from tests.integration.harness import Job, event_reasons, wait_reason
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    running,
    supervisor_fixture,
)


def node_ready(job: Job, node: str) -> str | None:
    cond = next((c for c in job.core.read_node(node).status.conditions or ()
                 if c.type == "Ready"), None)
    return cond.status if cond else None


def test_one_second_ready_blips_fail_no_worker_with_the_default_grace(
        job: Job, supervisor, api_client: client.ApiClient, namespace: str) -> None:
    job.node("n1"), job.node("n2")
    sup = supervisor()  # SUPERVISOR_NODE_GRACE_SECONDS left at its default
    names = running(job, 2)
    pods = job.pods()
    sup.wait_content([job.line(n) for n in names])
    node = pods[names[0]]["spec"]["nodeName"]
    for _ in range(6):
        # The kubelet posts Ready=False; the stand-in posts Ready=True again within a second.
        job.core.patch_node_status(node, {"status": {"conditions": [ready_condition(
            "False", "KubeletNotReady")]}})
        wait_for(lambda: node_ready(job, node) == "True", 5, 0.1, what=f"{node} Ready again")
        time.sleep(1)
    time.sleep(3)
    removed = [e for e in sup.logs() if e.get("event") == "workers.changed" and e.get("removed")]
    assert removed, "the blips were seen: the host left the discovery file while NotReady"
    sup.wait_content([job.line(n) for n in names])
    assert [e for e in sup.logs() if e.get("event") == "worker.failed"] == []
    assert sorted(job.pods()) == sorted(pods), "nothing replaced"
    assert "WorkerRestarting" not in event_reasons(api_client, namespace)


def test_every_node_of_the_job_down_together_is_held_then_released(
        job: Job, supervisor, api_client: client.ApiClient, namespace: str) -> None:
    for n in ("n1", "n2", "n3"):
        job.node(n)
    # A grace longer than the spread between the nodes' NotReady: the node controller marks
    # them in its passes (1 s apart here), and on a loaded machine one node went NotReady more
    # than 1 s before the other, so its worker was lost before the brake could hold both.
    sup = supervisor(SUPERVISOR_NP="3", SUPERVISOR_NODE_GRACE_SECONDS="3")
    names = running(job, 3)
    pods = job.pods()
    used = sorted({pods[n]["spec"]["nodeName"] for n in names})
    assert len(used) >= 2, f"the scheduler spreads workers without requests: {used}"
    for node in used:  # their kubelets stop posting (a switch, the control plane's network)
        job.heartbeats.silence(node)
    held = sup.wait_log("node.disruption", timeout=NODE_GRACE_S + 20)
    assert held["nodes"] == used
    time.sleep(6)  # well past the 3 s grace
    assert [e for e in sup.logs() if e.get("event") == "worker.failed"] == []
    assert sorted(job.pods()) == sorted(pods), "no pod force-deleted or replaced"
    assert not any(p["metadata"].get("deletionTimestamp") for p in job.pods().values())
    wait_reason(api_client, namespace, "NodeDisruption")
    for node in used:
        job.heartbeats.resume(node)
    sup.wait_log("node.disruption_over", timeout=20)
    for name in names:  # the kubelets' status sync: the node controller had marked them NotReady
        job.start(name)
    sup.wait_content([job.line(n) for n in names], timeout=20)
    assert [e for e in sup.logs() if e.get("event") == "worker.failed"] == []
    assert sorted(job.live()) == sorted(names)
    wait_reason(api_client, namespace, "NodeDisruptionOver")


def test_one_node_of_three_lost_is_still_node_loss(job: Job, supervisor) -> None:
    for n in ("n1", "n2", "n3"):
        job.node(n)
    sup = supervisor(SUPERVISOR_NP="3", SUPERVISOR_NODE_GRACE_SECONDS="1")
    names = running(job, 3)
    pods = job.pods()
    victim = names[0]
    job.heartbeats.silence(pods[victim]["spec"]["nodeName"])
    decision = sup.wait_log("worker.failed", timeout=NODE_GRACE_S + 25, pod=victim)
    assert (decision["cause"], decision["action"]) == ("NodeNotReady", "Restart")
    assert not [e for e in sup.logs() if e.get("event") == "node.disruption"]
