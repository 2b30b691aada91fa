"""PURE: which workers are announced to go, so that they leave gracefully instead of failing.

Most worker losses on a real cluster are announced before the process dies: an eviction
(`kubectl drain`, the Eviction API), a preemption, a graceful delete, a graceful node shutdown
(the kubelet's DisruptionTarget TerminationByKubelet), a cordon, a taint that the cluster
autoscaler or a provider's termination handler puts on a node, a node-problem-detector condition
saying the node goes bad. A worker announced to go leaves the discovery file first; Horovod lets
it go at its next commit and the survivors regroup without it, with no rollback; its pod is
deleted (or let finish its own deletion) once horovodrun's ssh clients to it are gone. The
worker image's entrypoint holds SIGTERM meanwhile (within the pod's grace period: see
workers.LEAVE_HOLD_ENV), so an eviction does not kill the training processes under Horovod.

What is NOT an announcement (the failure path, classify.py): a force delete (grace 0), a pod
whose training container no longer runs, a node that is down (NotReady, the not-ready /
unreachable taints, DisruptionTarget DeletionByTaintManager / DeletionByPodGC): nothing is left
to leave gracefully.

No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from supervisor.observe import Obj, condition, node_problem

# Taints that say a node is about to go (NoSchedule or NoExecute). Documented in docs/env-vars.md
# (SUPERVISOR_NODE_DRAIN_TAINTS).
DEFAULT_DRAIN_TAINTS = (
    "ToBeDeletedByClusterAutoscaler",  # cluster-autoscaler, scaling the node down
    "karpenter.sh/disrupted",  # Karpenter v1, consolidating or expiring the node
    "cloud.google.com/impending-node-termination",  # GKE spot / preemptible termination
    "aws-node-termination-handler/spot-itn",  # AWS spot interruption notice
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
)
# node-problem-detector's standard permanent conditions (status True: the node goes bad).
DEFAULT_BAD_CONDITIONS = (
    "KernelDeadlock", "ReadonlyFilesystem", "FrequentKubeletRestart",
    "FrequentContainerdRestart",
)
# DisruptionTarget reasons that mean the node is lost: failures, not announcements.
NODE_LOSS_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})


class Why(StrEnum):
    EVICTED = "Evicted"  # the Eviction API (kubectl drain) or its DisruptionTarget
    PREEMPTED = "Preempted"  # the scheduler preempts it for a higher-priority pod
    SHUTDOWN = "NodeShutdown"  # the kubelet terminates it (graceful node shutdown, pressure)
    DELETED = "PodDeleted"  # a graceful delete by someone else
    CORDONED = "NodeCordoned"  # spec.unschedulable: the first step of a drain
    TAINTED = "NodeTainted"  # a configured drain / termination taint
    BAD_NODE = "NodeCondition"  # a configured node-problem condition holds
    SLOW = "Straggler"  # slow but alive: the world trains faster without it (stragglers.py)


@dataclass(frozen=True)
class Settings:
    drain_taints: frozenset[str] = frozenset(DEFAULT_DRAIN_TAINTS)
    bad_conditions: frozenset[str] = frozenset(DEFAULT_BAD_CONDITIONS)


@dataclass(frozen=True)
class Notice:
    """Why a worker is announced to go. `node_wide`: its node is going (cordon, taint,
    condition): no new worker of the job is put there while it lasts."""

    why: Why
    detail: str
    node_wide: bool = False


def node_notice(node: Obj | None, s: Settings) -> Notice | None:
    """Whether `node` is announced to go: cordoned, a drain taint, a bad condition. A node
    that is down is not announced (its workers are lost: the failure path)."""
    if node is None or node_problem(node) is not None:
        return None
    spec = node.get("spec", {})
    for t in spec.get("taints") or ():
        if t.get("key") in s.drain_taints:
            return Notice(Why.TAINTED, f"taint {t['key']}:{t.get('effect', '')}", True)
    for c in node.get("status", {}).get("conditions") or ():
        if c.get("type") in s.bad_conditions and c.get("status") == "True":
            reason = f" ({c['reason']})" if c.get("reason") else ""
            return Notice(Why.BAD_NODE, f"condition {c['type']}{reason}", True)
    if spec.get("unschedulable"):
        return Notice(Why.CORDONED, "cordoned (spec.unschedulable)", True)
    return None


def training_runs(pod: Obj, container: str) -> bool:
    """The pod is bound, not terminal, and its training container runs."""
    status = pod.get("status", {})
    if not pod.get("spec", {}).get("nodeName") or status.get("phase") in ("Succeeded",
                                                                          "Failed"):
        return False
    return any(cs.get("name") == container and "running" in (cs.get("state") or {})
               for cs in status.get("containerStatuses") or ())


def pod_notice(pod: Obj, container: str) -> Notice | None:
    """Whether the pod itself is announced to go (evicted, preempted, shut down, deleted with a
    grace) while its training container `container` still runs."""
    meta = pod.get("metadata", {})
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting and int(meta.get("deletionGracePeriodSeconds") or 0) == 0:
        return None  # force-deleted: nothing waits for it
    target = condition(pod, "DisruptionTarget")
    if target is not None and target.get("status") != "True":
        target = None
    if target is None and not deleting:
        return None
    if not training_runs(pod, container):
        return None
    reason = (target or {}).get("reason", "")
    if reason in NODE_LOSS_REASONS:
        return None
    if reason == "PreemptionByScheduler":
        return Notice(Why.PREEMPTED, f"DisruptionTarget {reason}")
    if reason == "TerminationByKubelet":
        return Notice(Why.SHUTDOWN, f"DisruptionTarget {reason}")
    if target is not None:
        return Notice(Why.EVICTED, f"DisruptionTarget {reason}".strip())
    grace = int(meta.get("deletionGracePeriodSeconds") or 0)
    return Notice(Why.DELETED, f"deleted with a grace of {grace}s")


def notice(pod: Obj, node: Obj | None, container: str, s: Settings) -> Notice | None:
    """Whether a worker pod is announced to go: by itself first, then by its node (only while
    its training container runs: otherwise there is nothing to leave gracefully)."""
    own = pod_notice(pod, container)
    if own is not None:
        if node is not None and node_problem(node) is not None:
            return None  # its node is down too: the failure path
        return own
    if not training_runs(pod, container):
        return None
    return node_notice(node, s)


def going_nodes(nodes: Iterable[Obj], s: Settings) -> frozenset[str]:
    """The nodes announced to go: no new worker of the job is placed there."""
    return frozenset(n["metadata"]["name"] for n in nodes if node_notice(n, s) is not None)


def parse_names(raw: str, what: str, example: str) -> frozenset[str]:
    """A comma-separated list of taint keys or condition types ("" or "none": none); raises
    ValueError naming the bad entry and the accepted form."""
    text = raw.strip()
    if text.lower() in ("", "none"):
        return frozenset()
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if not n or any(ch.isspace() for ch in n) or len(n) > 316:
            raise ValueError(f"comma-separated {what} without spaces (e.g. {example}), "
                             "or none")
    return frozenset(names)
