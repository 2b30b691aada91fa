"""PURE: bad-node quarantine. A node with `failures` failures of the job's workers that point at
the node within `window_s` gets no new worker of the job for `ttl_s` (a required anti-affinity
by node name, workers.not_on), then is released by itself.

Quarantine destroys capacity for an hour, so only the node's own evidence counts (issue 40: two
exits 137 of operator kills quarantined a healthy node, then a frozen one, and the job trained
at 2 of 3 for the rest of the check):
- its loss (NodeNotReady: the node controller or its Lease said it);
- a hang (Hung, found silent: hang.py) once the node itself is seen down (NotReady, or its
  Lease stale) within HANG_EVIDENCE_S of it while the hung pod is still there: a frozen or
  cut-off node stops its kubelet too, which then cannot even remove the pod the supervisor
  deleted; the pod of a process that hung alone (SIGSTOP, a deadlock with the GIL held, a pod
  cut off the network) is gone in seconds, its kubelet alive, and that hang is the script's or
  an operator's, whatever happens to the node later. A stuck main thread (also Hung) never
  counts: it is the script's;
- the same failure of workers of different slots there while it is not seen elsewhere: an exit
  with code C counts when workers of at least two slots exited with C on the node within the
  window and none with C on another node (a crash that follows the script from node to node
  is the script's). 137 and 143 (SIGKILL, SIGTERM: an operator's kill, the OOM killer, the
  kubelet) never count by themselves;
- a worker announced to go for a node-problem-detector condition (disruption.Why.BAD_NODE);
- a pod that never started for a reason of its node's (NotStarted with `node_fault`: starts.py).
- a worker moved off it for being slow (a straggler: stragglers.py), its own work slower than
  the other workers' (a throttled or overcommitted CPU, a GPU clocked down, a noisy neighbour).
Not a delete, an eviction or a preemption (someone else's decision), nor another graceful
leave. Each worker (pod UID) counts once.

A node is never quarantined when the nodes left (the job's workers run or ran there; Ready,
schedulable, not quarantined) cannot hold every worker the job needs to reach its desired
size: a node's room for the job's workers is the most of them it, or a node of the same shape
(`alike`: the same allocatable resources), was seen to hold at once (`held`). The free room
the scheduler sees depends on other tenants' pods, which the supervisor does not watch, so
only what was seen counts; a node of a shape never seen holding one counts none. Spared, it
is said once and counted again from zero.

Nor is a quarantine kept below what the job needs: when the nodes left can no longer hold the
workers it needs (its desired size rose, another node went), or a worker of the job has found
no node for STARVED_S while a quarantined node is usable, the quarantine that ends soonest is
lifted early, one per pass (a pod kept off it is then created again: plan._stale_exclusions).
Times are wall-clock epoch seconds. No I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

KILLS = frozenset({137, 143})  # SIGKILL, SIGTERM: a kill, never the node's evidence alone
HANG_EVIDENCE_S = 120.0  # a hang counts if its node is seen down this soon (NotReady: 40-50 s)
# A worker of the job unschedulable this long while a quarantined node could take it: the
# quarantine goes (the scheduler says so at once when no node fits; a replacement created while
# its predecessor still holds its node's room waits seconds, not this long).
STARVED_S = 15.0


class Kind(StrEnum):
    LOST = "NodeLost"  # NodeNotReady: counts
    HUNG = "Hung"  # a silent process: counts once its node is seen down
    EXIT = "ExitCode"  # counts with another slot's same exit there, and none elsewhere
    CONDITION = "NodeCondition"  # a worker leaving for a node-problem condition: counts
    NOT_STARTED = "NotStarted"  # a pod that never started for its node's reason (starts.py)
    SLOW = "Straggler"  # a worker moved off the node for being slow (stragglers.py): counts


@dataclass(frozen=True)
class Sign:
    """A failure (or an announced leave) of a worker of the job, as the quarantine reads it."""

    kind: Kind
    node: str
    uid: str  # the pod's: a worker counts once
    slot: int | None = None
    code: int | None = None


@dataclass(frozen=True)
class Exit:
    node: str
    slot: int | None
    code: int
    at: float


@dataclass(frozen=True)
class Settings:
    failures: int = 2  # 0: off
    window_s: float = 1800.0
    ttl_s: float = 3600.0


@dataclass(frozen=True)
class Quarantine:
    """The node evidence within the window, and the nodes quarantined until when."""

    failed: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # node -> counted at
    until: Mapping[str, float] = field(default_factory=dict)
    exits: tuple[Exit, ...] = ()  # every exit (not a kill) in the window, on any node
    # node -> (when, pod UID) of the hangs there waiting for the node to be seen down
    hangs: Mapping[str, tuple[tuple[float, str], ...]] = field(default_factory=dict)
    seen: Mapping[str, float] = field(default_factory=dict)  # pod UID -> when it was read
    held: Mapping[str, int] = field(default_factory=dict)  # node -> most workers seen at once
    cleared: Mapping[str, float] = field(default_factory=dict)  # node -> its exits counted to


@dataclass(frozen=True)
class Change:
    q: Quarantine
    started: tuple[tuple[str, int], ...] = ()  # (node, failures in the window) newly in
    ended: tuple[str, ...] = ()  # nodes whose quarantine is over
    # (node, workers the nodes left were seen to hold, workers the job needs): at the
    # threshold, but the nodes left could not hold the job
    spared: tuple[tuple[str, int, int], ...] = ()
    # (node, the same two numbers before it went): a quarantine lifted early, the job short
    lifted: tuple[tuple[str, int, int], ...] = ()


def exit_score(exits: Iterable[Exit], node: str, since: float | None = None) -> int:
    """How many failures the exits say point at `node`: for each exit code, the slots that
    exited with it there (after `since`) when they are two or more and no other node saw it;
    the most."""
    slots: dict[int, set[int | None]] = {}
    elsewhere: set[int] = set()
    for e in exits:
        if e.node != node:
            elsewhere.add(e.code)
        elif since is None or e.at > since:
            slots.setdefault(e.code, set()).add(e.slot)
    return max((len(s) for c, s in slots.items() if len(s) >= 2 and c not in elsewhere),
               default=0)


def _read(q: Quarantine, signs: Iterable[Sign], now: float, s: Settings,
          down: Collection[str], *, present: Collection[str] | None) -> Quarantine:
    """The evidence after these signs at `now`: the window slides, each worker read once, a
    hang counted once its node is seen down, forgotten after HANG_EVIDENCE_S or once its pod
    is gone (`present`: the UIDs of the pods there now; None: not known, kept)."""
    seen = {u: t for u, t in q.seen.items() if now - t < max(s.window_s, HANG_EVIDENCE_S)}
    failed = {n: [t for t in ts if now - t < s.window_s] for n, ts in q.failed.items()}
    hangs = {n: [(t, u) for t, u in ts if now - t < HANG_EVIDENCE_S
                 and (present is None or u in present)] for n, ts in q.hangs.items()}
    exits = [e for e in q.exits if now - e.at < s.window_s]
    for x in signs:
        if x.uid in seen:
            continue
        seen[x.uid] = now
        if x.kind in (Kind.LOST, Kind.CONDITION, Kind.NOT_STARTED, Kind.SLOW):
            failed.setdefault(x.node, []).append(now)
        elif x.kind is Kind.HUNG:
            hangs.setdefault(x.node, []).append((now, x.uid))
        elif x.kind is Kind.EXIT and x.code is not None and x.code not in KILLS:
            exits.append(Exit(x.node, x.slot, x.code, now))
    for node in set(hangs) & set(down):
        failed.setdefault(node, []).extend(t for t, _ in hangs.pop(node))
    return Quarantine({n: tuple(ts) for n, ts in failed.items() if ts}, q.until, tuple(exits),
                      {n: tuple(ts) for n, ts in hangs.items() if ts}, seen, q.held,
                      {n: t for n, t in q.cleared.items() if now - t < s.window_s})


def room(held: Mapping[str, int], alike: Mapping[str, Hashable],
         nodes: Iterable[str]) -> int:
    """How many workers of the job `nodes` can hold together: each the most that it, or a
    node of its shape, was seen to hold at once."""
    best: dict[Hashable, int] = {}
    for node, n in held.items():
        if node in alike:
            best[alike[node]] = max(best.get(alike[node], 0), n)
    return sum(max(held.get(n, 0), best.get(alike[n], 0) if n in alike else 0) for n in nodes)


def step(q: Quarantine, signs: Iterable[Sign], now: float, s: Settings, *,
         usable: Iterable[str] = (), placed: Mapping[str, int] | None = None, need: int = 1,
         down: Collection[str] = (), alike: Mapping[str, Hashable] | None = None,
         starved: bool = False, present: Collection[str] | None = None) -> Change:
    """The quarantine after these signs at `now` (see the module's doc): a node at `failures`
    is quarantined until now + ttl if the other `usable` nodes (Ready, schedulable) not
    quarantined were seen to hold `need` workers of the job and no worker is `starved`; a
    quarantine past its end ends; one the job is short of is lifted.
    `placed`: node -> the job's workers there now; `down`: nodes NotReady or Lease-stale now;
    `alike`: node -> its shape (nodes of one shape hold as many); `starved`: a worker of the
    job has found no node for STARVED_S; `present`: the UIDs of the job's pods there now."""
    if s.failures <= 0:
        return Change(q) if not q.failed and not q.until else Change(Quarantine(),
                                                                     ended=tuple(q.until))
    r = _read(q, signs, now, s, down, present=present)
    held = dict(r.held)
    for node, n in (placed or {}).items():
        held[node] = max(held.get(node, 0), n)
    failed, cleared = dict(r.failed), dict(r.cleared)
    until = {n: t for n, t in q.until.items() if t > now}
    ended = tuple(sorted(set(q.until) - set(until)))
    started, spared, lifted, others = [], [], [], set(usable)
    # (what the nodes left hold is asked only while one is quarantined: it walks them all)
    left = room(held, alike or {}, others - set(until)) if until else need
    if until and (left < need or starved):
        # the usable quarantined node whose quarantine ends soonest; the next pass sees if
        # that was enough
        for node in sorted(set(until) & others, key=lambda n: (until[n], n))[:1]:
            lifted.append((node, left, need))
            del until[node]
    for node in sorted(set(failed) | {e.node for e in r.exits}):
        score = len(failed.get(node, ())) + exit_score(r.exits, node, cleared.get(node))
        if score < s.failures or node in until:
            continue
        left = room(held, alike or {}, others - set(until) - {node})
        if left < need or starved:
            spared.append((node, left, need))
        else:
            until[node] = now + s.ttl_s
            started.append((node, score))
        failed[node], cleared[node] = (), now  # said once: counted again from zero
    new = Quarantine({n: ts for n, ts in failed.items() if ts}, until, r.exits, r.hangs,
                     r.seen, held, cleared)
    if new == q:
        return Change(q, spared=tuple(spared))
    return Change(new, tuple(started), ended, tuple(spared), tuple(lifted))


def next_end(q: Quarantine) -> float | None:
    """When the next quarantine ends (the loop wakes for it), or None."""
    return min(q.until.values(), default=None)
