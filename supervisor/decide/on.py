"""PURE: what each trigger between two passes does to the decisions' memory (`memory.Memory`).

The pass (`core.manage`) decides from the whole view; these are the decisions a single trigger
makes on arrival: a pod's or a node's watch event, a scale request, an action's outcome, a policy
reload, a new run of horovodrun, the host list of a pass. Each takes the memory and what the
trigger said and returns the next memory, with the notes to say where it decides something
worth saying. The loop (loop.py) hands them in and keeps what they return; it never writes
a field of Memory itself (tests/unit/test_loop_writes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from supervisor.decide import (
    accounting,
    admission,
    failures,
    fleet,
    hostlist,
    incidents,
    listing,
    nodes,
    plan,
    progress,
    stragglers,
)
from supervisor.decide.classify import (
    ClassifySettings,
    NodeState,
    PodMemory,
    classify,
    node_down_since,
    remember,
)
from supervisor.decide.hostlist import HostMode
from supervisor.decide.memory import Memory, judge_exit
from supervisor.decide.plan import Note
from supervisor.decide.podindex import PodIndex
from supervisor.model import EventSpec, ExitCode
from supervisor.observe import ClusterView, EventType, Obj
from supervisor.workers import pod_name


def _without(mapping: Mapping[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in mapping.items() if k != key}


@dataclass(frozen=True)
class PodEvent:
    """One pod watch event as the loop saw it: `obj` is the last object seen of a pod the
    relist found deleted (it knows only the name)."""

    type: EventType
    obj: Obj
    at: float
    relisted: bool = False


def initial(workers: fleet.Fleet | None, stored: Mapping[str, object] | None) -> Memory:
    """The memory a supervisor starts with: the fleet it found (None: it does not own the
    workers), and the progress, incidents and straggler moves stored with the state by the one
    before it."""
    return Memory(fleet=workers, progress=progress.from_dict((stored or {}).get("progress")),
                  book=incidents.from_list((stored or {}).get("incidents")),
                  slow=stragglers.moves_from_dict((stored or {}).get("slowMoves")))


def pod_seen(c: Memory, ev: PodEvent, before: PodMemory | None, *, synced: bool,
             node: NodeState, settings: ClassifySettings
             ) -> tuple[Memory, PodMemory | None]:
    """A pod's watch event: it is no longer expected (its create showed up), it is classified
    once synced (each UID found failed once), and what it showed is remembered (None: forget
    the pod, deleted). Returns the memory and the pod's record."""
    meta = ev.obj["metadata"]
    name, uid = meta["name"], meta.get("uid", "")
    if name in c.expected:
        c = replace(c, expected=_without(c.expected, name))
    if synced and uid not in c.failed:
        found = classify(ev.obj, ev.type, before, node, settings=settings, now=ev.at,
                         relisted=ev.relisted)
        if found is not None:
            c = replace(c, failed=c.failed | {uid},
                        found=(*c.found, failures.Failed(found, ev.obj, ev.at)))
    if ev.type is EventType.DELETED:
        if uid in c.failed:
            c = replace(c, failed=c.failed - {uid})
        return c, None
    return c, remember(before, ev.obj)


def node_seen(c: Memory, name: str, node: Obj | None, at: float) -> Memory:
    """A node's watch event (`node` None: deleted): since when it is down, or up again."""
    was = c.node_down.get(name)
    down = node_down_since(was, node, at)
    if down == was:
        return c
    rest = {n: t for n, t in c.node_down.items() if n != name}
    return replace(c, node_down=rest if down is None else {**rest, name: down})


def scale_asked(c: Memory, workers: int) -> Memory:
    """A valid scale request (the pass applies it)."""
    return replace(c, scale_request=workers)


def create_over(c: Memory, name: str) -> Memory:
    """A create asked for is over without a pod (refused, failed): no longer expected."""
    return replace(c, expected=_without(c.expected, name)) if name in c.expected else c


def created(c: Memory, name: str) -> tuple[Memory, admission.Refusal | None]:
    """Worker `name` was created: what blocked it before (its refusals) is over. Returns the
    memory and that block, for the report."""
    blocked = c.blocked.get(name)
    if blocked is None:
        return c, None
    return replace(c, blocked=_without(c.blocked, name)), blocked


def create_refused(c: Memory, name: str, reason: str, now: float) -> tuple[Memory, Note]:
    """Admission (or a quota) refused worker `name`: not fatal; tried again after a backoff.
    The Event is posted for the first refusal and when the reason changes."""
    c = create_over(c, name)
    before = c.blocked.get(name)
    r = admission.refused(before, reason, now)
    wait = r.retry_at - now
    event = None
    if before is None or before.reason != reason:
        event = EventSpec("Warning", "ReplacementBlocked", "Create",
                          f"cannot create worker {name}: {reason}; trying again in {wait:.0f}s, "
                          f"then with backoff (refused {r.attempts} times); training goes on "
                          "with the workers it has")
    return replace(c, blocked={**c.blocked, name: r}), Note(
        "warning", "worker.create_blocked",
        {"pod": name, "reason": reason, "attempt": r.attempts, "retry_in_s": round(wait, 1)},
        event)


