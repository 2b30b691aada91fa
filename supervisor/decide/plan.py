"""PURE: from what the loop knows now to the workers it wants, level-triggered.

One of four steps: `verdicts.on_verdict` turns what the hook's heartbeats and the driver
revealed into failures and restarts of horovodrun, `failures.on_failures` decides on the
failures the loop classified (policy rules, restart budgets, which pods to delete, the job
failing), `plan` (here) reconciles the fleet, and `listing.listing` decides the hosts to publish
from the view's render (held back while survivors regroup, re-announced when Horovod missed
one). core.manage composes the first three (with the brake, the scan and the fence) into one
pass; `listing` is the host list's. The types they share (`Settings`, `Note`) are here.

`plan` is one step of the fleet's reconcile, in the style of controller-runtime's: it reads
the whole picture each time (the fleet of slots with their budgets, the worker pods the watch
shows, the discovery file as published, the pods being created and the ones admission refused,
a scale request) and returns the fleet it should be, the pods to create and delete, the
expectations to keep, and what to say. Nothing in it remembers what happened before except
through its inputs, so running it twice on the same picture asks for nothing new: a create
already asked for is an expectation (`expected`) until the watch shows the pod, and a pod
refused by admission waits in `waiting` until its backoff ends.

In order, as a person running the job would:
1. a scale request within the limits is applied (out of them, refused and dropped);
2. a scaled-out slot whose pod runs is confirmed; one not Running the scale-out timeout after
   the later of its adding and its pod's creation is rolled back (its pod deleted, the slot
   dropped with why); never while its create waits its turn (CREATE_BURST);
3. a scaled-in slot's pod is deleted once its host is out of the published file and horovodrun
   let it go (no ssh client left), or after the scale-in timeout; that delete is ours, never a
   failure; so is a leaving worker's (announced to go, `Leaving`), unless it is being deleted
   already (an eviction: its entrypoint ends once horovodrun let it go);
4. a worker whose address an earlier worker had (CNIs reuse IPs: Horovod blacklisted that host
   string for good) is replaced, no budget used, at most REUSED_LIMIT times per slot;
5. an expectation older than EXPECTATION_TIMEOUT_S is given up (the pod is created again),
   doubling for each time that pod's was given up in a row (up to UNSEEN_MAX_DOUBLINGS): a watch
   that lags behind an overloaded API server is not answered with a create a minute per pod;
6. a live pod of an older incarnation than its slot's (a late create by a leader that lost its
   lease, a delete that never happened) is deleted, once (ours);
7. every active slot whose current pod neither exists nor is expected nor waits gets one,
   once its backoff has passed, at most CREATE_BURST asked for and not seen at a time
   (replacements first), like a ReplicaSet's burstReplicas: a create decided now is made with
   what is kept off now, and its expectation's clock starts now;
8. fewer usable slots than MIN_NP: the job fails (WORKERS_LOST).

No I/O, no clock: `now` (monotonic) and `wall` (epoch, the fleet's clock) are passed in; what
needs the process tree (ssh clients per host) is counted by the adapter for the hosts
`retiring_hosts` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from supervisor.decide import fleet, hostlist, podindex
from supervisor.decide.fleet import Create, Fleet
from supervisor.decide.hostlist import HostMode, Rendered
from supervisor.decide.podindex import PodIndex
from supervisor.decide.script import DeletePod
from supervisor.model import EventSpec
from supervisor.observe import Obj, Unusable
from supervisor.workers import kept_off, pod_name

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    from supervisor.config import Config

REUSED_LIMIT = 5  # pods of one slot replaced because their IP was another worker's
EXPECTATION_TIMEOUT_S = 60.0  # a created pod not seen on the watch by then is created again
UNSEEN_MAX_DOUBLINGS = 4  # ... doubling per time in a row, to 16 minutes
HUNG_GRACE_S = 1  # a hung worker's pod is deleted with this grace: SIGKILL by its kubelet
# Creates asked for and not yet seen on the watch, at most (the ReplicaSet controller's
# burstReplicas). Without it a start at 10,000 workers asked for every pod in its first pass:
# the actuator's queue held minutes of creates made with the nodes kept off at that pass (81
# nodes the node controller had not yet untainted) and timed from it (expectations given up
# while still queued, asked for again): workers were kept off 81 of 101 nodes for good.
CREATE_BURST = 500


@dataclass(frozen=True)
class Settings:
    """What of the config `plan` needs (config.Config holds them)."""

    job: str
    host_mode: HostMode
    min_np: int
    max_np: int
    slots_per_worker: int
    scale_out_timeout_s: float
    scale_in_timeout_s: float

    @classmethod
    def of(cls, cfg: Config) -> Settings:
        return cls(cfg.job_name, cfg.host_mode, cfg.min_np, cfg.max_np, cfg.slots_per_worker,
                   cfg.scale_out_timeout_s, cfg.scale_in_timeout_s)


@dataclass(frozen=True)
class Picture:
    """Everything `plan` decides from."""

    fleet: Fleet
    pods: Mapping[str, Obj]  # the job's worker pods the watch shows, by name
    published: str  # the discovery file as published ("" while withdrawn)
    view_render: Rendered | None  # the last render of the view (why hosts are left out)
    reuse_checked: Rendered | None  # the render last looked at for reused addresses
    reused: Mapping[int, int]  # slot -> pods replaced for reused addresses so far
    scale_request: int | None  # desired workers asked for, not applied yet
    expected: Mapping[str, float]  # pods asked for, not seen yet -> since (monotonic)
    waiting: frozenset[str]  # pods admission refused, their backoff not over
    ssh_clients: Mapping[str, int]  # host -> horovodrun's ssh clients (retiring_hosts)
    now: float
    wall: float
    failed: frozenset[str] = frozenset()  # UIDs already classified failed or deleted by us
    lost_nodes: frozenset[str] = frozenset()  # nodes a new worker is kept off now (down)
    leaving: Mapping[str, Leaving] = field(default_factory=dict)  # pod -> announced to go
    index: PodIndex | None = None  # the facts of `pods` (podindex.py); None: built from them
    unseen: Mapping[str, int] = field(default_factory=dict)  # pod -> expectations given up


@dataclass(frozen=True)
class Leaving:
    """A worker pod announced to go (disruption.py), leaving gracefully since `since` (wall);
    its slot is at the next incarnation already."""

    slot: int
    uid: str
    node: str | None
    since: float
    why: str


@dataclass(frozen=True)
class Note:
    """One decision, as the adapter reports it: a log line (`event`, `fields`) at `level`, and
    a Kubernetes Event when it changes the job."""

    level: str  # "info" | "warning" | "error"
    event: str
    fields: Mapping[str, Any]
    k8s: EventSpec | None = None


@dataclass(frozen=True)
class Plan:
    fleet: Fleet
    reused: Mapping[int, int]
    reuse_checked: Rendered | None
    scale_request: int | None
    expected: Mapping[str, float]
    creates: tuple[Create, ...] = ()
    deletes: tuple[DeletePod, ...] = ()
    ours: frozenset[str] = frozenset()  # UIDs of pods deleted as planned: never failures
    notes: tuple[Note, ...] = ()
    fail: str | None = None  # the job cannot go on (WORKERS_LOST): why
    leaving: Mapping[str, Leaving] = field(default_factory=dict)
    unseen: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _Step:
    """The plan under construction (local to one call of `plan`)."""

    fleet: Fleet
    reused: dict[int, int]
    creates: list[Create] = field(default_factory=list)
    deletes: list[DeletePod] = field(default_factory=list)
    ours: set[str] = field(default_factory=set)
    notes: list[Note] = field(default_factory=list)

    def say(self, level: str, event: str, k8s: EventSpec | None = None, **fields: Any) -> None:
        self.notes.append(Note(level, event, fields, k8s))

    def set_slot(self, i: int, slot: fleet.Slot) -> None:
        self.fleet = self.fleet.with_slot(i, slot)

    def delete(self, pod: Obj) -> None:
        """Delete `pod` (graceful); its UID joins `ours`: never classified, never again."""
        self.deletes.append(DeletePod(pod["metadata"]["name"], pod["metadata"].get("uid"),
                                      None))
        self.ours.add(pod["metadata"].get("uid", ""))


def published_hosts(published: str) -> frozenset[str]:
    """The hosts of the discovery file's `host:slots` lines."""
    return frozenset(line.rsplit(":", 1)[0] for line in published.splitlines() if line)


