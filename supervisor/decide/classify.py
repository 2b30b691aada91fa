"""PURE: why a worker stopped being usable. Exactly one cause per pod incarnation.

Input: the pod as the latest watch event showed it, `PodMemory` (what earlier events of the same
incarnation taught: the grace period of the first event that carried a deletionTimestamp, the
last restart counts), the node and since when it has been down, the settings and `now`.
Output: a `Failure` or None (healthy, or only transiently unusable, e.g. a node down for less
than the grace, or a readiness probe failing).

Order of evidence, first that applies wins:
1. deleted by the supervisor itself (scale-in, replacement): never a failure; with
   `graceful_leave`, a pod announced to go (evicted, preempted, shut down or deleted with a
   grace, disruption.pod_notice) whose training container runs on a node that is up: not a
   failure either, it leaves gracefully (core's leave step);
2. DisruptionTarget=True: DeletionByPodGC / DeletionByTaintManager -> NodeNotReady,
   PreemptionByScheduler -> Preempted, anything else (EvictionByEvictionAPI,
   TerminationByKubelet) -> Evicted; kubelet node-pressure eviction (phase Failed,
   reason Evicted) -> Evicted;
3. a container terminated: Never -> state.terminated; OnFailure/Always -> lastState.terminated
   with restartCount above the last one seen -> ExitCode(n, container);
4. its node down (Ready not True, or a not-ready/unreachable taint) for >= node grace, or
   (optional) its Lease not renewed for >= lease grace -> NodeNotReady;
5. deletion: the first event carrying the deletionTimestamp had grace 0 while the pod was
   scheduled and not terminal -> PodForceDeleted (if that event was missed, a DELETED object
   still Running with running containers says the same); any other deletion -> PodDeleted.
No I/O, no clock: `now` and times are monotonic seconds passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum

from supervisor.decide.disruption import pod_notice
from supervisor.observe import EventType, Obj, condition, node_problem


class Cause(StrEnum):
    EXIT_CODE = "ExitCode"
    NODE_NOT_READY = "NodeNotReady"
    POD_FORCE_DELETED = "PodForceDeleted"
    POD_DELETED = "PodDeleted"  # graceful delete by someone else
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    HUNG = "Hung"  # its training process stopped heartbeating while its peers waited (hang.py)
    # bound to a node, it never started within SUPERVISOR_WORKER_START_TIMEOUT_SECONDS (starts.py)
    NOT_STARTED = "NotStarted"


# Causes outside the script's control, free of the restart budgets and of backoff unless
# disruptionsFree is false: the infrastructure took the worker, it is no crash loop of the
# script. Hung is one: a process that cannot heartbeat was frozen (SIGSTOP, a frozen node) or cut
# off (a partition); a script that deadlocks keeps heartbeating, and is a stall instead.
DISRUPTIONS = frozenset({Cause.NODE_NOT_READY, Cause.POD_FORCE_DELETED, Cause.EVICTED,
                         Cause.PREEMPTED, Cause.HUNG})
# Causes that never use a restart budget nor wait for backoff, whatever disruptionsFree says:
# the script never ran (a pod that never started is replaced after a bound of its own).
NEVER_COUNTED = frozenset({Cause.NOT_STARTED})
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Failure:
    cause: Cause
    pod: str
    uid: str
    node: str | None
    exit_code: int | None = None
    container: str | None = None
    detail: str = ""
    node_fault: bool = False  # NotStarted: the kubelet's reason is its node's (starts.py)


_NO_RESTARTS: Mapping[str, int] = {}  # shared by the pods whose containers never restarted


@dataclass(frozen=True, slots=True)
class PodMemory:
    """What earlier watch events of one pod incarnation (one UID) showed."""

    uid: str
    # deletionGracePeriodSeconds of the first event that carried a deletionTimestamp, and
    # whether the pod was then scheduled and not terminal.
    first_deletion_grace: int | None = None
    deletion_while_live: bool = False
    restart_counts: Mapping[str, int] = field(default_factory=lambda: _NO_RESTARTS)  # > 0 only


@dataclass(frozen=True)
class ClassifySettings:
    """Seconds. node_grace_s: how long a node must be down before its workers count as lost
    (0 allowed). lease_grace_s: if set, a node Lease not renewed for that long also counts.
    training_container: the container whose exit is the worker's (None: the pod's first);
    policy_containers: other containers whose exits count too (the policy's rules name them)."""

    node_grace_s: float = 0.0
    lease_grace_s: float | None = None
    training_container: str | None = None
    policy_containers: frozenset[str] = frozenset()
    # The supervisor owns the workers and lets an announced one leave gracefully.
    graceful_leave: bool = False


def _restart_counts(pod: Obj) -> dict[str, int]:
    return {c.get("name", ""): int(c.get("restartCount") or 0)
            for c in pod.get("status", {}).get("containerStatuses") or ()
            if c.get("restartCount")}


def _is_live(pod: Obj) -> bool:
    return bool(pod.get("spec", {}).get("nodeName")) and pod.get("status", {}).get(
        "phase") not in TERMINAL_PHASES


def remember(memory: PodMemory | None, pod: Obj) -> PodMemory:
    """Return the memory after seeing `pod` (a new incarnation resets it)."""
    uid = pod["metadata"].get("uid", "")
    if memory is None or memory.uid != uid:
        memory = PodMemory(uid=uid)
    meta = pod["metadata"]
    first_grace, live = memory.first_deletion_grace, memory.deletion_while_live
    if first_grace is None and meta.get("deletionTimestamp"):
        first_grace = int(meta.get("deletionGracePeriodSeconds") or 0)
        live = _is_live(pod)
    counts = {**memory.restart_counts, **_restart_counts(pod)} or _NO_RESTARTS
    if (first_grace, live, counts) == (memory.first_deletion_grace,
                                       memory.deletion_while_live, memory.restart_counts):
        return memory
    return PodMemory(uid=uid, first_deletion_grace=first_grace, deletion_while_live=live,
                     restart_counts=counts)


def node_down_since(previous: float | None, node: Obj | None, now: float) -> float | None:
    """Return since when the node has been down (first seen down), or None if it is up."""
    if node is not None and node_problem(node) is None:
        return None
    return now if previous is None else previous


def disrupted(job_nodes: AbstractSet[str], down: AbstractSet[str],
              threshold: float | None) -> frozenset[str]:
    """The node controller's disruption brake, over the nodes that run the job's workers.

    Return the down nodes whose loss is held back (their workers are not failed for it, their
    pods not force-deleted), or the empty set. Like kube-controller-manager's zone states:
    every one of them down (at least two: a job on a single node has nothing to compare with),
    or more than two down and at least `threshold` of them (its `--unhealthy-zone-threshold`,
    0.55). So many nodes going at once is more likely the network, the control plane or a
    rack's switch than the nodes themselves, and replacing every worker would only harm the
    job. `threshold` None: no brake.
    """
    if threshold is None:
        return frozenset()
    hit = job_nodes & down
    total = len(job_nodes)
    if (len(hit) == total >= 2) or (len(hit) > 2 and len(hit) >= threshold * total):
        return frozenset(hit)
    return frozenset()


def held_nodes(job_nodes: AbstractSet[str], cluster_nodes: AbstractSet[str],
               down: AbstractSet[str], threshold: float | None) -> frozenset[str]:
    """The down nodes of the job whose loss is held back: `disrupted` over the job's nodes, or
    over every node of the cluster (the node controller's zones count every node: when most of
    the cluster went down together, e.g. every kubelet's heartbeat missed during a control-plane
    outage, a job whose workers share one node is held too)."""
    cluster = disrupted(cluster_nodes, down & cluster_nodes, threshold)
    return disrupted(job_nodes, down, threshold) | (cluster & job_nodes & down)


def training_container(pod: Obj, settings: ClassifySettings) -> str:
    """The name of the container whose exit is the worker's."""
    if settings.training_container is not None:
        return settings.training_container
    containers = pod.get("spec", {}).get("containers") or [{}]
    return str(containers[0].get("name", ""))


def container_exits(pod: Obj, memory: PodMemory | None) -> list[tuple[str, int]]:
    """(container, exit code) of each container that ended since `memory` (restartPolicy
    Never: its terminated state; otherwise a restart seen since)."""
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    restart_policy = pod.get("spec", {}).get("restartPolicy", "Always")
    found: list[tuple[str, int]] = []
    for cs in statuses:
        name = cs.get("name", "")
        if restart_policy == "Never":
            term = (cs.get("state") or {}).get("terminated")
        else:
            seen = (memory.restart_counts if memory else {}).get(name, 0)
            restarted = int(cs.get("restartCount") or 0) > seen
            term = (cs.get("lastState") or {}).get("terminated") if restarted else None
        if term is not None:
            found.append((name, int(term.get("exitCode", 0))))
    return found


def uncounted_exits(pod: Obj, memory: PodMemory | None,
                    settings: ClassifySettings) -> list[tuple[str, int]]:
    """Exits of containers that are neither the training container nor named by the policy: a
    helper that ended says nothing about the training (reported, never a failure)."""
    counted = {training_container(pod, settings), *settings.policy_containers}
    return [(n, code) for n, code in container_exits(pod, memory) if n not in counted]


def _terminated(pod: Obj, memory: PodMemory | None,
                settings: ClassifySettings) -> tuple[int, str] | None:
    """The exit that is the worker's: the training container's first, then a non-zero one of a
    container the policy names."""
    training = training_container(pod, settings)
    exits = container_exits(pod, memory)
    own = [(code, n) for n, code in exits if n == training]
    named = [(code, n) for n, code in exits if n in settings.policy_containers and code != 0]
    found = own + named
    return found[0] if found else None


@dataclass(frozen=True)
class NodeState:
    """What is known of a worker's node: the object (None: not seen or gone), since when it has
    been down (None: up) and seconds since its Lease was renewed (None: not watched)."""

    node: Obj | None = None
    down_since: float | None = None
    lease_age_s: float | None = None


def classify(
    pod: Obj,
    etype: EventType,
    memory: PodMemory | None,
    node_state: NodeState,
    *,
    settings: ClassifySettings,
    now: float,
    ours: bool = False,
    relisted: bool = False,
) -> Failure | None:
    """Return why this worker incarnation failed, or None if it has not (yet).

    `memory` is what the events BEFORE this one showed; `ours`: the supervisor deleted this
    pod itself; `relisted`: a DELETED found by a relist (the watch was down), `pod` being the
    last object seen before.
    """
    if ours:
        return None
    node, down_since, lease_age_s = node_state.node, node_state.down_since, node_state.lease_age_s
    meta, status = pod["metadata"], pod.get("status", {})
    node_name = pod.get("spec", {}).get("nodeName")
    if (settings.graceful_leave and etype is not EventType.DELETED and down_since is None
            and node is not None and node_problem(node) is None
            and pod_notice(pod, training_container(pod, settings)) is not None):
        return None  # announced: it leaves gracefully

    def failure(cause: Cause, detail: str, code: int | None = None,
                container: str | None = None) -> Failure:
        return Failure(cause, meta["name"], meta.get("uid", ""), node_name, code, container,
                       detail)

    disruption = condition(pod, "DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        reason = disruption.get("reason", "")
        if reason in ("DeletionByPodGC", "DeletionByTaintManager"):
            return failure(Cause.NODE_NOT_READY, f"DisruptionTarget {reason}")
        if reason == "PreemptionByScheduler":
            return failure(Cause.PREEMPTED, f"DisruptionTarget {reason}")
        return failure(Cause.EVICTED, f"DisruptionTarget {reason}")
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return failure(Cause.EVICTED, f"kubelet eviction: {status.get('message', '')}".strip())

    term = _terminated(pod, memory, settings)
    if term is not None:
        code, container = term
        return failure(Cause.EXIT_CODE, f"container {container} exited with {code}", code,
                       container)

    if node_name:
        if down_since is not None and now - down_since >= settings.node_grace_s:
            problem = node_problem(node)
            why = problem.value if problem is not None else "node down"
            return failure(Cause.NODE_NOT_READY,
                           f"node {node_name}: {why} for {now - down_since:.1f}s")
        if (settings.lease_grace_s is not None and lease_age_s is not None
                and lease_age_s >= settings.lease_grace_s):
            return failure(Cause.NODE_NOT_READY,
                           f"node {node_name}: Lease not renewed for {lease_age_s:.1f}s")

    if meta.get("deletionTimestamp") or etype is EventType.DELETED:
        if memory is not None and memory.first_deletion_grace is not None:
            grace, live = memory.first_deletion_grace, memory.deletion_while_live
        elif meta.get("deletionTimestamp") and etype is not EventType.DELETED:
            grace, live = int(meta.get("deletionGracePeriodSeconds") or 0), _is_live(pod)
        elif relisted:
            # Deleted while the watch was down: only the last object seen before is known.
            phase = status.get("phase", "Unknown")
            return failure(Cause.POD_DELETED, f"deleted while the watch was down (last seen "
                                              f"{phase})")
        else:
            # The first deletion event was missed: judge from what the DELETED object shows.
            running = all("running" in (cs.get("state") or {})
                          for cs in status.get("containerStatuses") or ())
            grace, live = (0 if running else 1), _is_live(pod) and running
        if grace == 0 and live:
            return failure(Cause.POD_FORCE_DELETED, "deleted with grace period 0 while running")
        return failure(Cause.POD_DELETED, f"deleted (grace {grace}s)")
    return None

