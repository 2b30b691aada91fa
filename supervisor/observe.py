"""PURE: the supervisor's view of the cluster, built from API-shaped dicts and watch events.

Owns `ClusterView` (worker pods and nodes as the API returned them, plus what the reflectors
report about their own health) and the rules that say whether a worker is usable by Horovod.
No I/O, no clock reads, no Kubernetes client imports: times are passed in.
The view is mutated only by the loop thread that owns it.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Obj = Mapping[str, Any]

CHANGE_LOG = 4096  # changes kept for incremental rendering (more: a full pass)
NODE_DOWN_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Kind(StrEnum):
    POD = "pod"
    NODE = "node"
    LEASE = "lease"  # node heartbeats in kube-node-lease (optional, see nodeleases.py)
    SCALE = "scale"  # the job's scale request ConfigMap (elastic-supervisor scale)


class Unusable(StrEnum):
    """Why a worker pod is not in the discovery file."""

    NOT_RUNNING = "PodNotRunning"
    NOT_READY = "PodNotReady"
    DELETING = "PodDeleting"
    NO_ADDRESS = "PodHasNoAddress"
    NODE_UNKNOWN = "NodeNotObserved"
    NODE_NOT_READY = "NodeNotReady"
    NODE_TAINTED = "NodeTaintedDown"
    HOST_REUSED = "HostNameReused"
    SCALING_IN = "ScalingIn"
    HUNG = "WorkerHung"  # found Hung: it still looks Running and Ready
    FOUND_FAILED = "FoundFailed"  # the supervisor declared it failed (before its delete shows)
    SLOT_NOT_ACTIVE = "SlotNotActive"  # an old incarnation or a dropped slot's pod
    HELD = "HeldUntilRegroup"  # new, kept out until the survivors of a failure regrouped


@dataclass
class SourceHealth:
    """What a reflector reports about itself; times are monotonic seconds."""

    synced: bool = False
    # When the watch stopped delivering (disconnect, error, relist); None while connected.
    broken_since: float | None = None
    last_event_at: float | None = None

    def broken_for(self, now: float) -> float:
        return 0.0 if self.broken_since is None else max(0.0, now - self.broken_since)


@dataclass
class ClusterView:
    """Worker pods and nodes by name, as API-shaped dicts, with the health of their sources."""

    pods: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    health: dict[Kind, SourceHealth] = field(
        default_factory=lambda: {Kind.POD: SourceHealth(), Kind.NODE: SourceHealth()})

    # Counts the changes applied: equal versions mean an unchanged view (nothing to render).
    version: int = 0
    # The latest changes, (version, kind, name): what changed since a version (changes_since).
    log: deque[tuple[int, Kind, str]] = field(
        default_factory=lambda: deque(maxlen=CHANGE_LOG), repr=False, compare=False)

    def apply(self, kind: Kind, etype: EventType, obj: Obj) -> bool:
        """Apply one watch event; return whether the view changed."""
        store = self.pods if kind is Kind.POD else self.nodes
        name = obj["metadata"]["name"]
        if etype is EventType.DELETED:
            if store.pop(name, None) is None:
                return False
        else:
            old = store.get(name)
            if old is not None and _rv(old) == _rv(obj):
                return False
            store[name] = obj
        self.version += 1
        self.log.append((self.version, kind, name))
        return True

    def changes_since(self, version: int) -> list[tuple[Kind, str]] | None:
        """(kind, name) of every change after `version`; None if the log no longer reaches
        back that far."""
        if version == self.version:
            return []
        if version > self.version or not self.log or self.log[0][0] > version + 1:
            return None
        # The log's versions run without a gap up to self.version: its last entries, read from
        # its end, not a walk of the whole log on every render.
        last = list(itertools.islice(reversed(self.log), self.version - version))
        return [(k, n) for _, k, n in reversed(last)]

    @property
    def synced(self) -> bool:
        return all(h.synced for h in self.health.values())

    def broken_for(self, now: float) -> float:
        """Seconds the longest-broken watch has been broken (0 when all are connected)."""
        return max(h.broken_for(now) for h in self.health.values())


# What the supervisor keeps of each object (like client-go's informer transforms): everything
# the usability rules and failure classification read, nothing else. managedFields alone is
# often half a pod; a node's status.images can be tens of kB. Of the conditions only Ready,
# DisruptionTarget and PodScheduled are read (type, status, reason), and of a node's also any
# that holds (status True: a node-problem-detector condition, disruption.py); of a container
# status its name, restart count and states (a terminated state: exit code, reason, signal; a
# waiting one: reason and message, for a pod that never starts); of the spec's
# affinity only the required node affinity (the nodes a replacement was kept off, shared: most
# workers have the template's). Of the timestamps only the pod's creation and deletion are
# kept (creation: a scale-out's timeout, plan.py); other messages and image names are dropped.
_POD_KEEP = {
    "metadata": ("name", "namespace", "uid", "resourceVersion", "labels", "annotations",
                 "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                 "ownerReferences"),
    "spec": ("nodeName", "hostname", "subdomain", "restartPolicy"),
    "status": ("phase", "reason", "message", "podIP", "conditions", "containerStatuses",
               "initContainerStatuses"),
}
_NODE_KEEP = {
    "metadata": ("name", "uid", "resourceVersion", "labels", "deletionTimestamp"),
    "spec": ("taints", "unschedulable"),
    "status": ("conditions",),
}
_LEASE_KEEP = {
    "metadata": ("name", "resourceVersion"),
    "spec": ("holderIdentity", "renewTime", "leaseDurationSeconds"),
}
_CONFIGMAP_KEEP = {"metadata": ("name", "resourceVersion"), "data": None}
_DROP_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
_CONDITION_TYPES = frozenset({"Ready", "DisruptionTarget", "PodScheduled"})
_CONDITION_KEEP = ("type", "status", "reason")
_TERMINATED_KEEP = ("exitCode", "reason", "signal")
_WAITING_KEEP = ("reason", "message")
_WAITING_MESSAGE_MAX = 400
_SHARED_VALUES = {("metadata", "namespace"), ("spec", "nodeName"), ("spec", "restartPolicy"),
                  ("spec", "subdomain"), ("status", "phase"), ("status", "reason")}


class _Shared:
    """Keeps ONE copy of the small values that thousands of pods have alike (their labels, a
    Ready=True condition list, a running container's statuses): at 10,000 workers the copies
    cost more than the rest of the view. The shared values are read-only like every object of
    the view; at most `limit` are kept (then new ones are simply not shared)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._values: dict[Any, Any] = {}

    def __call__(self, key: Any, make: Any) -> Any:
        found = self._values.get(key)
        if found is None:
            found = make()
            if len(self._values) < self.limit:
                self._values[key] = found
        return found


_shared_values = _Shared()


def _one(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def _frozen(value: Any) -> Any:
    """A hashable key for a JSON value (dicts and lists become sorted tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _conditions(conds: Any, *, holding: bool = False) -> list[dict[str, Any]]:
    """The conditions read: the _CONDITION_TYPES, and with `holding` also any whose status
    is True (a node's: which of them say it goes bad is configured, disruption.py)."""
    kept = [{k: _one(c[k]) for k in _CONDITION_KEEP if k in c} for c in conds or ()
            if isinstance(c, Mapping) and (c.get("type") in _CONDITION_TYPES
                                           or (holding and c.get("status") == "True"))]
    return _shared_values(("conditions", _frozen(kept)), lambda: kept)


def _state(state: Any) -> dict[str, Any]:
    """A container state ({running|waiting|terminated: {...}}) without its timestamps."""
    out: dict[str, Any] = {}
    for key, detail in (state or {}).items():
        if key == "terminated" and isinstance(detail, Mapping):
            out["terminated"] = {f: _one(detail[f]) for f in _TERMINATED_KEEP if f in detail}
        elif key == "waiting" and isinstance(detail, Mapping):
            # Why it has not started (starts.py): the reason, and the message cut short.
            out["waiting"] = {f: _one(str(detail[f])[:_WAITING_MESSAGE_MAX])
                              for f in _WAITING_KEEP if detail.get(f)}
        else:
            out[sys.intern(key)] = {}
    return out


def _containers(statuses: Any) -> list[dict[str, Any]]:
    out = []
    for cs in statuses or ():
        if not isinstance(cs, Mapping):
            continue
        c: dict[str, Any] = {"name": _one(cs.get("name", "")),
                             "restartCount": cs.get("restartCount", 0)}
        for key in ("state", "lastState"):
            if cs.get(key):
                c[key] = _state(cs[key])
        out.append(c)
    return _shared_values(("containers", _frozen(out)), lambda: out)


def slim(kind: Kind, obj: Obj) -> dict[str, Any]:
    """Return `obj` reduced to the fields the supervisor reads (a new dict whose nested values
    may be shared with other slim objects: read-only, like the whole view)."""
    keep = {Kind.POD: _POD_KEEP, Kind.NODE: _NODE_KEEP, Kind.LEASE: _LEASE_KEEP,
            Kind.SCALE: _CONFIGMAP_KEEP}[kind]
    out: dict[str, Any] = {"kind": obj.get("kind") or KIND_NAMES[kind]}
    for section, fields in keep.items():
        src = obj.get(section) or {}
        out[section] = dict(src) if fields is None else {
            f: _one(src[f]) if (section, f) in _SHARED_VALUES else src[f]
            for f in fields if f in src}
    meta = out["metadata"]
    if annotations := meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in annotations.items()
                               if k not in _DROP_ANNOTATIONS}
    if labels := meta.get("labels"):
        meta["labels"] = _shared_values(("labels", _frozen(labels)), lambda: dict(labels))
    status = out.get("status")
    if status is not None and "conditions" in status:
        status["conditions"] = _conditions(status["conditions"], holding=kind is Kind.NODE)
    if kind is Kind.POD:
        for key in ("containerStatuses", "initContainerStatuses"):
            if key in status:
                status[key] = _containers(status[key])
        required = ((obj.get("spec", {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        if required:
            aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
            out["spec"]["affinity"] = _shared_values(("affinity", _frozen(aff)), lambda: aff)
        if "spec" in obj:
            names = tuple(c.get("name") for c in obj["spec"].get("containers") or ())
            out["spec"]["containers"] = _shared_values(
                ("spec.containers", names), lambda: [{"name": n} for n in names])
    return out


KIND_NAMES = {Kind.POD: "Pod", Kind.NODE: "Node", Kind.LEASE: "Lease",
              Kind.SCALE: "ConfigMap"}


def renew_interval(lease_spec: Obj) -> float:
    """The kubelet renews its node Lease every leaseDurationSeconds / 4 (40 s -> 10 s)."""
    try:
        return float(lease_spec.get("leaseDurationSeconds") or 40) / 4
    except (TypeError, ValueError):
        return 10.0


def _rv(obj: Obj) -> str | None:
    return obj.get("metadata", {}).get("resourceVersion")


def condition(obj: Obj, ctype: str) -> Obj | None:
    """Return the status condition of type `ctype`, or None."""
    for c in obj.get("status", {}).get("conditions") or ():
        if c.get("type") == ctype:
            return c
    return None


def node_problem(node: Obj | None) -> Unusable | None:
    """Return why a node cannot host a usable worker, or None if it can."""
    if node is None:
        return Unusable.NODE_UNKNOWN
    ready = condition(node, "Ready")
    if ready is None or ready.get("status") != "True":
        return Unusable.NODE_NOT_READY
    if any(t.get("key") in NODE_DOWN_TAINTS for t in node.get("spec", {}).get("taints") or ()):
        return Unusable.NODE_TAINTED
    return None


def marked_not_ready(pod: Obj) -> bool:
    """The pod is not Ready, and no readiness probe of its own says so: marked from outside
    (the node controller's MarkPodsNotReady on a node it found NotReady), which the kubelet
    clears only at its next update. Either the kubelet says each of its containers is ready,
    or none of its containers has a readiness probe: then a container is not ready only while
    it does not run (its processes do not heartbeat either) or, as it seems, in the kubelet's
    status of the moment after an API outage (the stock tour's outage: both workers left the
    host list while they trained, their nodes Ready again; the container statuses of that
    moment were not logged). A readiness probe that fails (an sshd down) makes its container
    not ready: that one is the pod's own verdict."""
    ready = condition(pod, "Ready")
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    if ready is None or ready.get("status") == "True" or not statuses:
        return False
    if all(cs.get("ready") is True for cs in statuses):
        return True
    return not any(c.get("readinessProbe") for c in pod.get("spec", {}).get("containers") or ())


def pod_problem(pod: Obj, nodes: Mapping[str, Obj]) -> Unusable | None:
    """Return why a worker pod is not usable by Horovod, or None if it is."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    if meta.get("deletionTimestamp"):
        return Unusable.DELETING
    if status.get("phase") != "Running":
        return Unusable.NOT_RUNNING
    ready = condition(pod, "Ready")
    if ready is None or ready.get("status") != "True":
        return Unusable.NOT_READY
    if not status.get("podIP"):
        return Unusable.NO_ADDRESS
    return node_problem(nodes.get(pod.get("spec", {}).get("nodeName") or ""))
