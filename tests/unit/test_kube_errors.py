"""The API boundary's error mapping (supervisor/kube/errors.py map_error): which failures are
retried with backoff and which end the run, from ApiException shapes the client raises."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from supervisor import kube


def api_error(status: int, message: str = "", reason: str = "") -> ApiException:
    e = ApiException(status=status, reason="Reason")
    e.body = json.dumps({"kind": "Status", "message": message, "reason": reason}) if (
        message or reason) else None
    return e


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    pytest.param(429, kube.KubeError, True, id="429 too many requests: back off, retry"),
    pytest.param(500, kube.KubeError, True, id="500: retry"),
    pytest.param(503, kube.KubeError, True, id="503 apiserver restarting: retry"),
    pytest.param(400, kube.KubeError, False, id="400 bad request: never helps"),
    pytest.param(422, kube.KubeError, False, id="422 invalid object: never helps"),
    pytest.param(403, kube.Refused, True, id="403 without an RBAC denial: admission, wait"),
    pytest.param(409, kube.Conflict, True, id="409: a conflict of its own"),
    pytest.param(410, kube.Gone, None, id="410: relist"),
    pytest.param(404, kube.NotFound, None, id="404: gone"),
])
def test_api_errors_map_to_retryable_or_fatal(status: int, kind: type, retryable: bool | None
                                              ) -> None:
    err = kube.map_error(api_error(status, "pods is forbidden: cannot create"), "create pod w1")
    assert type(err) is kind and err.status == status
    assert str(err).startswith("create pod w1: ")
    if retryable is not None:
        assert err.retryable is retryable


def test_the_status_message_is_kept_and_a_connection_error_is_retryable() -> None:
    err = kube.map_error(api_error(403, 'pods is forbidden: User "sa" cannot create'), "create")
    assert 'User "sa" cannot create' in str(err)
    refused = kube.map_error(ConnectionRefusedError("connection refused"), "list pods")
    assert refused.retryable and "ConnectionRefusedError" in str(refused)


# Status messages as the real kube-apiserver 1.34 sends them (captured from the integration
# tests: tests/integration/test_admission.py, test_manifests.py, test_ownership.py).
DENIALS = [
    pytest.param('pods is forbidden: User "system:serviceaccount:t-1:sup" cannot create '
                 'resource "pods" in API group "" in the namespace "t-1"', kube.Forbidden,
                 id="RBAC: our own verb is missing: fatal"),
    pytest.param('pods "elastic-train-w0-1" is forbidden: cannot set blockOwnerDeletion if an '
                 "ownerReference refers to a resource you can't set finalizers on: , <nil>",
                 kube.Forbidden, id="OwnerReferencesPermissionEnforcement: our permission"),
    pytest.param('pods "job1-w0-2" is forbidden: exceeded quota: pods, requested: pods=1, used: '
                 "pods=1, limited: pods=1", kube.Refused, id="ResourceQuota: wait"),
    pytest.param('pods "job1-w0-1" is forbidden: violates PodSecurity "restricted:latest": '
                 "allowPrivilegeEscalation != false (container \"worker\" must set "
                 "securityContext.allowPrivilegeEscalation=false)", kube.Refused,
                 id="PodSecurity: wait"),
    pytest.param('pods "w" is forbidden: maximum cpu usage per Container is 500m, but limit '
                 "is 1", kube.Refused, id="LimitRange: wait"),
    pytest.param('pods "w" is forbidden: no PriorityClass with name preemptible-pc was found',
                 kube.Refused, id="a PriorityClass deleted with another job: wait"),
]


@pytest.mark.parametrize(("message", "kind"), DENIALS)
def test_only_a_denial_of_our_own_verbs_is_permanent(message: str, kind: type) -> None:
    err = kube.map_error(api_error(403, message, "Forbidden"), "create pod w")
    assert type(err) is kind
    assert err.retryable is (kind is kube.Refused)
    assert err.detail == message


def test_already_exists_is_told_from_a_conflict() -> None:
    exists = kube.map_error(api_error(409, 'pods "w" already exists', "AlreadyExists"), "create")
    busy = kube.map_error(api_error(409, 'Operation cannot be fulfilled on resourcequotas "q": '
                                         "the object has been modified", "Conflict"), "create")
    assert type(exists) is kube.AlreadyExists and isinstance(exists, kube.Conflict)
    assert type(busy) is kube.Conflict and busy.retryable
