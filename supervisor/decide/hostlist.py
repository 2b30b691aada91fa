"""PURE: the host list, what Horovod's host-discovery script prints.

`render` turns the cluster view into sorted `host:slots` lines, and `decide` says whether to
publish them or withdraw the file (view not synced, watch stale, or no usable worker: horovodrun
treats empty output as "every host is gone", but keeps its previous host set when the script
fails). Writing the file is supervisor/discovery.py's.

Host names: by default a worker is its pod IP (HostMode.POD_IP). A pod IP is routable at once,
needs no DNS, and a replacement pod gets a new one. Horovod blacklists a failed host string for
the rest of the job, so a string must never come back for a later pod: if a pod shows up with a
host string an earlier pod (other UID) already had, it is left out and reported (HOST_REUSED).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from supervisor.decide import podindex
from supervisor.decide.podindex import PodIndex
from supervisor.observe import (
    ClusterView,
    Kind,
    Obj,
    Unusable,
    pod_problem,
)
from supervisor.workers import LABEL_SLOT


class HostMode(StrEnum):
    """What a worker is called in the discovery file (and so by Horovod, ssh and its blacklist)."""

    POD_IP = "ip"  # the pod IP: resolvable at once, no DNS needed
    POD_DNS = "dns"  # <hostname>.<subdomain>.<namespace>.svc: needs a headless Service


# A worker's node is down (not Ready, or a not-ready/unreachable taint): out of the file unless
# its training processes heartbeat (a blip).
NODE_DOWN = frozenset({Unusable.NODE_NOT_READY, Unusable.NODE_TAINTED})
# What a pod on a down node shows: its node's problem, or Ready=False, which the node controller
# sets on every pod of a node it marks NotReady (after an API outage: the kubelets' missed
# heartbeats) and which the render sees first.
KEPT_WHILE_HEARTBEATING = NODE_DOWN | {Unusable.NOT_READY}


@dataclass(frozen=True)
class Rendered:
    """Discovery lines plus the workers left out and why (pod name -> reason)."""

    lines: tuple[str, ...]
    hosts: Mapping[str, str]  # host -> pod name, for the usable workers
    left_out: Mapping[str, Unusable]
    live: int = 0  # worker pods neither terminal nor being deleted (for a metric)

    @cached_property
    def content(self) -> str:
        """The file's text (made once: at 10,000 workers every pass compares it)."""
        return "\n".join(self.lines) + "\n" if self.lines else ""

    def slots(self, per_worker: int) -> int:
        return len(self.lines) * per_worker


def addresses(pods: Mapping[str, Obj], mode: HostMode) -> dict[str, str]:
    """Each worker's host string and its pod's IP (what its processes send from): for the
    pods with both. A host string two pods claim (pod DNS names under a template that sets
    one hostname) goes with the IP of the greater pod name."""
    made = Addresses(mode)
    for name, pod in pods.items():
        made.put(name, pod)
    return made.out


class Addresses:
    """`addresses`, kept up to date from the view's change log (the loop holds one, asked on
    every change of an address): a pass costs what the changes cost, not a walk of 10,000 pods
    (at 10,000 workers that walk was a tenth of the loop's time while failures came in). The
    same result as `addresses` of the view's pods."""

    def __init__(self, mode: HostMode) -> None:
        self.mode = mode
        self.of: dict[str, tuple[str, str]] = {}  # pod name -> (host, IP)
        self.claims: dict[str, dict[str, str]] = {}  # host -> {pod name: IP}
        self.out: dict[str, str] = {}  # host -> IP
        self.seen: tuple[int, int] | None = None  # (id of the view, its version)

    def update(self, view: ClusterView) -> Mapping[str, str]:
        """The addresses of `view`'s pods now."""
        changes = (view.changes_since(self.seen[1])
                   if self.seen is not None and self.seen[0] == id(view) else None)
        if changes is None:
            self.of, self.claims, self.out = {}, {}, {}
            names: Iterable[str] = view.pods
        else:
            names = {name for kind, name in changes if kind is Kind.POD}
        for name in names:
            self.put(name, view.pods.get(name))
        self.seen = (id(view), view.version)
        return self.out

    def put(self, name: str, pod: Obj | None) -> None:
        """Pod `name` is `pod` now (None: gone)."""
        if (old := self.of.pop(name, None)) is not None:
            self._claim(old[0], name, None)
        host = None if pod is None else host_of(pod, self.mode)
        ip = None if pod is None else pod.get("status", {}).get("podIP")
        if host and ip:
            self.of[name] = (host, ip)
            self._claim(host, name, ip)

    def _claim(self, host: str, name: str, ip: str | None) -> None:
        claims = self.claims.setdefault(host, {})
        if ip is None:
            claims.pop(name, None)
        else:
            claims[name] = ip
        if claims:
            self.out[host] = claims[max(claims)]
        else:
            del self.claims[host]
            self.out.pop(host, None)


