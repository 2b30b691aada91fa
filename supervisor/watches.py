"""What the watches showed, for the loop: the cluster view, each pod's watch memory and the
reflectors' news about themselves.

The loop hands each watch event and each reflector's news here; this adapter applies it to the
view (`observe.ClusterView`), asks the decisions what a single event decides (`decide.on`:
a pod classified once, a node down or back, the node watch back from an outage) and returns
the memory they returned, which the loop keeps. It says what a watch's health changes (synced,
broken, connected, a relist) and returns a watch's fatal error as a decision of `on.fatal`.
It holds the view and the pods' watch memories (what each pod's events showed, by pod: kept
here, not in the memory, where a copy of the whole map per event would cost O(pods)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor.config import Config
from supervisor.decide import memory, on, podindex
from supervisor.decide.classify import NodeState, PodMemory
from supervisor.decide.memory import Memory
from supervisor.metrics import Metrics
from supervisor.model import EventSpec, SourceState, WatchEvent
from supervisor.nodeleases import NodeLeases
from supervisor.observe import ClusterView, EventType, Kind, Obj, SourceHealth, node_problem
from supervisor.reports import Reports


class Watches:
    """The view and the pods' watch memories; written only by the loop's thread."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, reports: Reports, leases: NodeLeases | None) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.reports, self.leases = reports, leases
        self.view = ClusterView()
        self.index = podindex.PodIndex(cfg.job_name)  # the view's facts (podindex.py)
        self.pods: dict[str, PodMemory] = {}  # what each pod's events showed, by name

    def event(self, c: Memory, ev: WatchEvent) -> tuple[Memory, bool]:
        """A pod's or a node's watch event: decided on (on.pod_seen, on.node_seen), then
        applied to the view. Returns the memory and whether the view changed."""
        c = self._pod(c, ev) if ev.kind is Kind.POD else self._node(c, ev)
        changed = self.view.apply(ev.kind, ev.type, ev.obj)
        if changed:
            name = ev.obj["metadata"]["name"]
            if ev.kind is Kind.POD:
                self.index.drop(name) if ev.type is EventType.DELETED else self.index.put(ev.obj)
            else:
                self.index.drop_node(name) if ev.type is EventType.DELETED else (
                    self.index.put_node(ev.obj))
        self.view.health[ev.kind].last_event_at = ev.at
        return c, changed

    def _node(self, c: Memory, ev: WatchEvent) -> Memory:
        """A node down or up again (on.node_seen), said when that changes: new workers are kept
        off a node while it is down, and its workers' loss is timed from then."""
        name = ev.obj["metadata"]["name"]
        node = None if ev.type is EventType.DELETED else ev.obj
        was = c.node_down.get(name)
        c = on.node_seen(c, name, node, ev.at)
        since = c.node_down.get(name)
        if was is None and since is not None:
            problem = node_problem(node)
            self.log.info("node.down", node=name,
                          why="deleted" if node is None else problem.value if problem else "")
        elif was is not None and since is None:
            self.log.info("node.up", node=name, down_s=round(ev.at - was, 1))
        return c

    def node_state(self, c: Memory, pod: Obj, now: float) -> NodeState:
        name = pod.get("spec", {}).get("nodeName") or ""
        lease_age = self.leases.age(name, now) if self.leases is not None else None
        return memory.node_state(c, self.view.nodes, pod, lease_age, now)

    def _pod(self, c: Memory, ev: WatchEvent) -> Memory:
        """Classify a pod event (once synced), then remember what it showed."""
        obj = ev.obj
        if ev.relist and ev.type is EventType.DELETED:
            # Deleted while the watch was down: the relist only knows its name. Judge it from
            # the last object seen (uid, labels, slot), not as a stranger.
            obj = self.view.pods.get(obj["metadata"]["name"]) or obj
        meta = obj["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        before = self.pods.get(name)
        settings = memory.classify_settings(self.cfg)
        judged = self.view.synced and uid not in c.failed
        c, record = on.pod_seen(
            c, on.PodEvent(ev.type, obj, ev.at, ev.relist), before,
            synced=self.view.synced, node=self.node_state(c, obj, ev.at), settings=settings)
        if judged:
            self.reports.helper_exits(obj, before, settings)
        if record is None:
            self.pods.pop(name, None)
            self.reports.forget_pod(uid)
        else:
            self.pods[name] = record
        return c

    def source(self, c: Memory, s: SourceState) -> Memory:
        """A reflector's news about itself. The lease watch is not part of the view; only its
        fatal news come here."""
        health = self.view.health.get(s.kind) or SourceHealth()
        health.last_event_at = s.at
        if s.synced:
            if not health.synced:
                self.log.info("watch.synced", kind=s.kind.value)
            health.synced = True
        if s.relisted:
            self.metrics.watch_relists.labels(s.kind.value).inc()
        if s.broken is True:
            if health.broken_since is None:
                health.broken_since = s.at
            self.log.warning("watch.broken", kind=s.kind.value, reason=s.reason)
            if s.fatal:
                c = on.fatal(c, f"watching {s.kind.value}s failed for good: {s.reason}",
                             crashed=s.crashed)
                assert c.fatal is not None
                self.log.error("supervisor.crashed" if s.crashed else "kube.fatal",
                               kind=s.kind.value, reason=s.reason)
                self.events(EventSpec("Warning", "SupervisorCrashed" if s.crashed
                                      else "KubernetesAccessDenied", "Watch", c.fatal[1]))
        elif s.broken is False:
            if health.broken_since is not None:
                self.log.info("watch.connected", kind=s.kind.value,
                              broken_s=round(s.at - health.broken_since, 3))
                if s.kind is Kind.NODE:  # nodes it marks now may be its outage's artefact
                    c = on.node_watch_back(c, s.at, s.at - health.broken_since)
            health.broken_since = None
            self.metrics.watch_connects.labels(s.kind.value).inc()
        return c

    def ages(self, now: float) -> None:
        """The age of each watch's last event, as metrics."""
        for kind, health in self.view.health.items():
            if health.last_event_at is not None:
                self.metrics.watch_last_event_age.labels(kind.value).set(
                    max(0.0, now - health.last_event_at))
