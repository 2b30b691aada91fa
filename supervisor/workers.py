"""PURE: worker pods built from the job's worker pod template.

Owns the labels that identify a worker (job, role, slot, incarnation), the validation of the
template (checked once at start, precise errors), and `worker_pod`: a new pod for a slot with a
name unique to its incarnation (Horovod never sees a host name twice), an ownerReference to the
launcher Job (the cluster deletes workers with their job, not with one launcher pod) and a
preferred node anti-affinity away from the node that just failed. No I/O: the template arrives
as a loaded YAML document.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

LABEL_JOB = "elastic-supervisor/job"
LABEL_ROLE = "elastic-supervisor/role"
LABEL_SLOT = "elastic-supervisor/slot"
LABEL_INCARNATION = "elastic-supervisor/incarnation"
# On a replacement placed ahead of a cordoned worker's move (leaving.move_ahead): that worker's
# pod name. Its slot is not at this pod's incarnation yet; a restarted supervisor must not move
# the slot up to it (fleet.adopt) while that worker is still there.
ANNOTATION_AHEAD_OF = "elastic-supervisor/ahead-of"
HOSTNAME_KEY = "kubernetes.io/hostname"  # the label earlier versions kept workers off by (read)
NODE_NAME_FIELD = "metadata.name"  # a node selector's field: the node's name, not a label
# The worker image's entrypoint holds SIGTERM this many seconds while training processes run in
# the container (horovodrun lets a worker announced to go leave at its next commit: see
# disruption.py); unset or 0: sshd gets SIGTERM at once, as without a supervisor.
LEAVE_HOLD_ENV = "ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS"
LEAVE_HOLD_MARGIN_S = 5  # kept of the pod's grace period for sshd and the container to stop
DEFAULT_GRACE_S = 30  # the pod's terminationGracePeriodSeconds when the template has none


class TemplateError(Exception):
    """The worker pod template is unusable; `problems` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def validate_template(doc: Any, selector: Mapping[str, str]) -> dict[str, Any]:
    """Return the template ({metadata, spec}) or raise TemplateError listing every problem.

    Accepts a Pod or a bare {metadata, spec}. `selector` is the worker selector as key=value
    pairs: pods built from the template must match it, or the supervisor would not see them.
    """
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise TemplateError(["template: expected a Pod (or {metadata, spec}) mapping"])
    if doc.get("kind") not in (None, "Pod"):
        problems.append(f"template.kind: {doc.get('kind')!r}: expected Pod")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise TemplateError([*problems, "template.spec: missing: expected a pod spec"])
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.append("template.spec.containers: expected at least one container")
    else:
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                problems.append(f"template.spec.containers[{i}]: expected name and image")
    policy = spec.get("restartPolicy")
    if policy != "Never":
        shown = "unset (Always, the Kubernetes default)" if policy is None else repr(policy)
        problems.append(f"template.spec.restartPolicy: {shown}: expected Never (the supervisor "
                        "replaces failed workers itself; a kubelet restarting one in place "
                        "would give its slot a second, unplanned life)")
    if spec.get("nodeName"):
        problems.append("template.spec.nodeName: must be empty (the scheduler places workers)")
    if spec.get("hostname"):
        problems.append("template.spec.hostname: must be empty (every worker would get the "
                        "same host name)")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        problems.append("template.metadata: expected a mapping")
        meta = {}
    labels = {**(meta.get("labels") or {})}
    for key in (LABEL_SLOT, LABEL_INCARNATION):
        if key in labels:
            problems.append(f"template.metadata.labels.{key}: set by the supervisor; remove it")
    missing = {k: v for k, v in selector.items()
               if k not in (LABEL_JOB, LABEL_ROLE) and labels.get(k) != v}
    for k, v in sorted(missing.items()):
        problems.append(f"template.metadata.labels.{k}: expected {v!r} to match the worker "
                        "selector")
    if problems:
        raise TemplateError(problems)
    return {"metadata": copy.deepcopy(meta), "spec": copy.deepcopy(spec)}


def owner_reference(owner: Mapping[str, str]) -> dict[str, Any]:
    """Return the ownerReference the workers and the state carry: garbage with their owner
    (the launcher Job), blocking its foreground deletion until they are gone. Not
    `controller`: the Job controller releases pods it controls that its selector does not
    match (it would strip the reference)."""
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"],
            "uid": owner["uid"], "blockOwnerDeletion": True}


def spell(job: str, slot: int, incarnation: int) -> str:
    """The worker pod name, unchecked: `pod_name` without its DNS-label check, for the names
    worked out for every slot (Fleet.current) of a job whose names the configuration checked."""
    return f"{job}-w{slot}-{incarnation}"


def pod_name(job: str, slot: int, incarnation: int) -> str:
    """Return the worker pod name: unique per incarnation, a DNS label (<= 63 characters).

    Never truncated (two jobs could then share names): the configuration refuses job names
    that leave no room (config.INCARNATION_DIGITS).
    """
    name = spell(job, slot, incarnation)
    if len(name) > 63 or not DNS_LABEL.match(name):
        raise ValueError(f"cannot name a worker of job {job!r}: {name!r} is not a DNS label "
                         "(longer than 63 characters?)")
    return name