def host_of(pod: Obj, mode: HostMode) -> str | None:
    """Return the host string Horovod uses for this pod, or None if it has none yet."""
    if mode is HostMode.POD_IP:
        ip = pod.get("status", {}).get("podIP")
        # IPv6 literals break horovodrun's host:slots parser (it splits on ':').
        return ip if ip and ":" not in ip else None
    meta, spec = pod["metadata"], pod.get("spec", {})
    subdomain = spec.get("subdomain")
    if not subdomain:
        return None
    return f"{spec.get('hostname') or meta['name']}.{subdomain}.{meta['namespace']}.svc"


class Memo:
    """What `render` concluded, kept between passes, so that a pass after a few changes costs
    what the changes cost, not what 10,000 workers cost.

    Per pod: the judgement (problem, host, live) with the pod and node objects it was made of
    (identity: the view replaces an object when it changes). And the last result, which the
    next render updates for the pods the view's change log names (plus the pods on a changed
    node, and the pods a change of the other inputs reaches: `_touched`), as long as the view,
    slots, host mode and first-owner map (which may only grow) are the same objects and no host
    is claimed twice; else a full pass over the pods, still reusing the judgements of unchanged
    ones. Same result either way.
    """

    def __init__(self) -> None:
        # pod name -> (pod object, node object, problem, host, live)
        self.judged: dict[str, tuple[Obj, Obj | None, Unusable | None, str | None, bool]] = {}
        self.on_node: dict[str, set[str]] = {}  # node name -> pods judged on it
        self.by_host: dict[str, set[str]] = {}  # host -> pods judged with it
        self.by_uid: dict[str, str] = {}  # UID -> the pod judged with it
        self.version: int | None = None  # the view's version the result below is of
        self.inputs: tuple[object, ...] = ()
        self.args: _Args | None = None  # what the result below was rendered with
        self.owners: set[str] = set()  # the hosts of the first-owner map at that render
        self.hosts: dict[str, str] = {}
        self.left_out: dict[str, Unusable] = {}
        self.lines: list[str] = []  # sorted
        self.live = 0
        self.shadowed = False  # a usable pod lost its host to another: full passes only
        # the last result handed out, while the four above have not changed since: a change of
        # a pod that changes none of them (scheduled, a condition) gets the same object, which
        # the host list, the publish and the membership report then know at a glance
        self.rendered: Rendered | None = None

    def judge(self, name: str, pod: Obj, nodes: Mapping[str, Obj], mode: HostMode,
              ) -> tuple[Unusable | None, str | None, bool]:
        """The pod's judgement, made again only if its object or its node's changed."""
        node_name = pod.get("spec", {}).get("nodeName") or ""
        node = nodes.get(node_name)
        seen = self.judged.get(name)
        if seen is not None and seen[0] is pod and seen[1] is node:
            return seen[2], seen[3], seen[4]
        problem, host, live = _judge(pod, nodes, mode)
        if seen is not None:
            self._unindex(name, seen[0], seen[3])
        self.judged[name] = (pod, node, problem, host, live)
        self.on_node.setdefault(node_name, set()).add(name)
        if host is not None:
            self.by_host.setdefault(host, set()).add(name)
        if uid := pod["metadata"].get("uid"):
            self.by_uid[uid] = name
        return problem, host, live

    def forget(self, name: str) -> None:
        seen = self.judged.pop(name, None)
        if seen is not None:
            self._unindex(name, seen[0], seen[3])

    def _unindex(self, name: str, pod: Obj, host: str | None) -> None:
        for index, key in ((self.on_node, pod.get("spec", {}).get("nodeName") or ""),
                           (self.by_host, host)):
            names = index.get(key) if key is not None else None
            if names is not None:
                names.discard(name)
                if not names:
                    del index[key]  # type: ignore[arg-type]
        uid = pod["metadata"].get("uid")
        if uid and self.by_uid.get(uid) == name:
            del self.by_uid[uid]


