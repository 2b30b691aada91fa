"""The actuator against the real API server: idempotent creates/deletes, state conflicts, 403."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import kube
from supervisor.actuator import Actuator, CreatePod, DeletePod, SaveState
from supervisor.model import ActionDone
from tests.integration.harness import service_account_kubeconfig


def pod_body(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def make(api: client.ApiClient, namespace: str, writer: str = "a",
         rv: str | None = None) -> tuple[Actuator, queue.Queue[ActionDone]]:
    done: queue.Queue[ActionDone] = queue.Queue()
    store = kube.StateStore(api, namespace, "job1-supervisor-state", None)
    act = Actuator(kube.Pods(api, namespace), store, resource_version=rv, writer=writer,
                   sink=done.put).start()
    return act, done


def test_create_and_delete_are_idempotent(api_client: client.ApiClient, namespace: str) -> None:
    act, done = make(api_client, namespace)
    try:
        act.submit(CreatePod(pod_body("p1")))
        act.submit(CreatePod(pod_body("p1")))
        act.submit(DeletePod("p1", None, 0))
        act.submit(DeletePod("p1", None, 0))
        results = [done.get(timeout=10) for _ in range(4)]
    finally:
        act.close()
    assert [(r.what, r.error, r.note) for r in results] == [
        ("create", None, ""), ("create", None, "already exists"),
        ("delete", None, ""), ("delete", None, "already gone")]


def test_state_written_by_another_supervisor_is_fatal_never_overwritten(
        api_client: client.ApiClient, namespace: str) -> None:
    act, done = make(api_client, namespace, writer="a")
    other = kube.StateStore(api_client, namespace, "job1-supervisor-state", None)
    try:
        act.submit(SaveState({"n": 1}))
        assert done.get(timeout=10).error is None
        stored, rv = other.load()
        assert stored == {"n": 1, "writer": "a"}
        other.save({"n": 99, "writer": "b"}, rv)
        act.submit(SaveState({"n": 2}))
        act.submit(CreatePod(pod_body("p1")))  # behind the fatal save: must never run
        result = done.get(timeout=10)
        time.sleep(1)
    finally:
        act.close()
    assert result.fatal and "written by 'b'" in (result.error or "")
    assert other.load()[0] == {"n": 99, "writer": "b"}
    assert done.empty()
    assert client.CoreV1Api(api_client).list_namespaced_pod(namespace).items == []


def test_a_conflict_with_our_own_lost_write_is_retried(api_client: client.ApiClient,
                                                        namespace: str) -> None:
    act, done = make(api_client, namespace, writer="a")
    store = kube.StateStore(api_client, namespace, "job1-supervisor-state", None)
    try:
        act.submit(SaveState({"n": 1}))
        assert done.get(timeout=10).error is None
        # Our write landed but its answer was lost: the stored version moved on, still ours.
        _, rv = store.load()
        store.save({"n": 1, "writer": "a"}, rv)
        act.submit(SaveState({"n": 2}))
        result = done.get(timeout=10)
    finally:
        act.close()
    assert (result.what, result.error) == ("save", None)
    assert store.load()[0] == {"n": 2, "writer": "a"}


def test_forbidden_create_is_fatal_and_names_the_permission(
        control_plane: ControlPlane, api_client: client.ApiClient, namespace: str,
        tmp_path: Path) -> None:
    kubeconfig = service_account_kubeconfig(control_plane, api_client, namespace, [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        tmp_path / "sa.kubeconfig")
    limited = kube.make_api_client(str(kubeconfig))
    act, done = make(limited, namespace)
    try:
        act.submit(CreatePod(pod_body("p1")))
        result = done.get(timeout=10)
    finally:
        act.close()
        limited.close()
    assert result.fatal
    assert 'cannot create resource "pods"' in (result.error or "")


def test_a_state_save_that_fails_for_good_stops_the_operations_queued_behind_it(
        api_client: client.ApiClient, namespace: str) -> None:
    # Someone made the state immutable: every update is refused (422) and retrying never helps.
    # The pod behind the save belongs to an incarnation the state does not record: never create
    # it.
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "job1-supervisor-state"}, "immutable": True,
        "data": {"state.json": json.dumps({"n": 0, "writer": "a"})}})
    _, rv = kube.StateStore(api_client, namespace, "job1-supervisor-state", None).load()
    act, done = make(api_client, namespace, writer="a", rv=rv)
    try:
        act.submit(SaveState({"n": 1}))
        act.submit(CreatePod(pod_body("p1")))
        act.submit(DeletePod("p0", None, 0))
        save = done.get(timeout=10)
        time.sleep(1)
    finally:
        abandoned = act.close()
    assert (save.what, save.fatal) == ("save", True), save
    assert "immutable" in (save.error or "")
    assert done.empty(), done.get_nowait()
    assert abandoned == 2
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == []
