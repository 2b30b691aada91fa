"""The local control plane is real: API round trips, RBAC, node lifecycle, garbage collection.

Each test proves a property that later supervisor tests rely on, so that those can fail for real.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from localcluster.controlplane import ControlPlane
from localcluster.kubelet import Heartbeats
from tests.helpers import NODE_GRACE_S, wait_for


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "probe"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )


def test_pod_can_be_created_listed_and_watched(core: client.CoreV1Api, namespace: str) -> None:
    listed = core.list_namespaced_pod(namespace, label_selector="app=probe")
    assert listed.items == []
    events: queue.Queue[tuple[str, str]] = queue.Queue()

    def watcher() -> None:
        w = watch.Watch()
        for ev in w.stream(
            core.list_namespaced_pod, namespace, label_selector="app=probe",
            resource_version=listed.metadata.resource_version, timeout_seconds=20,
            _request_timeout=30,
        ):
            events.put((ev["type"], ev["object"].metadata.name))
            if ev["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    core.create_namespaced_pod(namespace, _pod("probe-1"))
    names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    assert names == ["probe-1"]
    assert events.get(timeout=10) == ("ADDED", "probe-1")
    core.delete_namespaced_pod("probe-1", namespace, grace_period_seconds=0)
    seen = []
    while ("DELETED", "probe-1") not in seen:
        seen.append(events.get(timeout=10))
    t.join(timeout=10)


def test_service_account_token_is_bound_by_rbac(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str, tmp_path
) -> None:
    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="pod-lister"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
    ))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="reader-lists-pods"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                  name="pod-lister"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader",
                                       namespace=namespace)],
    ))
    token = core.create_namespaced_service_account_token(
        "reader", namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)),
    ).status.token
    kubeconfig = control_plane.write_token_kubeconfig(tmp_path / "sa.kubeconfig", token, namespace)
    sa_api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        sa_core = client.CoreV1Api(sa_api)
        assert sa_core.list_namespaced_pod(namespace).items == []
        with pytest.raises(ApiException) as denied_node:
            sa_core.delete_node("any-node")
        assert denied_node.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in denied_node.value.body
        with pytest.raises(ApiException) as denied_other_ns:
            sa_core.list_namespaced_pod("default")
        assert denied_other_ns.value.status == 403
    finally:
        sa_api.close()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _create_ready_node(core: client.CoreV1Api, coord: client.CoordinationV1Api, name: str) -> None:
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"kubernetes.io/hostname": name})))
    now = _now()
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "test heartbeat", "lastHeartbeatTime": now.isoformat(),
        "lastTransitionTime": now.isoformat(),
    }]}})
    coord.create_namespaced_lease("kube-node-lease", client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(holder_identity=name, lease_duration_seconds=40,
                                renew_time=now),
    ))


def _ready_status(core: client.CoreV1Api, name: str) -> tuple[str, list[str]]:
    node = core.read_node(name)
    ready = next(c.status for c in node.status.conditions if c.type == "Ready")
    return ready, sorted({t.key for t in node.spec.taints or []})


def test_node_that_stops_renewing_its_lease_goes_not_ready(
    api_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(api_client)
    coord = client.CoordinationV1Api(api_client)
    # Two nodes: with only one (all nodes of the zone unhealthy) the controller enters
    # full-disruption mode and stops taint-based eviction; a healthy peer keeps it normal.
    alive, dying = "node-alive", "node-dying"
    for n in (alive, dying):
        _create_ready_node(core, coord, n)
    renewing = {alive, dying}
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(1.0):
            for n in list(renewing):
                coord.patch_namespaced_lease(n, "kube-node-lease",
                                             {"spec": {"renewTime": _now().isoformat()}})

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        # Renewed leases keep both Ready for well over one grace period.
        time.sleep(NODE_GRACE_S * 1.5)
        assert _ready_status(core, alive) == ("True", [])
        assert _ready_status(core, dying) == ("True", [])

        renewing.discard(dying)
        stopped_at = time.monotonic()
        status, taints = wait_for(
            lambda: (s := _ready_status(core, dying))[0] == "Unknown"
            and "node.kubernetes.io/unreachable" in s[1] and s,
            timeout=NODE_GRACE_S + 10, what=f"{dying} Unknown and tainted unreachable",
        )
        took = time.monotonic() - stopped_at
        assert status == "Unknown"
        assert "node.kubernetes.io/unreachable" in taints
        # Not before the grace period: the controller really waits for the lease to expire.
        assert took >= NODE_GRACE_S - 2, f"marked NotReady after only {took:.1f}s"
        assert _ready_status(core, alive) == ("True", [])
    finally:
        stop.set()
        renewer.join(timeout=5)
        for n in (alive, dying):
            core.delete_node(n)
            coord.delete_namespaced_lease(n, "kube-node-lease")


def test_dependent_is_garbage_collected_when_owner_is_deleted(
    core: client.CoreV1Api, namespace: str
) -> None:
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(
        name="dependent",
        owner_references=[client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)],
    )))
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        names = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items}
        return "dependent" not in names

    # The garbage collector syncs its informers first after start: allow it some time.
    wait_for(dependent_gone, timeout=60, interval=0.5, what="garbage collection of 'dependent'")


def test_scheduler_binds_pods_to_registered_nodes(api_client: client.ApiClient,
                                                  namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    hb = Heartbeats(api_client)
    node = f"{namespace}-sched"
    try:
        hb.register(node)
        core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name="placed"),
            spec=client.V1PodSpec(
                node_selector={"kubernetes.io/hostname": node},
                tolerations=[client.V1Toleration(key="node.kubernetes.io/not-ready",
                                                 operator="Exists")],
                containers=[client.V1Container(name="c", image="busybox")])))
        bound = wait_for(lambda: core.read_namespaced_pod("placed", namespace).spec.node_name,
                         30, what="the scheduler to bind the pod")
        assert bound == node
    finally:
        hb.close()