def retiring_hosts(f: Fleet, pods: Mapping[str, Obj], published: str, s: Settings,
                   leaving: Mapping[str, Leaving] | None = None) -> set[str]:
    """The hosts of scaled-in and leaving workers already out of the published file: the ones
    whose ssh clients `plan` needs counted (Picture.ssh_clients)."""
    names = [pod_name(s.job, i, f.slots[i].incarnation) for i in f.retiring()]
    if not names and not leaving:
        return set()  # (every pass asks: the file's 10,000 lines are not parsed for nothing)
    out, listed = set(), published_hosts(published)
    for name in [*names, *(leaving or {})]:
        pod = pods.get(name)
        host = hostlist.host_of(pod, s.host_mode) if pod is not None else None
        if host is not None and host not in listed:
            out.add(host)
    return out


def scale_refused(workers: int, why: str) -> Note:
    """A scale request the supervisor will not apply, and why."""
    return Note("warning", "scale.refused", {"workers": workers, "reason": why}, EventSpec(
        "Warning", "ScaleRefused", "Scale", f"scale to {workers} workers refused: {why}"))


def _scale_request(p: Picture, s: Settings, step: _Step) -> None:
    want = p.scale_request
    assert want is not None
    lo, hi = fleet.limits(s.min_np, s.max_np, s.slots_per_worker)
    have = len(step.fleet.active())
    if not lo <= want <= hi:
        why = (f"outside [{lo}, {hi}] workers (MIN_NP {s.min_np}, MAX_NP {s.max_np}, "
               f"{s.slots_per_worker} slots each)")
        step.notes.append(scale_refused(want, why))
    elif want != have:
        step.fleet = fleet.scale_to(step.fleet, want, p.wall)
        step.say("info", "scale.applied", EventSpec(
            "Normal", "Scaled", "Scale", f"desired workers {have} -> {want}"),
            workers_from=have, workers_to=want)


