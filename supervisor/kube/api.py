"""ADAPTER: building an API client (in-cluster or kubeconfig) and the listers the reflectors
page through."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from supervisor.kube.errors import KubeError
from supervisor.observe import Kind

REPORTING_CONTROLLER = "elastic-supervisor.io/supervisor"
NODE_LEASE_NAMESPACE = "kube-node-lease"
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


# ---- client -------------------------------------------------------------------------------------

def in_cluster_namespace() -> str | None:
    """Return the pod's namespace from the service account mount, if running in a pod."""
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


def kubeconfig_namespace() -> str | None:
    """Return the current kubeconfig context's namespace, if a kubeconfig is readable."""
    try:
        _, current = config.list_kube_config_contexts()
    except (ConfigException, OSError, TypeError, ValueError):
        return None
    return (current or {}).get("context", {}).get("namespace")


def make_api_client(config_file: str | None = None) -> client.ApiClient:
    """Return an ApiClient: in-cluster service account if in a pod, else the kubeconfig.

    urllib3's own retries are switched off: they retry at once, without backoff, underneath
    ours; every retry here is the reflector's or the caller's, jittered and bounded.
    """
    cfg = client.Configuration()
    try:
        if (config_file is None and os.environ.get("KUBERNETES_SERVICE_HOST")
                and SA_NAMESPACE_FILE.exists()):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=config_file, client_configuration=cfg)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        raise KubeError(f"no usable Kubernetes credentials (in-cluster or KUBECONFIG): {e}") from e
    cfg.retries = False
    return _ApiClient(cfg)


class _ApiClient(client.ApiClient):
    """The client's ApiClient, except that a TLS error (urllib3's SSLError: a connection reset
    in the handshake, an API server going down or a proxy dropping us) stays what the client
    means it to be, an ApiException with status 0 (retried): the client wraps it without a
    body and then crashes decoding that body (AttributeError, which would end the run as a bug)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().request(*args, **kwargs)
        except ApiException as e:
            if e.body is None:
                e.body = b""
            raise


def lister(api: client.ApiClient, kind: Kind, namespace: str, selector: str) -> Callable[..., Any]:
    """Return the list function for `kind` (pods: namespaced + selector; nodes: all; leases:
    the node heartbeats in kube-node-lease)."""
    core = client.CoreV1Api(api)
    if kind is Kind.POD:
        def list_pods(**kw: Any) -> Any:
            return core.list_namespaced_pod(namespace, label_selector=selector, **kw)
        return list_pods
    if kind is Kind.SCALE:  # one ConfigMap, named by `selector` (a field selector)
        def list_scale(**kw: Any) -> Any:
            return core.list_namespaced_config_map(namespace, field_selector=selector, **kw)
        return list_scale
    if kind is Kind.LEASE:
        coordination = client.CoordinationV1Api(api)

        def list_leases(**kw: Any) -> Any:
            return coordination.list_namespaced_lease(NODE_LEASE_NAMESPACE, **kw)
        return list_leases
    return core.list_node


