"""ADAPTER: when each node's Lease was last seen renewed, shared by two threads under one lock.

The lease reflector's thread writes (`submit`, its sink: renewals every 10 s per node must not
go through the loop's queue); the loop reads the ages on its tick (`age`, `ages`, `older_than`,
`too_short`). Every method holds the lock for its whole body, so a reader never sees half of a
write: a node deleted between listing the renewals and reading its renew interval was once
taken for a node with no interval, hence silent (tests/unit/test_node_disruption.py). The rules
on a Lease (renew_interval) are pure and live in observe.py; this store decides nothing and
does no I/O.
"""

from __future__ import annotations

import threading
from typing import Any

from supervisor.observe import EventType, renew_interval


class NodeLeases:
    """When each node's Lease was last seen renewed (monotonic receipt time, so the kubelets'
    clocks do not matter). Fed from the lease reflector's thread, read by the loop; ages are
    None while the lease watch is not synced or is broken (no evidence is not a dead node).

    Ages restart whenever the signal comes back (a relist, or a watch reconnected from its
    resourceVersion): what was renewed during the gap is unknown, so a gap never counts as
    silence. A node whose kubelet renews its Lease every leaseDurationSeconds / 4 (the
    kubelet's renew interval: 10 s by default) at or after `grace` is never found silent by
    its Lease: `too_short` names it (the caller reports it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._renew: dict[str, str] = {}
        self._seen: dict[str, float] = {}
        self._interval: dict[str, float] = {}
        self._usable = False  # the watch is synced and not broken: the ages are evidence
        self._gap = False  # broken since the last time the signal was there

    def submit(self, item: Any) -> None:
        """The lease reflector's sink (WatchEvent / SourceState of Kind.LEASE)."""
        obj = getattr(item, "obj", None)
        with self._lock:
            if obj is None:
                if getattr(item, "broken", None) is True:
                    self._usable, self._gap = False, True
                elif getattr(item, "synced", None) or (getattr(item, "broken", None) is False
                                                       and self._gap):
                    if self._gap:
                        self._seen = dict.fromkeys(self._seen, item.at)
                    self._usable, self._gap = True, False
                return
            name = obj["metadata"]["name"]
            if item.type is EventType.DELETED:
                self._renew.pop(name, None)
                self._seen.pop(name, None)
                self._interval.pop(name, None)
                return
            spec = obj.get("spec") or {}
            self._interval[name] = renew_interval(spec)
            renew = spec.get("renewTime") or ""
            if self._renew.get(name) != renew:
                self._renew[name] = renew
                self._seen[name] = item.at

    def age(self, node: str, now: float) -> float | None:
        with self._lock:
            if not self._usable:
                return None
            seen = self._seen.get(node)
        return None if seen is None else max(0.0, now - seen)

    def ages(self, now: float) -> dict[str, float] | None:
        """Every node's `age` (None while the signal is not there)."""
        with self._lock:
            if not self._usable:
                return None
            return {n: max(0.0, now - t) for n, t in self._seen.items()}

    def older_than(self, grace_s: float, now: float) -> set[str]:
        with self._lock:
            if not self._usable:
                return set()
            return {n for n, t in self._seen.items()
                    if now - t >= grace_s and self._interval.get(n, 0.0) < grace_s}

    def too_short(self, grace_s: float) -> dict[str, float]:
        """Nodes whose Lease renew interval is at or above `grace_s` -> that interval."""
        with self._lock:
            return {n: i for n, i in self._interval.items() if i >= grace_s}