def _scaled_slots(p: Picture, s: Settings, step: _Step) -> None:
    listed: frozenset[str] | None = None  # the published hosts, parsed once if needed
    for i in step.fleet.changing():
        slot = step.fleet.slots[i]
        name = pod_name(s.job, i, slot.incarnation)
        pod = p.pods.get(name)
        if slot.added_at is not None:
            since = _scale_out_since(p, slot.added_at, name, pod)
            if pod is not None and pod.get("status", {}).get("phase") == "Running":
                step.set_slot(i, replace(slot, added_at=None))
            elif since is not None and p.wall - since > s.scale_out_timeout_s:
                why = (f"scale-out rolled back: {name} not Running after "
                       f"{s.scale_out_timeout_s:g}s")
                if pod is not None:
                    step.delete(pod)
                step.set_slot(i, replace(slot, added_at=None, dropped=why))
                step.say("warning", "scale.rolled_back", EventSpec(
                    "Warning", "ScaleOutRolledBack", "Scale", why), pod=name, slot=i)
        elif slot.retiring_at is not None:
            if listed is None:
                listed = published_hosts(p.published)
            _retire(p, s, step, i, listed)


def _scale_out_since(p: Picture, added_at: float, name: str, pod: Obj | None) -> float | None:
    """Since when (wall) a slot added by a scale-out has had its chance to run: the later of
    its adding and its pod's creation (or the ask for it, not seen yet); None while its create
    has not been asked for (held back by CREATE_BURST): a scale-out to thousands of workers
    asks for them over minutes, and the last ones are not rolled back for that wait. A create
    admission refused (`waiting`) counts from the adding."""
    if pod is not None:
        made = _created(pod)
        return added_at if made is None else max(added_at, made)
    if name in p.expected:
        return max(added_at, p.wall - (p.now - p.expected[name]))
    return added_at if name in p.waiting else None


