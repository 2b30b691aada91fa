"""The persisted state on the real API server: optimistic concurrency, owner, damage, RBAC."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from supervisor import kube
from supervisor.decide.policy import Ledger, ledger_from_dict, ledger_to_dict
from tests.integration.harness import service_account_kubeconfig
from tests.unit.test_state_codec import big_state


@pytest.fixture
def api(control_plane: ControlPlane):
    a = kube.make_api_client(str(control_plane.kubeconfig))
    yield a
    a.close()


def test_save_load_and_conflicts(api: client.ApiClient, core: client.CoreV1Api,
                                 namespace: str) -> None:
    launcher = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "job1-launcher"},
        "spec": {"containers": [{"name": "l", "image": "l"}]}})
    owner = kube.pod_reference(api, namespace, "job1-launcher")
    store = kube.StateStore(api, namespace, "job1-supervisor-state", owner)
    assert store.load() == (None, None)

    ledger = Ledger(total=2, per_slot={"0": 2}, recent=(1.0, 2.0), last_replaced={"0": 2.0},
                    streak={"0": 2})
    rv1 = store.save(ledger_to_dict(ledger), None)
    state, rv = store.load()
    assert rv == rv1 and ledger_from_dict(state) == ledger
    cm = core.read_namespaced_config_map("job1-supervisor-state", namespace)
    assert [(o.kind, o.name, o.uid) for o in cm.metadata.owner_references] == [
        ("Pod", "job1-launcher", launcher.metadata.uid)]

    with pytest.raises(kube.Conflict):
        store.save(ledger_to_dict(Ledger()), None)  # someone created it already
    rv2 = store.save(ledger_to_dict(Ledger(total=3)), rv1)
    with pytest.raises(kube.Conflict):
        store.save(ledger_to_dict(Ledger()), rv1)  # a stale writer loses, nothing overwritten
    state, rv = store.load()
    assert rv == rv2 and ledger_from_dict(state).total == 3


def test_a_large_state_is_stored_compressed_and_a_small_one_plain_again(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    """10,000 slots (tests/unit/test_state_codec.py's shape) go in one ConfigMap the API server
    takes; a later small state replaces the compressed key, never sits beside it."""
    store = kube.StateStore(api, namespace, "job1-supervisor-state", None)
    big = big_state()
    rv = store.save(big, None)
    cm = core.read_namespaced_config_map("job1-supervisor-state", namespace)
    assert cm.data is None and list(cm.binary_data) == ["state.json.gz"]
    assert store.load() == (big, rv)
    small = {"version": 1, "slots": {}}
    rv = store.save(small, rv)
    cm = core.read_namespaced_config_map("job1-supervisor-state", namespace)
    assert cm.binary_data is None and list(cm.data) == ["state.json"]
    assert store.load() == (small, rv)


@pytest.mark.parametrize(("text", "said"), [
    pytest.param("{oops", r"state\.json is not JSON", id="not JSON"),
    pytest.param("[1, 2]", r"state\.json is not a JSON object \(an array", id="a list body"),
    pytest.param('{"total": Infinity}', r"state\.json is not JSON \(Infinity is not a JSON "
                 "number", id="Infinity"),
])
def test_a_damaged_state_is_reported_not_reset(api: client.ApiClient, core: client.CoreV1Api,
                                                namespace: str, text: str, said: str) -> None:
    core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "job1-supervisor-state"}, "data": {"state.json": text}})
    with pytest.raises(kube.Damaged, match=said) as err:
        kube.StateStore(api, namespace, "job1-supervisor-state", None).load()
    assert not err.value.retryable


def test_a_missing_permission_is_named(control_plane: ControlPlane, core: client.CoreV1Api,
                                       api_client: client.ApiClient, namespace: str,
                                       tmp_path: Path) -> None:
    kc = service_account_kubeconfig(control_plane, api_client, namespace, [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        tmp_path / "sa.kubeconfig")
    sa_api = kube.make_api_client(str(kc))
    try:
        store = kube.StateStore(sa_api, namespace, "job1-supervisor-state", None)
        assert store.load() == (None, None)
        with pytest.raises(kube.Forbidden) as err:
            store.save({"version": 1}, None)
        assert not err.value.retryable
        assert 'cannot create resource "configmaps"' in str(err.value)
    finally:
        sa_api.close()