def _judge(pod: Obj, nodes: Mapping[str, Obj], mode: HostMode,
           ) -> tuple[Unusable | None, str | None, bool]:
    """(why the pod is unusable or None, its host string, whether it is live)."""
    problem = pod_problem(pod, nodes)
    host = host_of(pod, mode)
    if problem is None and host is None:
        problem = Unusable.NO_ADDRESS
    live = not pod["metadata"].get("deletionTimestamp") and pod.get("status", {}).get(
        "phase") not in ("Succeeded", "Failed")
    return problem, host, live


def kept_while_heartbeating(view: ClusterView, mode: HostMode,
                            heartbeating: Callable[[], Iterable[str]],
                            index: PodIndex | None = None) -> frozenset[str]:
    """PURE: the hosts of worker pods on nodes that are down (not Ready, or a node-down taint),
    or marked not Ready from outside (`marked_not_ready`: the node controller marks every pod
    of a node it marks NotReady, and the kubelet marks them Ready again only at its next
    update, seconds after its node is Ready again), among `heartbeating()` (hosts whose
    training processes heartbeat now; asked only while there is such a pod): render keeps them
    through a kubelet's blip and an API outage's aftermath. `index`: the view's facts
    (podindex.py; None: built here)."""
    ix = index if index is not None else podindex.build(view.pods, view.nodes, "")
    names = set(ix.marked).union(*(ix.on_node.get(n, ()) for n, f in ix.nodes.items()
                                   if f.problem in NODE_DOWN))
    hosts = {h for name in names if (h := host_of(view.pods[name], mode))}
    if not hosts:
        return frozenset()
    return frozenset(hosts.intersection(heartbeating()))


@dataclass(frozen=True)
class _Args:
    """What a render depends on besides the view."""

    slots: int
    mode: HostMode
    first_owner: Mapping[str, str]
    retiring: frozenset[str]
    hung: frozenset[str] = frozenset()
    declared: frozenset[str] = frozenset()
    active: frozenset[str] | None = None
    heartbeating: frozenset[str] = frozenset()
    staying: frozenset[str] = frozenset()

    def placed(self, name: str, pod: Obj, problem: Unusable | None,
               host: str | None) -> Unusable | None:
        """The problem after the checks that depend on more than the pod and its node."""
        if problem is Unusable.DELETING and name in self.staying and host is not None:
            problem = None  # evicted, held, and the last of its world: it leaves later
        if problem in KEPT_WHILE_HEARTBEATING and host in self.heartbeating:
            problem = None  # its node blipped, its training processes still talk to us
        if problem is None and (owner := self.first_owner.get(host)) is not None and (  # type: ignore[arg-type]
                owner != pod["metadata"]["uid"]):
            return Unusable.HOST_REUSED
        if problem is None and name in self.retiring:
            return Unusable.SCALING_IN
        if problem is None and pod["metadata"].get("uid") in self.hung:
            return Unusable.HUNG
        if problem is None and pod["metadata"].get("uid") in self.declared:
            return Unusable.FOUND_FAILED
        if (problem is None and self.active is not None and name not in self.active
                and LABEL_SLOT in (pod["metadata"].get("labels") or {})):
            return Unusable.SLOT_NOT_ACTIVE
        return problem