def _created(pod: Obj) -> float | None:
    try:
        return datetime.fromisoformat(pod["metadata"]["creationTimestamp"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _retire(p: Picture, s: Settings, step: _Step, i: int, listed: frozenset[str]) -> None:
    """Delete a scaled-in worker once horovodrun has let it go (or after the timeout)."""
    slot = step.fleet.slots[i]
    name = pod_name(s.job, i, slot.incarnation)
    pod = p.pods.get(name)
    assert slot.retiring_at is not None
    if pod is not None:
        host = hostlist.host_of(pod, s.host_mode)
        if host in listed:
            return  # not yet out of the discovery file
        if host is not None and host not in p.ssh_clients:
            return  # retiring since this step: its ssh clients are counted on the next
        clients = p.ssh_clients.get(host, 0) if host else 0
        waited = p.wall - slot.retiring_at
        if clients and waited < s.scale_in_timeout_s:
            return
        step.delete(pod)
        step.say("info", "scale.worker_removed", EventSpec(
            "Normal", "WorkerRemoved", "Scale",
            f"scaled in: deleted {name} after {waited:.1f}s"
            + (f" (timeout; {clients} ssh clients left)" if clients
               else " (horovodrun let it go)")),
            pod=name, slot=i, waited_s=round(waited, 2), ssh_clients_left=clients)
    step.fleet = fleet.retire_done(step.fleet, i)


def _replace_reused(p: Picture, s: Settings, step: _Step) -> None:
    """A worker whose IP another worker had can never join: replace it at once, no budget
    used; after REUSED_LIMIT such pods in one slot, leave it out and say so (a CNI handing out
    the same address again and again needs a person). Looked at once per render."""
    if p.view_render is None:
        return
    for name, why in p.view_render.left_out.items():
        if why is not Unusable.HOST_REUSED:
            continue
        pod = p.pods.get(name)
        found = fleet.slot_of(pod, s.job) if pod is not None else None
        if pod is None or found is None or pod["metadata"].get("deletionTimestamp"):
            continue
        slot, inc = found
        renewed = fleet.renew(step.fleet, slot, inc, p.wall)
        if renewed is step.fleet:
            continue
        host = hostlist.host_of(pod, s.host_mode)
        count = step.reused[slot] = step.reused.get(slot, 0) + 1
        note = (f"worker {name} (slot {slot}) got address {host}, which an earlier worker "
                f"had: Horovod blacklisted it for good")
        if count > REUSED_LIMIT:
            if count == REUSED_LIMIT + 1:
                step.say("warning", "worker.host_reused_again", EventSpec(
                    "Warning", "WorkerHostReused", "Keep",
                    f"{note}; {REUSED_LIMIT} pods of this slot got reused addresses "
                    "already: left out, not replaced"),
                    pod=name, host=host, slot=slot, replaced=REUSED_LIMIT)
            continue
        step.fleet = renewed
        step.delete(pod)
        step.say("warning", "worker.host_reused", EventSpec(
            "Warning", "WorkerHostReused", "Replace",
            f"{note}; replaced by incarnation {inc + 1} (no restart budget used)"),
            pod=name, host=host, slot=slot, replacement=pod_name(s.job, slot, inc + 1))


def plan(p: Picture, s: Settings) -> Plan:
    """One reconcile step of the fleet: see the module's doc for the order of decisions."""
    step = _Step(p.fleet, dict(p.reused))
    if p.scale_request is not None:
        _scale_request(p, s, step)
    _scaled_slots(p, s, step)
    leaving = _leaves(p, s, step)
    reuse_checked = p.reuse_checked
    if p.view_render is not None and p.view_render is not p.reuse_checked:
        reuse_checked = p.view_render
        _replace_reused(p, s, step)
    expected = {}
    # a pod the watch shows is no longer unseen
    unseen = {n: k for n, k in p.unseen.items() if n not in p.pods}
    for name, since in p.expected.items():
        if p.now - since > expectation_timeout(unseen.get(name, 0)):
            unseen[name] = unseen.get(name, 0) + 1
            step.say("warning", "worker.create_unseen", pod=name,
                     waited_s=round(p.now - since, 1),
                     next_wait_s=expectation_timeout(unseen[name]))
        else:
            expected[name] = since
    ix = p.index if p.index is not None else podindex.build(p.pods, {}, s.job)
    _superseded(p, s, step, ix)
    _stale_exclusions(p, s, step, ix)
    current = step.fleet.current(s.job)
    if len(ix.pods) - len(ix.others(current)) < len(current):  # a current pod is missing
        existing = set(p.pods) | set(expected) | set(p.waiting)
        wanted = fleet.wanted(step.fleet, s.job, existing, p.wall)
        room = max(0, CREATE_BURST - len(expected))
        for c in sorted(wanted, key=lambda c: c.incarnation == 1)[:room]:
            step.creates.append(c)
            expected[c.name] = p.now
    usable = len(step.fleet.active()) * s.slots_per_worker
    fail = None
    if usable < s.min_np:
        dropped = {i: sl.dropped for i, sl in sorted(step.fleet.slots.items()) if sl.dropped}
        fail = (f"only {usable} of MIN_NP {s.min_np} slots can still run; dropped "
                f"slots: {dropped}")
    return Plan(step.fleet, step.reused, reuse_checked, None, expected,
                tuple(step.creates), tuple(step.deletes), frozenset(step.ours),
                tuple(step.notes), fail, leaving, unseen)


def expectation_timeout(unseen: int) -> float:
    """How long a created pod may stay unseen on the watch after `unseen` such waits for it in
    a row were given up."""
    return EXPECTATION_TIMEOUT_S * 2 ** min(unseen, UNSEEN_MAX_DOUBLINGS)


def _leaves(p: Picture, s: Settings, step: _Step) -> dict[str, Leaving]:
    """The workers announced to go that are still leaving: one is done once its host is out
    of the published file and horovodrun let it go (no ssh client left; or after the scale-in
    timeout), or once its pod is gone. Its pod is deleted then unless it is being deleted
    already (an eviction: its entrypoint held SIGTERM until now)."""
    still: dict[str, Leaving] = {}
    listed: frozenset[str] | None = None
    for name, lv in sorted(p.leaving.items()):
        pod = p.pods.get(name)
        waited = p.wall - lv.since
        if pod is None or pod["metadata"].get("uid") != lv.uid:
            step.say("info", "worker.left", pod=name, slot=lv.slot, waited_s=round(waited, 2),
                     how="gone")
            continue
        host = hostlist.host_of(pod, s.host_mode)
        if listed is None:
            listed = published_hosts(p.published)
        if host is not None and (host in listed or host not in p.ssh_clients):
            still[name] = lv  # not out of the file yet, or its ssh clients not counted yet
            continue
        clients = p.ssh_clients.get(host, 0) if host else 0
        if clients and waited < s.scale_in_timeout_s:
            still[name] = lv
            continue
        if not pod["metadata"].get("deletionTimestamp"):
            step.delete(pod)
        how = (f"timeout; {clients} ssh clients left" if clients
               else "horovodrun let it go")
        step.say("info", "worker.left", EventSpec(
            "Normal", "WorkerLeft", "Leave",
            f"worker {name} ({lv.why}) left after {waited:.1f}s ({how})"),
            pod=name, slot=lv.slot, waited_s=round(waited, 2), how=how,
            ssh_clients_left=clients)
    return still


def _superseded(p: Picture, s: Settings, step: _Step, ix: PodIndex) -> None:
    """A live pod of an older incarnation than its slot's (a late create by a leader that lost
    its lease, a delete that never happened) is out of the file and serves nobody: delete it,
    once (its UID joins `ours`)."""
    deleting = {d.name for d in step.deletes}
    slots = step.fleet.slots
    older = []
    # a slot's current pod is not older: only the others are looked at
    for name in ix.others(step.fleet.current(s.job)):
        f = ix.pods[name]
        if f.slot is None:
            continue
        slot = slots.get(f.slot)
        if (slot is None or slot.dropped is not None or f.incarnation >= slot.incarnation
                or f.name in deleting or f.uid in p.failed or f.deleting or f.terminal):
            continue
        older.append((f.name, f.slot, slot.incarnation))
    for name, i, incarnation in sorted(older):
        step.delete(p.pods[name])
        current = pod_name(s.job, i, incarnation)
        step.say("warning", "worker.superseded", EventSpec(
            "Warning", "WorkerSuperseded", "Delete",
            f"worker {name} (slot {i}) runs although the slot is at {current}: deleted"),
            pod=name, slot=i, current=current)


def _stale_exclusions(p: Picture, s: Settings, step: _Step, ix: PodIndex) -> None:
    """A worker created while a node was down (or still held its slot's hung pod) is kept off
    that node for good: the pod's affinity cannot change. When the scheduler then finds no node
    for it and that node is up again (and holds no pod of its slot), it would stay Pending for
    good (seen on real nodes: a node frozen during a regroup, both replacements kept off it, one
    node left with room for one). Delete it: its slot creates it again (the same name) kept off
    only what is down now. Its UID joins `ours`."""
    deleting = {d.name for d in step.deletes}
    for name in sorted(ix.unschedulable):
        f = ix.pods[name]
        if (f.slot is None or name in deleting or f.deleting or f.uid in p.failed):
            continue  # (an unbound pod goes at once: the view shows it until the watch says so)
        i, inc = f.slot, f.incarnation
        slot = step.fleet.slots.get(i)
        if slot is None or slot.dropped is not None or inc != slot.incarnation:
            continue
        # an earlier pod of the slot still there (a hung one being deleted); a Failed one
        # kept for its logs holds nothing
        holding = {q.node for q in ix.of_slot(i) if q.incarnation < inc and not q.terminal}
        pod = p.pods[name]
        stale = sorted(kept_off(pod) - p.lost_nodes - holding)
        if not stale:
            continue
        step.delete(pod)
        step.say("warning", "worker.rescheduled", EventSpec(
            "Warning", "WorkerRescheduled", "Recreate",
            f"worker {name} (slot {i}) found no node: it was kept off {', '.join(stale)}, "
            "up again now; created again without that"),
            pod=name, slot=i, kept_off=stale)
