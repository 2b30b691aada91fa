"""ADAPTER: the only package importing the Kubernetes client (its modules: errors, api,
reflector, events, objects; their public names are this package's).

Owns: building an API client (in-cluster or kubeconfig), the `Reflector` (list + watch with
paging, bookmarks, resume from the last resourceVersion, relist-and-diff on 410 Gone, jittered
exponential backoff, a client read timeout), the `EventRecorder` (events.k8s.io/v1 Events posted
from a background thread), the state ConfigMap, worker pods and the leader Lease, and the
mapping of client errors to our own `KubeError`s: an RBAC denial of our own verbs (`Forbidden`)
is permanent, an admission refusal of an object (`Refused`: quota, LimitRange, PodSecurity) is
not. Every call but a watch has a client timeout (connect and read), so a connection that
stalls mid-request is given up instead of holding the caller forever.

Objects cross this boundary as API-shaped dicts (camelCase JSON), never client model classes:
lists and watches are read with `_preload_content=False` and parsed with `json`, which is also
much cheaper than the client's model deserialisation at 1000 pods. Reflector threads never
block on their consumer: they hand every item to a non-blocking `sink` (a queue put).
"""

from __future__ import annotations

from supervisor.kube.api import (
    REPORTING_CONTROLLER,
    in_cluster_namespace,
    kubeconfig_namespace,
    lister,
    make_api_client,
)
from supervisor.kube.errors import (
    MIN_WINDOW_S,
    AlreadyExists,
    Conflict,
    Damaged,
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    NotLeading,
    Refused,
    map_error,
    write_timeout,
)
from supervisor.kube.events import (
    EventRecorder,
    event_body,
    micro_time,
    series_patch,
)
from supervisor.kube.objects import (
    INFLATED_MAX_BYTES,
    PLAIN_MAX_BYTES,
    Budgets,
    Leases,
    Pods,
    Secrets,
    StateStore,
    create_config_map,
    decode_state,
    drop_connections,
    encode_state,
    list_events,
    list_pods,
    pod_reference,
    read_job,
    read_pod,
    refs_of,
    state_text,
    stored_text,
)
from supervisor.kube.reflector import (
    Backoff,
    Reflector,
    WatchSettings,
)

__all__ = [
    "INFLATED_MAX_BYTES",
    "MIN_WINDOW_S",
    "PLAIN_MAX_BYTES",
    "REPORTING_CONTROLLER",
    "AlreadyExists",
    "Backoff",
    "Budgets",
    "Conflict",
    "Damaged",
    "EventRecorder",
    "Forbidden",
    "Gone",
    "KubeError",
    "Leases",
    "NotFound",
    "NotLeading",
    "Pods",
    "Reflector",
    "Refused",
    "Secrets",
    "StateStore",
    "WatchSettings",
    "create_config_map",
    "decode_state",
    "drop_connections",
    "encode_state",
    "event_body",
    "in_cluster_namespace",
    "kubeconfig_namespace",
    "list_events",
    "list_pods",
    "lister",
    "make_api_client",
    "map_error",
    "micro_time",
    "pod_reference",
    "read_job",
    "read_pod",
    "refs_of",
    "series_patch",
    "state_text",
    "stored_text",
    "write_timeout",
]
