"""PURE: the hosts to publish, from the view's render: new hosts held back while the survivors
of a failure regroup (regroup.held), and for a moment a host Horovod missed (regroup.missed).
The loop asks `listing` before and after each pass, so the file never waits for the pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.decide import hostlist, regroup
from supervisor.decide.beats import Beat, Driver
from supervisor.decide.hostlist import Rendered
from supervisor.decide.plan import Note, published_hosts
from supervisor.model import EventSpec


@dataclass(frozen=True)
class Listing:
    """What the host list is decided from, besides the view's render."""

    view_render: Rendered  # the view's usable hosts and why others are left out
    published: str  # the discovery file as published ("" while withdrawn)
    regroup: regroup.Pending | None  # a failure the survivors have not regrouped from
    beats: tuple[Beat, ...]  # the hook's heartbeats (empty: no horovodrun or no hook)
    driver: Driver | None  # what the driver hook said last (None: no horovodrun or no hook)
    listed_since: Mapping[str, float]  # host -> in the file since (monotonic)
    reannounced: Mapping[str, tuple[int, float]]  # host -> (world seq, out until)
    held_said: bool  # the hold-back of this regroup was said already
    running: bool  # horovodrun runs with the hook channel
    now: float


@dataclass(frozen=True)
class Listed:
    host_list: Rendered  # the hosts to publish, and why the others are left out
    regroup: regroup.Pending | None
    reannounced: Mapping[str, tuple[int, float]]
    held_said: bool
    notes: tuple[Note, ...] = ()


def listing(x: Listing, slots_per_worker: int, min_np: int, max_np: int) -> Listed:
    """The hosts to publish: the view's usable hosts, minus new ones held back while the
    survivors of a failure regroup (regroup.held), minus, for a moment, a host Horovod missed
    (regroup.missed: taken out once per world the driver assigns, so that its discovery sees
    it appear again)."""
    notes: list[Note] = []
    host_list, pending, held_said = x.view_render, x.regroup, x.held_said
    if pending is None or not x.running:
        pending = None
    else:
        listed = published_hosts(x.published)
        waits = x.driver is not None and x.driver.waits_for_hosts
        held = regroup.held(pending, x.beats, listed=listed, usable=frozenset(x.view_render.hosts),
                            slots_per_worker=slots_per_worker, min_np=min_np, now=x.now,
                            driver_waits=waits)
        if held:
            if not held_said:
                held_said = True
                notes.append(Note("info", "discovery.held", {
                    "hosts": sorted(held), "since_failure_s": round(x.now - pending.since, 2)}))
            host_list = hostlist.hold_back(host_list, held, slots_per_worker)
        elif regroup.over(pending, x.beats, x.now, driver_waits=waits):
            if held_said:
                held_said = False
                notes.append(Note("info", "discovery.released", {
                    "waited_s": round(x.now - pending.since, 2),
                    "regrouped": regroup.regrouped(pending, x.beats), "driver_waits": waits}))
            pending = None
    reannounced = dict(x.reannounced)
    driver = x.driver
    if driver is None or not driver.world_seq:
        return Listed(host_list, pending, reannounced, held_said, tuple(notes))
    out = {host for host, (_, until) in reannounced.items()
           if x.now < until and host in host_list.hosts}
    for host in regroup.missed(x.listed_since, driver.world, driver.world_at,
                               listed=frozenset(host_list.hosts),
                               slots_per_worker=slots_per_worker, max_np=max_np, now=x.now,
                               resetting=regroup.in_an_init(x.beats, driver.world)):
        if host in out or host not in host_list.hosts or \
                reannounced.get(host, (-1, 0.0))[0] == driver.world_seq:
            continue
        reannounced[host] = (driver.world_seq, x.now + regroup.REANNOUNCE_OUT_S)
        out.add(host)
        waited = round(x.now - x.listed_since.get(host, x.now), 1)
        notes.append(Note("warning", "discovery.reannounced", {
            "host": host, "listed_s": waited, "world": sorted(driver.world)}, EventSpec(
            "Warning", "HostReannounced", "Discovery",
            f"{host} was listed for {waited}s but horovodrun's last world "
            f"({len(driver.world)} hosts) left it out: Horovod missed its arrival (it came "
            f"during a reset); taken out of the host list for "
            f"{regroup.REANNOUNCE_OUT_S:g}s and listed again")))
    if out:
        host_list = hostlist.hold_back(host_list, frozenset(out), slots_per_worker)
    return Listed(host_list, pending, reannounced, held_said, tuple(notes))
