"""PURE: a worker pod that never starts, and whose fault that is.

A pod has not started while it is bound to a node (spec.nodeName), is not being deleted, its
phase is Pending and none of its containers, init or app, runs: the kubelet has not got it
going (ContainerCreating after a kube-apiserver restart with "no relationship found between
node and this object", a volume that does not mount, an image that does not pull, a Secret
that is not there). Unbound pods are the scheduler's (podindex.unschedulable), a running init
container is a start under way, and a container that ran and ended is an exit (classify.py).

`stuck` names the kubelet's reason and judges whose fault it is, by the first rule of RULES
that matches (the Event cites it): the NODE's (replaced, off that node, counted towards its
quarantine), the TEMPLATE's (it would fail the same on any node: said loudly, never replaced
in a loop; the kubelet keeps trying and the pod starts once the image or the Secret is
there; said after SAY_AFTER_S already), or UNKNOWN (the pod's status does not say: the
kubelet's Events do; replaced off the node, at most LIMIT pods of a slot in a row). How long a
pod may stay so before it is replaced (the bound) is the caller's
(SUPERVISOR_WORKER_START_TIMEOUT_SECONDS). No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from supervisor.observe import Obj

# Pods of one slot that never started, in a row, replaced for an UNKNOWN or NODE fault; the
# next one is left as it is (said once): every node failing the same way is the template's.
LIMIT = 3
MESSAGE_MAX = 400  # characters of the kubelet's message kept (the Event's note is <= 1 kB)
# A fault of the template is said (never acted on) after this long, or the bound if shorter:
# the kubelet's image pull back-off (10 s, doubling) has tried three times by then, so it is no
# registry blip, and it is said before a job that never gets its workers ends at
# SUPERVISOR_START_TIMEOUT_SECONDS.
SAY_AFTER_S = 60.0


class Fault(StrEnum):
    NODE = "node"
    TEMPLATE = "template"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Rule:
    """Matches a waiting reason (None: any) whose message holds `text` ("" : any)."""

    name: str
    fault: Fault
    reasons: frozenset[str] | None = None
    text: str = ""

    def matches(self, reason: str, message: str) -> bool:
        return ((self.reasons is None or reason in self.reasons)
                and self.text.lower() in message.lower())


IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "ErrImageNeverPull", "RegistryUnavailable"})

RULES: tuple[Rule, ...] = (
    # The node authorizer lost the pod-to-node edge (seen after a kube-apiserver restart): this
    # kubelet may not read the pod's Secrets and ConfigMaps; a new pod gets a new edge.
    Rule("the node authorizer: no relationship found", Fault.NODE,
         text="no relationship found between node"),
    # The kubelet's Secret/ConfigMap cache has not registered the pod (a kubelet restart).
    Rule("the kubelet's object cache: not registered", Fault.NODE, text="not registered"),
    Rule("the node's disk is full", Fault.NODE, text="no space left on device"),
    Rule("the image does not pull", Fault.TEMPLATE, reasons=IMAGE_REASONS),
    # A Secret, ConfigMap or key the template names is missing, or runAsNonRoot against the
    # image's user: the same on every node.
    Rule("the container's configuration", Fault.TEMPLATE,
         reasons=frozenset({"CreateContainerConfigError"})),
    Rule("not said by the pod's status", Fault.UNKNOWN),
)


@dataclass(frozen=True)
class Stuck:
    """Why a bound pod has not started: the kubelet's waiting reason and message of its first
    waiting container (init containers first), and the rule that judged whose fault it is."""

    container: str | None
    reason: str
    message: str
    fault: Fault
    rule: str

    def said(self) -> str:
        """The kubelet's words, as the Events quote them."""
        where = f"container {self.container}: " if self.container else ""
        return f"{where}{self.reason}" + (f": {self.message}" if self.message else "")


def judge(reason: str, message: str) -> Rule:
    """The first rule of RULES matching the kubelet's reason and message."""
    return next(r for r in RULES if r.matches(reason, message))


def _statuses(pod: Obj) -> list[Obj]:
    status = pod.get("status", {})
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def stuck(pod: Obj) -> Stuck | None:
    """Why `pod` has not started (see the module's doc), or None: unbound, deleting, past
    Pending, or a container of it runs."""
    status = pod.get("status", {})
    if (not pod.get("spec", {}).get("nodeName") or pod["metadata"].get("deletionTimestamp")
            or status.get("phase", "Pending") != "Pending"):
        return None
    statuses = _statuses(pod)
    if any("running" in (cs.get("state") or {}) for cs in statuses):
        return None
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting")
        if isinstance(waiting, dict) and waiting.get("reason") and waiting["reason"] not in (
                "PodInitializing",):  # an app container waiting for the init containers
            reason, message = str(waiting["reason"]), str(waiting.get("message") or "")
            rule = judge(reason, message)
            return Stuck(cs.get("name"), reason, message[:MESSAGE_MAX], rule.fault, rule.name)
    # No container status yet (the kubelet has not got to it), or only PodInitializing.
    reason = "PodInitializing" if statuses else "NoContainerStatus"
    rule = judge(reason, "")
    return Stuck(None, reason, "", rule.fault, rule.name)
