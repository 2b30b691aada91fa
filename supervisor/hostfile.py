"""ADAPTER: the host list as published: the discovery file and, with SSH_HOST_KEYS=worker, its
known_hosts beside it. On each pass it renders the view when what the render reads changed
(decide/hostlist.py; ~10 ms at 10,000 workers), asks listing.listing and hostlist.decide (pure)
what to publish, and writes the file (discovery.py) only when it changed, or withdraws it. It
holds the render's caches and what was published; the loop (loop.py) calls `sync`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor import discovery, hostkeys
from supervisor.channel import HookChannel
from supervisor.config import Config, SshHostKeys, known_hosts_path
from supervisor.decide import fleet, hostlist, listing
from supervisor.decide.fleet import Fleet
from supervisor.decide.hostlist import Publish, Rendered
from supervisor.decide.listing import Listed
from supervisor.decide.memory import Memory
from supervisor.metrics import Metrics
from supervisor.model import EventSpec
from supervisor.observe import ClusterView
from supervisor.reports import Reports
from supervisor.workers import pod_name


class HostFile:
    """The discovery file of one supervisor process and what it was rendered from."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, reports: Reports, channel: HookChannel | None,
                 clock: Callable[[], float]) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.reports, self.channel, self.clock = reports, channel, clock
        # host string -> UID of the first pod that had it (Horovod blacklists names for good)
        self.first_owner: dict[str, str] = {}
        self.published: str | None = None  # the file's content; None while withdrawn
        self.known_hosts: str | None = None  # the host keys last written
        self.key_lines = hostkeys.KnownHosts()  # the host keys' lines (a render cache)
        # the view's last render, and what it was made of (view version, ...)
        self.view_render: Rendered | None = None
        self.view_render_from: tuple[object, ...] = ()
        # the host list: view_render less the hosts held back for now (listing.listing);
        # what is published while the file is not withdrawn
        self.host_list: Rendered | None = None
        self.memo = hostlist.Memo()
        # the pods of the active slots, for the fleet they were computed from
        self.active_pods: tuple[Fleet | None, frozenset[str] | None] = (None, None)

    def sync(self, c: Memory, view: ClusterView, *, running: bool, now: float,
             earliest: float | None) -> Listed:
        """Publish the host list for `view` and the memory `c` (the file written only when
        it changed), or withdraw the file; return what the listing decided (on.listed keeps
        it in the memory)."""
        cfg = self.cfg
        fl = c.fleet
        retiring = frozenset() if fl is None else frozenset(
            pod_name(cfg.job_name, i, fl.slots[i].incarnation) for i in fl.retiring())
        # Render only when something it reads changed: at 10,000 workers a render is ~10 ms
        # and the tick comes every RESYNC_SECONDS.
        hung = c.hung
        declared = c.failed
        if fl is not None and self.active_pods[0] is not fl:
            self.active_pods = (fl, fleet.current_pods(fl, cfg.job_name))
        active = self.active_pods[1] if fl is not None else None
        talking = c.kept  # on.heard
        staying = c.leave_waits
        inputs = (view.version, retiring, len(self.first_owner), hung, declared, active,
                  talking, staying)
        if self.view_render is None or inputs != self.view_render_from:
            self.view_render = hostlist.render(view, cfg.slots_per_worker, cfg.host_mode,
                                              self.first_owner, retiring=retiring, hung=hung,
                                              declared=declared, active=active,
                                              heartbeating=talking, staying=staying,
                                              memo=self.memo)
            self.view_render_from = inputs
            self.metrics.workers_listed.set(len(view.pods))
            self.metrics.workers_live.set(self.view_render.live)
        # New hosts may be held back while survivors regroup: that depends on the time too.
        out = self._listing(c, self.view_render, running=running, now=now)
        host_list = out.host_list
        if host_list is not self.host_list:
            self.reports.membership(self.host_list, host_list, running=running)
            self.host_list = host_list
            self.metrics.workers_usable.set(len(host_list.lines))
        self.metrics.workers_desired.set(len(fl.active()) if fl is not None else 0)
        decision = hostlist.decide(view.synced, view.broken_for(now), cfg.staleness_s,
                                    host_list)
        if isinstance(decision, Publish):
            if decision.content == self.published:
                return out
            # Before the list that names the hosts; every usable host, held back or not.
            self._write_known_hosts(view, self.view_render)
            discovery.write_atomic(cfg.discovery_file, decision.content)
            written = self.clock()
            # Only hosts never published before (a set difference, not 10,000 lookups).
            for host in host_list.hosts.keys() - self.first_owner.keys():
                self.first_owner[host] = view.pods[host_list.hosts[host]]["metadata"]["uid"]
            self.metrics.discovery_writes.inc()
            latency = None if earliest is None else written - earliest
            if latency is not None:
                self.metrics.discovery_latency.observe(latency)
            self.log.info("discovery.written", hosts=len(host_list.lines),
                          slots=host_list.slots(cfg.slots_per_worker),
                          latency_ms=None if latency is None else round(latency * 1000, 2))
            self.published = decision.content
        elif self.published is not None or discovery.read_current(cfg.discovery_file) is not None:
            discovery.withdraw(cfg.discovery_file)
            self.metrics.discovery_withdrawals.inc()
            self.log.warning("discovery.withdrawn", reason=decision.reason)
            if running:
                self.events(EventSpec("Warning", "DiscoveryWithdrawn", "Discovery",
                                      f"host list withdrawn: {decision.reason}"))
            self.published = None
        return out

    def _write_known_hosts(self, view: ClusterView, usable: Rendered) -> None:
        """SSH_HOST_KEYS=worker: pin each usable host to its pod's own key (hostkeys.py). The
        hosts held back from the list (a regroup, a reannounce) keep theirs: the driver may
        have assigned one of them to the world it is making, and its ssh must not then fail
        for the key (exit 255, counted as the worker's failure: make test, 2026-12-02)."""
        path = known_hosts_path(self.cfg)
        if self.cfg.ssh_host_keys != SshHostKeys.WORKER or path is None:
            return
        text, missing = self.key_lines.update(usable.hosts, view.pods, self.cfg.ssh_port)
        if text == self.known_hosts:
            return
        discovery.write_atomic(path, text)
        if missing:
            self.log.warning("ssh.host_key_missing", hosts=list(missing),
                             note="no host key annotation: the driver's ssh refuses them")
        self.known_hosts = text

    def _listing(self, c: Memory, view_render: Rendered, *, running: bool,
                 now: float) -> Listed:
        """The hosts to publish (listing.listing, pure): gather its inputs, say its notes."""
        cfg = self.cfg
        running = self.channel is not None and running
        pending = c.regroup if running else None
        # The beats: whom a regroup waits for, and whether the world's workers reset (a host
        # not in the world then was not missed).
        beats = (tuple(self.channel.snapshot().beats.values())
                 if running and self.channel is not None else ())
        driver = self.channel.driver() if running and self.channel is not None else None
        out = listing.listing(listing.Listing(
            view_render=view_render, published=self.published or "", regroup=pending, beats=beats,
            driver=driver, listed_since=c.listed_since, reannounced=c.reannounced,
            held_said=c.held_said, running=running, now=now),
            cfg.slots_per_worker, cfg.min_np, cfg.max_np)
        self.reports.say(out.notes)
        return out