def render(
    view: ClusterView, slots: int, mode: HostMode, first_owner: Mapping[str, str], *,
    retiring: frozenset[str] = frozenset(), hung: frozenset[str] = frozenset(),
    declared: frozenset[str] = frozenset(), active: frozenset[str] | None = None,
    heartbeating: frozenset[str] = frozenset(), staying: frozenset[str] = frozenset(),
    memo: Memo | None = None,
) -> Rendered:
    """Return the sorted `host:slots` lines of the usable workers in `view`.

    `first_owner` maps every host string ever published to the UID of the pod that had it; a
    different pod with the same string is left out (Horovod would treat it as blacklisted).
    `retiring`: pods being scaled in, left out first so that horovodrun lets them go.
    `hung`: UIDs of pods the supervisor found Hung (failed while they still look Running and
    Ready: Memory.hung), never listed again.
    `declared`: UIDs of pods the supervisor declared failed for any other cause: out at once,
    not when their deletion shows (a node Lease expired while the node still says Ready).
    `active`: names of the pods of the active slots' current incarnations (None: the
    supervisor does not own the workers); a pod it created (slot label) for anything else,
    an old incarnation or a dropped slot, is left out.
    `heartbeating`: hosts on a node that is not Ready (or carries a node-down taint) whose
    training processes heartbeat: kept, since a one-second Ready blip of a kubelet has not
    lost them (the node's grace decides, on the failure path, when it has).
    `staying`: pods being deleted gracefully (an eviction their entrypoint holds) that stay
    listed: announced to go, they are the last of Horovod's world and leave once another
    worker joined (core's leave step).
    `memo`: reuse what earlier calls concluded (see Memo; the result is the same).
    """
    if memo is None:
        memo = Memo()
    args = _Args(slots, mode, first_owner, retiring, hung, declared, active, heartbeating,
                 staying)
    inputs = (id(view), slots, mode, id(first_owner), active is None)
    changes = (view.changes_since(memo.version)
               if memo.version is not None and memo.inputs == inputs and memo.args else None)
    if changes is not None and memo.args is not None:
        touched = _touched(memo, memo.args, args)
        # (a pod updated costs about three judged in a full pass: many touched, a full one)
        changes = (None if len(touched) > max(64, len(view.pods) // 8)
                   else [*changes, *((Kind.POD, n) for n in touched)])
    if changes is None or not _update(memo, view, changes, args):
        _full(memo, view, args)
        memo.owners = set(first_owner)
        memo.rendered = None
    memo.version, memo.inputs, memo.args = view.version, inputs, args
    if memo.rendered is None:
        memo.rendered = Rendered(lines=tuple(memo.lines), hosts=dict(memo.hosts),
                                 left_out=dict(memo.left_out), live=memo.live)
    return memo.rendered


def _full(memo: Memo, view: ClusterView, args: _Args) -> None:
    hosts: dict[str, str] = {}
    left_out: dict[str, Unusable] = {}
    live_count = usable = 0
    for name, pod in view.pods.items():
        problem, host, live = memo.judge(name, pod, view.nodes, args.mode)
        live_count += live
        problem = args.placed(name, pod, problem, host)
        if problem is None:
            hosts[host] = name  # type: ignore[index]
            usable += 1
        else:
            left_out[name] = problem
    memo.shadowed = usable > len(hosts)
    for name in [n for n in memo.judged if n not in view.pods]:
        memo.forget(name)
    memo.hosts, memo.left_out, memo.live = hosts, left_out, live_count
    memo.lines = sorted(f"{h}:{args.slots}" for h in hosts)


def _touched(memo: Memo, old: _Args, new: _Args) -> set[str]:
    """The pods whose result a change of the inputs besides the view may change (each set
    compared only when it is another object: the loop hands the same one while unchanged), and
    the hosts that got a first owner since (`memo.owners` takes them in)."""
    names: set[str] = set()
    for a, b in ((old.retiring, new.retiring), (old.staying, new.staying),
                 (old.active, new.active)):
        if a is not b and a is not None and b is not None:
            names |= a ^ b
    for a, b in ((old.hung, new.hung), (old.declared, new.declared)):
        if a is not b:
            names.update(n for uid in a ^ b if (n := memo.by_uid.get(uid)) is not None)
    hosts: set[str] = set()
    if old.heartbeating is not new.heartbeating:
        hosts |= old.heartbeating ^ new.heartbeating
    if len(new.first_owner) != len(memo.owners):
        owned = new.first_owner.keys() - memo.owners
        memo.owners |= owned
        hosts |= owned
    for h in hosts:
        names |= memo.by_host.get(h, set())
    return names


def _update(memo: Memo, view: ClusterView, changes: list[tuple[Kind, str]],
            args: _Args) -> bool:
    """Update the memo's last result for the changed pods and nodes; False if only a full
    pass can say (a host claimed by two pods: which one wins depends on the view's order)."""
    if memo.shadowed:
        return False
    names: set[str] = set()
    for kind, name in changes:
        if kind is Kind.POD:
            names.add(name)
        else:
            names |= memo.on_node.get(name, set())
    for name in names:
        seen = memo.judged.get(name)
        was = _counted(memo, name, seen)
        if seen is not None:  # take out what it counted for
            memo.live -= seen[4]
            if memo.left_out.pop(name, None) is None and seen[3] is not None and \
                    memo.hosts.get(seen[3]) == name:
                del memo.hosts[seen[3]]
                line = f"{seen[3]}:{args.slots}"
                i = bisect.bisect_left(memo.lines, line)
                if i < len(memo.lines) and memo.lines[i] == line:
                    del memo.lines[i]
        pod = view.pods.get(name)
        if pod is None:
            memo.forget(name)
            if was is not None:
                memo.rendered = None
            continue
        problem, host, live = memo.judge(name, pod, view.nodes, args.mode)
        memo.live += live
        problem = args.placed(name, pod, problem, host)
        if problem is not None:
            memo.left_out[name] = problem
        elif host in memo.hosts:
            return False
        else:
            memo.hosts[host] = name  # type: ignore[index]
            bisect.insort(memo.lines, f"{host}:{args.slots}")
        if _counted(memo, name, memo.judged.get(name)) != was:
            memo.rendered = None
    return True


def _counted(memo: Memo, name: str, seen: tuple[Obj, Obj | None, Unusable | None, str | None,
                                                bool] | None) -> tuple[object, ...] | None:
    """What pod `name` (judged as `seen`) counts for in the memo's result: why it is left out,
    the host it is listed under, whether it is live; None when it is in none of it."""
    if seen is None:
        return None
    listed = seen[3] if seen[3] is not None and memo.hosts.get(seen[3]) == name else None
    return memo.left_out.get(name), listed, seen[4]


def hold_back(rendered: Rendered, hosts: frozenset[str], slots: int) -> Rendered:
    """Return `rendered` without `hosts` (left out as HELD; see regroup.py)."""
    if not hosts:
        return rendered
    kept = {h: name for h, name in rendered.hosts.items() if h not in hosts}
    left_out = {**rendered.left_out,
                **{name: Unusable.HELD for h, name in rendered.hosts.items() if h in hosts}}
    return Rendered(lines=tuple(sorted(f"{h}:{slots}" for h in kept)), hosts=kept,
                    left_out=left_out, live=rendered.live)


@dataclass(frozen=True)
class Publish:
    content: str


@dataclass(frozen=True)
class Withdraw:
    reason: str


def decide(synced: bool, broken_for_s: float, staleness_s: float,
           rendered: Rendered) -> Publish | Withdraw:
    """Return whether to publish the rendered hosts or withdraw the file (and why)."""
    if not synced:
        return Withdraw("view not synced")
    if broken_for_s > staleness_s:
        return Withdraw(f"watch broken for {broken_for_s:.0f}s (> {staleness_s:g}s)")
    if not rendered.lines:
        return Withdraw("no usable worker")
    return Publish(rendered.content)