def create_failed(c: Memory, name: str, why: str, job: str) -> tuple[Memory, tuple[Note, ...]]:
    """Creating worker `name` failed for good: its slot is dropped; or, for a replacement
    placed ahead of a cordoned worker's move, that worker stays where it is (not created again
    each pass while the cordon lasts)."""
    c = create_over(c, name)
    fl = c.fleet
    if fl is None:
        return c, ()
    for i, s in fl.slots.items():
        if s.dropped is None and name == pod_name(job, i, s.incarnation):
            c = replace(c, fleet=fl.with_slot(i, replace(s, dropped=why)))
            return c, (Note("warning", "worker.slot_dropped", {"pod": name, "slot": i},
                            EventSpec("Warning", "WorkerCreateFailed", "Create", why)),)
    for worker, ahead in c.moving.items():
        if ahead == name and worker not in c.staying:
            return replace(c, staying=c.staying | {worker}), (Note(
                "warning", "worker.stays", {"pod": worker, "replacement": name},
                EventSpec("Warning", "WorkerStays", "Keep",
                          f"{why}; worker {worker} trains on where it is while its node's "
                          "cordon lasts")),)
    return c, ()


def policy_reloaded(c: Memory) -> Memory:
    """A new policy: the state is saved again (it carries the restart limit, for `status`)."""
    return replace(c, saved=None)


def horovodrun_started(c: Memory) -> Memory:
    """A new run of horovodrun (started or adopted): the hang watch's failures and the
    regroup of the last run are over."""
    return replace(c, failed_at={}, regroup=None, held_said=False)


def heard(c: Memory, view: ClusterView, mode: HostMode,
          talking: Callable[[], Iterable[str]],
          index: PodIndex | None = None) -> tuple[Memory, Note | None]:
    """The hosts of workers on down nodes (or marked not Ready from outside) whose training
    processes heartbeat now (`talking`, asked only while there is such a worker): kept in the
    host list through a kubelet's blip and an API outage's aftermath
    (hostlist.kept_while_heartbeating; `index`: the view's facts). Said when the set
    changes."""
    kept = hostlist.kept_while_heartbeating(view, mode, talking, index)
    if kept == c.kept:
        return c, None
    note = Note("info", "workers.kept_on_down_nodes",
                {"hosts": sorted(kept), "released": sorted(c.kept - kept)})
    return replace(c, kept=kept), note


def listed(c: Memory, out: listing.Listed) -> Memory:
    """What the host list of this pass (listing.listing) leaves to remember."""
    if (out.regroup, out.reannounced, out.held_said) == (c.regroup, c.reannounced, c.held_said):
        return c
    return replace(c, regroup=out.regroup, reannounced=out.reannounced,
                   held_said=out.held_said)


def gate_opened(c: Memory, now: float) -> Memory:
    """The start gate waits for MIN_NP usable slots from `now` (the first start, a restart)."""
    return replace(c, gate_since=now)


def node_watch_back(c: Memory, at: float, broken_s: float) -> Memory:
    """The node watch connected again after `broken_s`: after an outage (nodes.OUTAGE_MIN_S
    or longer, not a routine reconnect) the nodes the control plane marks down now may be its
    artefact (the settling hold counts from `at`)."""
    return replace(c, api_back_at=at) if broken_s >= nodes.OUTAGE_MIN_S else c


def scale_seen(c: Memory, obj: Obj, s: plan.Settings) -> tuple[Memory, Note | None]:
    """The scale request's ConfigMap as the watch showed it: a new version asks for a size
    (applied by the pass), or is refused with why and what is accepted (the size is kept)."""
    rv = obj["metadata"].get("resourceVersion")
    if rv == c.scale_version:
        return c, None
    c = replace(c, scale_version=rv)
    raw = (obj.get("data") or {}).get(fleet.SCALE_KEY)
    try:
        workers = fleet.scale_request(raw)
    except ValueError as e:
        name = obj["metadata"]["name"]
        lo, hi = fleet.limits(s.min_np, s.max_np, s.slots_per_worker)
        shown = raw if raw is None or len(raw) <= 80 else raw[:80] + "..."
        return c, Note("error", "scale.invalid", {"configmap": name, "data": shown,
                                                   "reason": str(e)},
                       EventSpec("Warning", "ScaleRefused", "Scale",
                                 f"configmap {name}: {fleet.SCALE_KEY} {shown!r} refused: {e}; "
                                 f'expected {{"workers": N}}, N an integer in [{lo}, {hi}] '
                                 "(use `elastic-supervisor scale`): the size is kept"))
    return scale_asked(c, workers), None


def leadership(c: Memory, *, paused: bool) -> Memory:
    """The leader Lease could not be renewed (`paused`), or it was again."""
    return replace(c, paused=paused)


def exit_seen(c: Memory, exited: int | None) -> tuple[Memory, int | None, bool]:
    """horovodrun's exit (None: none in this batch), held or judged (memory.judge_exit):
    the memory, the code to judge now, and whether it was held just now (to say so)."""
    held, judged = judge_exit(c.held_exit, exited, paused=c.paused)
    newly = held is not None and c.held_exit is None
    return (c if held == c.held_exit else replace(c, held_exit=held)), judged, newly


def accounted(c: Memory, a: accounting.Accounted) -> Memory:
    """What the accounting of a pass leaves to remember: the progress, the incidents, when
    they were last due to be saved."""
    return replace(c, progress=a.progress, book=a.book, progress_saved_at=a.saved_at)



def fatal(c: Memory, reason: str, *, crashed: bool) -> Memory:
    """A watch or an action failed for good: the run ends at once, with INTERNAL for a bug of
    ours (`crashed`) and KUBE_FATAL for an API that refuses for good (the first one wins)."""
    if c.fatal is not None:
        return c
    return replace(c, fatal=(int(ExitCode.INTERNAL if crashed else ExitCode.KUBE_FATAL), reason))
