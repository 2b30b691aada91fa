"""The actuator against the real API server: idempotent creates/deletes, state conflicts, 403."""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
from pathlib import Path

from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import hostkeys, kube
from supervisor.actuator import Actuator
from supervisor.decide.script import CreatePod, DeletePod, SaveState
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


def failing_webhook(api_client: client.ApiClient, namespace: str) -> str:
    """A validating webhook for this namespace's pods labelled blocked=yes, at an address where
    nothing listens: the API server answers 500 (failed calling webhook), as for a webhook
    that is down. Returns its name."""
    name = f"down-{namespace}"
    client.AdmissionregistrationV1Api(api_client).create_validating_webhook_configuration({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "down.elastic-supervisor.test",
            "clientConfig": {"url": "https://127.0.0.1:1/validate"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchLabels": {"blocked": "yes"}},
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 1,
            "admissionReviewVersions": ["v1"]}]})
    # The API server takes a new webhook in from its own watch, a moment later: wait until a
    # dry-run create of a blocked pod is refused, so the test sees the webhook, not that race.
    probe = pod_body("probe")
    probe["metadata"]["labels"] = {"blocked": "yes"}
    deadline = time.monotonic() + 30
    while True:
        try:
            client.CoreV1Api(api_client).create_namespaced_pod(namespace, probe, dry_run="All")
        except client.ApiException as e:
            if "failed calling webhook" in str(e.body):
                return name
            raise
        assert time.monotonic() < deadline, "the API server never called the webhook"
        time.sleep(0.1)


def test_a_create_a_failing_webhook_keeps_refusing_blocks_no_other_object(
        api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, pod_body("lost"))
    webhook = failing_webhook(api_client, namespace)
    blocked = pod_body("blocked")
    blocked["metadata"]["labels"] = {"blocked": "yes"}
    act, done = make(api_client, namespace)
    try:
        act.submit(CreatePod(blocked))
        first = done.get(timeout=10)
        assert (first.what, first.name, first.retrying) == ("create", "blocked", True), first
        assert "failed calling webhook" in (first.error or "")
        # Submitted after it: a force delete (a worker on a lost node) and another create.
        act.submit(DeletePod("lost", None, 0))
        act.submit(CreatePod(pod_body("other")))
        later = sorted((r.what, r.name, r.error) for r in (done.get(timeout=10),
                                                           done.get(timeout=10)))
        assert later == [("create", "other", None), ("delete", "lost", None)]
        assert act.pending() == 1  # the blocked create, still retried on its own
        client.AdmissionregistrationV1Api(api_client).delete_validating_webhook_configuration(
            webhook)
        webhook = ""
        last = done.get(timeout=30)
        assert (last.what, last.name, last.error) == ("create", "blocked", None)
    finally:
        act.close()
        if webhook:
            client.AdmissionregistrationV1Api(
                api_client).delete_validating_webhook_configuration(webhook)
    assert sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items
                  if p.metadata.deletion_timestamp is None) == ["blocked", "other"]


