"""starts.stuck: a bound worker pod that has not started, the kubelet's reason, and whose
fault it is (the node's, the template's, or not said), from the kubelet's container statuses
(tests/unit/shapes/pod_waiting_reasons.json)."""

from __future__ import annotations

import copy

import pytest

from supervisor.decide.starts import Fault, Stuck, stuck
from supervisor.observe import Kind, slim
from tests.unit import shapes

NODE, TEMPLATE, UNKNOWN = Fault.NODE, Fault.TEMPLATE, Fault.UNKNOWN


@pytest.mark.parametrize(("variant", "container", "reason", "fault"), [
    pytest.param("config_error_no_relationship", "worker", "CreateContainerConfigError", NODE,
                 id="the node authorizer lost the pod's edge (kube-apiserver restarted): node"),
    pytest.param("config_error_not_registered", "worker", "CreateContainerConfigError", NODE,
                 id="the kubelet's Secret cache has not registered the pod: node"),
    pytest.param("err_image_pull_disk_full", "worker", "ErrImagePull", NODE,
                 id="the image does not fit on the node's disk: node"),
    pytest.param("config_error_secret_not_found", "worker", "CreateContainerConfigError",
                 TEMPLATE, id="a Secret the template names is missing: template"),
    pytest.param("config_error_missing_key", "worker", "CreateContainerConfigError", TEMPLATE,
                 id="a key of the Secret is missing: template"),
    pytest.param("config_error_run_as_non_root", "worker", "CreateContainerConfigError",
                 TEMPLATE, id="runAsNonRoot against the image's root user: template"),
    pytest.param("err_image_pull_denied", "worker", "ErrImagePull", TEMPLATE,
                 id="the image does not exist: template"),
    pytest.param("image_pull_backoff", "worker", "ImagePullBackOff", TEMPLATE,
                 id="the image pull backs off: template"),
    pytest.param("init_image_pull_backoff", "fetch", "ImagePullBackOff", TEMPLATE,
                 id="an init container's image does not pull: template, named"),
    pytest.param("container_creating", "worker", "ContainerCreating", UNKNOWN,
                 id="ContainerCreating (mounts, sandbox: the kubelet's Events say): unknown"),
    pytest.param("create_container_error_name_reserved", "worker", "CreateContainerError",
                 UNKNOWN, id="the runtime could not create the container: unknown"),
    pytest.param("no_container_status", None, "NoContainerStatus", UNKNOWN,
                 id="the kubelet never reported on the pod: unknown"),
])
def test_a_bound_pod_that_has_not_started_is_judged_by_the_kubelets_reason(
        variant: str, container: str | None, reason: str, fault: Fault) -> None:
    pod = shapes.not_started(variant)
    found = stuck(pod)
    assert found is not None
    assert (found.container, found.reason, found.fault) == (container, reason, fault)
    statuses = [*pod["status"].get("initContainerStatuses", ()),
                *pod["status"].get("containerStatuses", ())]
    message = next((cs["state"]["waiting"].get("message", "") for cs in statuses
                    if cs["name"] == container), "")
    assert found.message == message, "the kubelet's message, as it said it"
    # What the view keeps of the pod (observe.slim) judges the same.
    assert stuck(slim(Kind.POD, pod)) == found


def test_the_event_quotes_the_kubelet() -> None:
    found = stuck(shapes.not_started("config_error_secret_not_found"))
    assert found == Stuck("worker", "CreateContainerConfigError",
                          'secret "job1-hook-key" not found', TEMPLATE,
                          "the container's configuration")
    assert found.said() == ('container worker: CreateContainerConfigError: '
                            'secret "job1-hook-key" not found')


def _running() -> dict:
    return shapes.pod("job1-w0-1", node="node-a")


def _unbound() -> dict:
    p = shapes.not_started("container_creating")
    p["spec"].pop("nodeName")
    p["status"].pop("containerStatuses")
    return p


def _deleting() -> dict:
    p = shapes.not_started("container_creating")
    p["metadata"]["deletionTimestamp"] = "2026-11-21T12:20:00Z"
    return p


@pytest.mark.parametrize("pod", [
    pytest.param(_running(), id="running"),
    pytest.param(shapes.not_started("init_running"), id="an init container runs: under way"),
    pytest.param(_unbound(), id="not bound to a node: the scheduler's"),
    pytest.param(_deleting(), id="being deleted"),
])
def test_a_pod_that_runs_is_unbound_or_goes_is_not_stuck(pod: dict) -> None:
    assert stuck(pod) is None


def test_a_long_message_is_cut_short_in_the_view() -> None:
    pod = shapes.not_started("config_error_secret_not_found")
    pod = copy.deepcopy(pod)
    pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] = "x" * 5000
    found = stuck(slim(Kind.POD, pod))
    assert found is not None and len(found.message) == 400