def worker_pod(
    template: Mapping[str, Any],
    *,
    job: str,
    slot: int,
    incarnation: int,
    owner: Mapping[str, str] | None,
    avoid_node: str | None = None,
    lost_nodes: Sequence[str] = (),
    suspect_nodes: Sequence[str] = (),
    hold_in: str | None = None,
    ahead_of: str | None = None,
) -> dict[str, Any]:
    """Return a new worker pod for `slot` from a validated template.

    `owner` is the launcher Job (apiVersion/kind/name/uid; or the launcher pod when no Job
    made it) or None when running locally;
    `avoid_node` the node the previous incarnation failed on (a preferred anti-affinity);
    `lost_nodes` nodes the supervisor already counts as lost (a required anti-affinity: the
    node controller taints them only 40-50 s after their kubelet went silent);
    `suspect_nodes` nodes where a worker hung recently (preferred away too: a silent node is
    still Ready in the API for 40-50 s, and a pod bound there would never start);
    `hold_in` the training container, which gets LEAVE_HOLD_ENV (leave_hold_s) unless the
    template sets it; `ahead_of` the pod of a worker whose move it is placed ahead of
    (ANNOTATION_AHEAD_OF).
    """
    meta = copy.deepcopy(dict(template["metadata"]))
    spec = copy.deepcopy(dict(template["spec"]))
    meta.pop("name", None)
    meta.pop("generateName", None)
    meta.pop("namespace", None)
    meta["name"] = pod_name(job, slot, incarnation)
    meta["labels"] = {**(meta.get("labels") or {}), LABEL_JOB: job, LABEL_ROLE: "worker",
                      LABEL_SLOT: str(slot), LABEL_INCARNATION: str(incarnation)}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    if ahead_of is not None:
        meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_AHEAD_OF: ahead_of}
    avoid = {*([avoid_node] if avoid_node else []), *suspect_nodes}
    if avoid:
        affinity = spec.setdefault("affinity", {})
        node_aff = affinity.setdefault("nodeAffinity", {})
        preferred = node_aff.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append({"weight": 100, "preference": {"matchFields": not_on(avoid)}})
    if lost_nodes:
        node_aff = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:  # terms are ORed: the exclusion goes into each of them
            term.setdefault("matchFields", []).extend(not_on(lost_nodes))
    for c in spec.get("containers") or ():
        if c.get("name") == hold_in and not any(
                e.get("name") == LEAVE_HOLD_ENV for e in c.get("env") or ()):
            c["env"] = [*(c.get("env") or ()),
                        {"name": LEAVE_HOLD_ENV, "value": str(leave_hold_s(spec))}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def leave_hold_s(spec: Mapping[str, Any]) -> int:
    """PURE: how long a worker's entrypoint may hold SIGTERM: its grace period less a margin."""
    grace = spec.get("terminationGracePeriodSeconds")
    return max(0, int(DEFAULT_GRACE_S if grace is None else grace) - LEAVE_HOLD_MARGIN_S)


def disruption_budget(name: str, job: str, min_available: int,
                      owner: Mapping[str, str] | None) -> dict[str, Any]:
    """PURE: the PodDisruptionBudget of the job's workers: the Eviction API (a drain, the
    autoscaler) leaves at least `min_available` of them healthy, the desired count less one,
    so it takes one at a time and waits for its replacement to be Ready before the next (the
    supervisor's own deletes do not go through it). An integer: the disruption controller
    computes a `maxUnavailable` only for pods a scalable controller owns, which workers are
    not (it would allow no eviction at all)."""
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_JOB: job}}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"minAvailable": min_available,
                     "selector": {"matchLabels": {LABEL_JOB: job, LABEL_ROLE: "worker"}}}}


def not_on(nodes: Iterable[str]) -> list[dict[str, Any]]:
    """PURE: node selector requirements that keep a pod off `nodes` by their names (a field,
    not the hostname label, which is not the node's name on every cluster; the API takes one
    value per field requirement, and a term ANDs its requirements)."""
    return [{"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [n]} for n in sorted(nodes)]


def kept_off(pod: Mapping[str, Any]) -> frozenset[str]:
    """PURE: the nodes the pod's required node affinity keeps it off (the `NotIn` node names
    that worker_pod adds for lost nodes: its inverse; also the hostname label's, which earlier
    versions wrote, so that an adopted pod of theirs is read right)."""
    required = ((pod.get("spec", {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    return frozenset(v for term in required.get("nodeSelectorTerms") or ()
                     for kind, key in (("matchFields", NODE_NAME_FIELD),
                                       ("matchExpressions", HOSTNAME_KEY))
                     for e in term.get(kind) or ()
                     if e.get("key") == key and e.get("operator") == "NotIn"
                     for v in e.get("values") or ())