def test_nothing_is_written_while_leadership_is_paused_and_nothing_is_given_up(
        api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    leading = threading.Event()
    calls: list[str] = []

    class Counted(kube.Pods):
        def create(self, body):  # type: ignore[no-untyped-def]
            calls.append(body["metadata"]["name"])
            return super().create(body)

    webhook = failing_webhook(api_client, namespace)
    done: queue.Queue[ActionDone] = queue.Queue()
    store = kube.StateStore(api_client, namespace, "job1-supervisor-state", None)
    act = Actuator(Counted(api_client, namespace), store, resource_version=None, writer="a",
                   sink=done.put, backoff_max_s=0.5, may_act=leading.is_set).start()
    blocked = pod_body("blocked")
    blocked["metadata"]["labels"] = {"blocked": "yes"}
    try:
        leading.set()
        act.submit(CreatePod(blocked))
        assert done.get(timeout=10).retrying
        leading.clear()  # the Lease could not be renewed: between two retries of one create
        time.sleep(0.6)
        tried = len(calls)
        act.submit(SaveState({"n": 1}))
        act.submit(CreatePod(pod_body("p1")))
        time.sleep(2)
        assert len(calls) == tried, "a retry was written while not leading"
        assert done.empty() and act.pending() == 3
        assert core.list_namespaced_pod(namespace).items == []
        leading.set()  # renewed again: everything goes through, in order
        results = [done.get(timeout=10) for _ in range(2)]
        assert [(r.what, r.error) for r in results] == [("save", None), ("create", None)]
        leading.clear()  # paused again, then the run ends: close gives up at once
        started = time.monotonic()
        abandoned = act.close(timeout=10)
        assert abandoned == 1 and time.monotonic() - started < 3
    finally:
        act.close()
        client.AdmissionregistrationV1Api(api_client).delete_validating_webhook_configuration(
            webhook)
    assert store.load()[0] == {"n": 1, "writer": "a"}


def keyed(api: client.ApiClient, namespace: str
          ) -> tuple[Actuator, queue.Queue[ActionDone], list[hostkeys.HostKey]]:
    """An actuator that makes each worker's host key (SSH_HOST_KEYS=worker), with the keys it
    made, in order."""
    done: queue.Queue[ActionDone] = queue.Queue()
    keys: list[hostkeys.HostKey] = []

    def keygen(comment: str) -> hostkeys.HostKey:
        keys.append(hostkeys.generate(comment))
        return keys[-1]

    store = kube.StateStore(api, namespace, "job1-supervisor-state", None)
    act = Actuator(kube.Pods(api, namespace), store, resource_version=None, writer="a",
                   sink=done.put, secrets=kube.Secrets(api, namespace), keygen=keygen,
                   backoff_initial_s=0.2, backoff_max_s=0.5).start()
    return act, done, keys


def test_a_worker_gets_its_own_host_key_in_a_secret_that_goes_with_it(
        api_client: client.ApiClient, namespace: str) -> None:
    """SUPERVISOR_SSH_HOST_KEYS=worker: the pod shows its public key, its Secret holds the
    private one and is owned by the pod (the garbage collector deletes it with the pod). A
    Secret that a quota refuses is tried again, without creating the pod twice."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-secrets"}, "spec": {"hard": {"count/secrets": "0"}}})
    act, done, keys = keyed(api_client, namespace)
    try:
        act.submit(CreatePod(pod_body("w1")))
        refused = done.get(timeout=10)
        assert refused.retrying and "exceeded quota" in (refused.error or ""), refused
        pod = core.read_namespaced_pod("w1", namespace)
        core.delete_namespaced_resource_quota("no-secrets", namespace)
        quota_gone = time.monotonic()
        result = done.get(timeout=30)
    finally:
        act.close()
    assert (result.what, result.error, result.note) == ("create", None, "")
    # Where its time went: the pod's call in the first try, the Secret's after the quota went.
    assert result.began_at is not None and result.pod_at is not None
    assert result.started_at is not None
    assert result.started_at <= result.began_at < result.pod_at < quota_gone < result.at
    assert len(keys) == 1, "one key for the pod, whatever the retries"
    again = core.read_namespaced_pod("w1", namespace)
    assert again.metadata.uid == pod.metadata.uid, "the pod was created once"
    assert again.metadata.annotations[hostkeys.ANNOTATION] == keys[0].public
    [volume] = [v for v in again.spec.volumes if v.name == hostkeys.VOLUME]
    name = hostkeys.secret_name("w1", keys[0].public)
    assert volume.secret.secret_name == name
    secret = core.read_namespaced_secret(name, namespace)
    assert base64.b64decode(secret.data["host-key"]).decode() == keys[0].private
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [
        ("Pod", "w1", pod.metadata.uid)]
    core.delete_namespaced_pod("w1", namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not core.list_namespaced_secret(
                namespace, field_selector=f"metadata.name={name}").items:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the Secret outlived its pod by 30 s")


def test_a_pod_made_again_under_its_name_gets_a_secret_the_collector_leaves(
        api_client: client.ApiClient, namespace: str) -> None:
    """plan.py's reschedule deletes a slot's pod that found no node and makes it again under
    the same name. The Secret of the pod before is still there until the garbage collector
    deletes it (held here by a finalizer, as a slow collector would): the new pod's own Secret
    must be another, owned by the new pod and left by the collector. Seen on real nodes: the
    create answered AlreadyExists, the collector then deleted the Secret, and the new pod
    waited for its host key's volume for good."""
    core = client.CoreV1Api(api_client)
    act, done, keys = keyed(api_client, namespace)
    hold = {"metadata": {"finalizers": ["elastic-supervisor.test/hold"]}}
    old_name = ""
    try:
        act.submit(CreatePod(pod_body("w1")))
        assert done.get(timeout=30).error is None
        old = core.read_namespaced_pod("w1", namespace)
        [old_name] = [v.secret.secret_name for v in old.spec.volumes if v.name == hostkeys.VOLUME]
        core.patch_namespaced_secret(old_name, namespace, hold)
        core.delete_namespaced_pod("w1", namespace, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while any(p.metadata.name == "w1" for p in core.list_namespaced_pod(namespace).items):
            assert time.monotonic() < deadline, "the pod was not gone in 30 s"
            time.sleep(0.1)
        act.submit(CreatePod(pod_body("w1")))
        assert done.get(timeout=30).error is None
    finally:
        act.close()
        if old_name:
            core.patch_namespaced_secret(old_name, namespace, {"metadata": {"finalizers": None}})
    new = core.read_namespaced_pod("w1", namespace)
    assert new.metadata.uid != old.metadata.uid and len(keys) == 2
    assert new.metadata.annotations[hostkeys.ANNOTATION] == keys[1].public
    [new_name] = [v.secret.secret_name for v in new.spec.volumes if v.name == hostkeys.VOLUME]
    assert new_name != old_name
    deadline = time.monotonic() + 30  # the pod before's Secret goes (its owner is gone) ...
    while core.list_namespaced_secret(
            namespace, field_selector=f"metadata.name={old_name}").items:
        assert time.monotonic() < deadline, "the Secret of the pod before outlived it by 30 s"
        time.sleep(0.2)
    time.sleep(2)  # ... and the new pod's stays, with the new key, owned by the new pod
    secret = core.read_namespaced_secret(new_name, namespace)
    assert base64.b64decode(secret.data["host-key"]).decode() == keys[1].private
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [
        ("Pod", "w1", new.metadata.uid)]
