"""PURE: bad-node quarantine. A node on which `failures` workers of the job failed within
`window_s` gets no new worker of the job for `ttl_s` (a required anti-affinity by node name,
workers.not_on), then is released by itself.

What counts: the failures that say something about the node, a training container's exit
(ExitCode), a hung process (Hung, which a stuck one is too), the node's own loss
(NodeNotReady) and a pod that never started for a reason of the node's (NotStarted with
`node_fault`: starts.py). Not a delete, an eviction or a preemption (someone else's decision), nor a
graceful leave (announced: disruption.py). A node is not quarantined while no other node
could take a worker (one the job's workers run or ran on, Ready, schedulable, not quarantined):
that would leave its slots Pending instead of retrying where they can run. Times are
wall-clock epoch seconds. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.classify import Cause, Failure

COUNTED = frozenset({Cause.EXIT_CODE, Cause.HUNG, Cause.NODE_NOT_READY, Cause.NOT_STARTED})


@dataclass(frozen=True)
class Settings:
    failures: int = 2  # 0: off
    window_s: float = 1800.0
    ttl_s: float = 3600.0


@dataclass(frozen=True)
class Quarantine:
    """Failures per node within the window, and the nodes quarantined until when."""

    failed: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    until: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    q: Quarantine
    started: tuple[tuple[str, int], ...] = ()  # (node, failures in the window) newly in
    ended: tuple[str, ...] = ()  # nodes whose quarantine is over
    spared: tuple[str, ...] = ()  # at the threshold, but no other node could take a worker


def evidence(f: Failure) -> tuple[Cause, str | None]:
    """What `step` counts of a failure: (cause, node); no node when it says nothing of its
    node (a pod that never started for a reason that is not its node's)."""
    if f.cause is Cause.NOT_STARTED and not f.node_fault:
        return f.cause, None
    return f.cause, f.node


def step(q: Quarantine, failures: Iterable[tuple[Cause, str | None]], now: float,
         s: Settings, usable: Iterable[str] = ()) -> Change:
    """The quarantine after these failures (cause, node) at `now`: the window slides, a node
    at `failures` within it is quarantined until now + ttl if another of the `usable` nodes
    (Ready, schedulable) is not quarantined, a quarantine past its end ends."""
    if s.failures <= 0:
        return Change(q) if not q.failed and not q.until else Change(Quarantine(),
                                                                     ended=tuple(q.until))
    failed = {n: tuple(t for t in ts if now - t < s.window_s) for n, ts in q.failed.items()}
    for cause, node in failures:
        if node and cause in COUNTED:
            failed[node] = (*failed.get(node, ()), now)
    failed = {n: ts for n, ts in failed.items() if ts}
    until = {n: t for n, t in q.until.items() if t > now}
    ended = tuple(sorted(set(q.until) - set(until)))
    started, spared, others = [], [], set(usable)
    for node, ts in sorted(failed.items()):
        if len(ts) >= s.failures and node not in until:
            if not others - set(until) - {node}:
                spared.append(node)
                failed[node] = ()  # said once: counted again from zero
                continue
            until[node] = now + s.ttl_s
            started.append((node, len(ts)))
            failed[node] = ()  # counted again from zero once released
    failed = {n: ts for n, ts in failed.items() if ts}
    new = Quarantine(failed, until)
    if new == q:
        return Change(q, spared=tuple(spared))
    return Change(new, tuple(started), ended, tuple(spared))


def next_end(q: Quarantine) -> float | None:
    """When the next quarantine ends (the loop wakes for it), or None."""
    return min(q.until.values(), default=None)
