"""The API boundary's error mapping (supervisor/kube.py map_error): which failures are retried
with backoff and which end the run, from ApiException shapes the client raises."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from supervisor import kube


def api_error(status: int, message: str = "") -> ApiException:
    e = ApiException(status=status, reason="Reason")
    e.body = json.dumps({"kind": "Status", "message": message}) if message else None
    return e


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    pytest.param(429, kube.KubeError, True, id="429 too many requests: back off, retry"),
    pytest.param(500, kube.KubeError, True, id="500: retry"),
    pytest.param(503, kube.KubeError, True, id="503 apiserver restarting: retry"),
    pytest.param(400, kube.KubeError, False, id="400 bad request: never helps"),
    pytest.param(422, kube.KubeError, False, id="422 invalid object: never helps"),
    pytest.param(403, kube.Forbidden, False, id="403: fatal, names the permission"),
    pytest.param(409, kube.Conflict, None, id="409: a conflict of its own"),
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
