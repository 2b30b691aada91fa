"""One driver per job: leader election on a coordination.k8s.io/v1 Lease, `<job>-supervisor-leader`.

Two launchers of one job (a Job retry while the old pod still runs on a partitioned node, a
second `kubectl apply`, a user's local run) must never both run horovodrun against the same
workers or write the same budgets. Before it touches anything, the supervisor acquires the
job's Lease; a second one waits as a standby until the Lease is released or expires.

The rules are client-go's leaderelection, on our own clocks: a Lease is expired when its record
(holder, renewTime, transitions) has not changed for its `leaseDurationSeconds` as measured on
this process's monotonic clock since this process saw it change (so no two clocks are ever
compared); writes use the Lease's resourceVersion (optimistic concurrency: of two standbys
only one takes over). The leader renews every `retry_s`; each renewal's client timeout ends at
the renew deadline (2/3 of the duration), so a stalled connection cannot delay the verdict.

Not renewed within that deadline (the API unreachable: a control-plane upgrade, an outage) the
leader is *paused*: `is_leader` turns false, so nothing is written (no create, no delete, no
state) before any standby could see the Lease expire, but training goes on: an outage is no
reason to throw away the progress of a job that does not need the API to train. It keeps
trying; when a renewal succeeds again (the Lease still ours) it resumes. Only when it reads the
Lease held by someone else has it *lost*: `on_lost` is called once, and the caller stops
horovodrun at once. A leader cut off from the API while a standby is not drives its horovodrun
until it can read the Lease again, but not on the standby's workers: `transitions` is the
leader's term, which its training processes claim their workers with (hook owner.py: the newer
term's kill the older's, and the older's respawns exit). A leader that exits releases the Lease
(empty holder), and a standby takes over at once.

`step` is the pure decision; `LeaderElector` does the I/O through an injected `LeaseApi`
(supervisor.kube.Leases).
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from supervisor.kube import Conflict, KubeError


def lease_name(job: str) -> str:
    """The Lease that elects the job's one supervisor."""
    return f"{job}-supervisor-leader"


class LeaseApi(Protocol):
    def get(self, name: str, timeout_s: float | None = None) -> dict[str, Any] | None: ...
    def create(self, body: Mapping[str, Any],
               timeout_s: float | None = None) -> dict[str, Any]: ...
    def replace(self, body: Mapping[str, Any],
                timeout_s: float | None = None) -> dict[str, Any]: ...


def micro_time(t: float) -> str:
    """A MicroTime (six fractional digits, UTC) for wall-clock epoch seconds `t`."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_of(lease: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must change for a Lease to count as renewed."""
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("renewTime"),
            spec.get("leaseDurationSeconds"), spec.get("leaseTransitions"))


@dataclass(frozen=True)
class Wait:
    """Someone else holds a live Lease."""

    holder: str
    expires_in_s: float


@dataclass(frozen=True)
class Write:
    """Write this spec (create the Lease when `create`); success makes us the leader."""

    spec: dict[str, Any]
    create: bool


def step(lease: Mapping[str, Any] | None, me: str, duration_s: int, *, seen_at: float,
         now: float, wall: float, gone: bool = False) -> Wait | Write:
    """Return what to do about the job's Lease as read now.

    `seen_at` is when (monotonic) this process first saw the Lease's current record; `wall`
    the wall-clock time written into acquireTime / renewTime (informational for others);
    `gone`: its holder is known to be dead (a supervisor process of this very pod that is no
    more: sidecar mode), so the Lease is taken over without waiting for it to expire.
    """
    stamp = micro_time(wall)
    if lease is None:
        return Write({"holderIdentity": me, "leaseDurationSeconds": duration_s,
                      "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0},
                     create=True)
    spec = dict(lease.get("spec") or {})
    holder = spec.get("holderIdentity") or ""
    left = seen_at + float(spec.get("leaseDurationSeconds") or 0) - now
    if holder and holder != me and left > 0 and not gone:
        return Wait(holder, left)
    transitions = int(spec.get("leaseTransitions") or 0)
    if holder != me:  # released or expired: take it over
        spec.update(acquireTime=stamp, leaseTransitions=transitions + 1)
    spec.update(holderIdentity=me, leaseDurationSeconds=duration_s, renewTime=stamp)
    return Write(spec, create=False)


class LeaderElector:
    """Acquires, renews and releases the job's Lease for identity `me`."""

    def __init__(self, leases: LeaseApi, name: str, me: str, duration_s: float, *,
                 api_timeout_s: float = 30.0, on_lost: Callable[[str], None] = lambda _: None,
                 on_paused: Callable[[str], None] = lambda _: None,
                 on_resumed: Callable[[float], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 gone: Callable[[str], bool] = lambda _: False) -> None:
        self.leases, self.name, self.me = leases, name, me
        self.gone = gone  # whether a holder is known to be dead (see step)
        self.duration_s = max(1, math.ceil(duration_s))
        self.renew_deadline_s = duration_s * 2 / 3
        self.retry_s = max(0.2, duration_s / 12)
        self.api_timeout_s, self.clock, self.wall = api_timeout_s, clock, wall
        self.on_lost, self.on_paused, self.on_resumed = on_lost, on_paused, on_resumed
        self.transitions = 0
        self.holder = ""  # who holds it, as last seen
        self._lease: dict[str, Any] | None = None  # as last read or written
        self._record: tuple[Any, ...] | None = None
        self._seen_at = 0.0
        self._renewed_at: float | None = None  # monotonic start of the last successful write
        self._lost: str | None = None
        self._paused_at: float | None = None  # monotonic: since when renewals keep failing
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queries -------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while the Lease is ours and was renewed within the renew deadline (and, after
        a pause, once `on_resumed` is done)."""
        return (self._lost is None and self._paused_at is None and self._renewed_at is not None
                and self.clock() - self._renewed_at < self.renew_deadline_s)

    def term(self) -> str:
        """This leader's term, as its training processes claim their workers with it (hook
        owner.py): the Lease's uid (the job) and its transitions when it was taken."""
        uid = ((self._lease or {}).get("metadata") or {}).get("uid") or "none"
        return f"{uid}.{self.transitions}"

    def window(self) -> float:
        """Seconds left to write before the renew deadline (0 when not leading): a write's
        timeout ends there (kube.write_timeout), so none lands after a standby may take over."""
        if not self.is_leader():
            return 0.0
        assert self._renewed_at is not None
        return max(0.0, self._renewed_at + self.renew_deadline_s - self.clock())

    # -- one attempt ---------------------------------------------------------------------------

    def attempt(self, timeout_s: float | None = None) -> bool:
        """Read the Lease and acquire or renew it if allowed; return whether we lead now.
        Raises KubeError (a Conflict means someone else wrote first: not leading)."""
        started = self.clock()
        timeout = timeout_s or self.api_timeout_s
        lease = self.leases.get(self.name, timeout)
        if lease is not None:
            record = record_of(lease)
            if record != self._record:
                self._record, self._seen_at = record, self.clock()
            self.holder = record[0]
        decision = step(lease, self.me, self.duration_s, seen_at=self._seen_at,
                        now=self.clock(), wall=self.wall(),
                        gone=bool(self.holder) and self.holder != self.me
                        and self.gone(self.holder))
        if isinstance(decision, Wait):
            self._lease = lease
            return False
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name}, "spec": decision.spec}
        try:
            if decision.create:
                written = self.leases.create(body, timeout)
            else:
                assert lease is not None
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                written = self.leases.replace(body, timeout)
        except Conflict:
            return False  # another launcher wrote first; read again next time
        self._lease, self._record = written, record_of(written)
        self._seen_at = self.clock()
        self.holder = self.me
        self.transitions = int(written["spec"].get("leaseTransitions") or 0)
        self._renewed_at = started
        return True

    # -- leading -------------------------------------------------------------------------------

    def start(self) -> LeaderElector:
        """Keep renewing in a thread; call `on_lost` once if leadership ends."""
        self._thread = threading.Thread(target=self._renew_loop, name="leader", daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        failure: str | None = None
        while not self._stop.wait(self.retry_s):
            assert self._renewed_at is not None
            left = self._renewed_at + self.renew_deadline_s - self.clock()
            # Within the deadline a call may take what is left of it; paused, a few retries.
            timeout = min(self.api_timeout_s, max(0.5, left if left > 0 else 2 * self.retry_s))
            try:
                if self.attempt(timeout_s=timeout):
                    failure = None
                    if self._paused_at is not None:  # not leading until the caller is ready
                        self.on_resumed(self.clock() - self._paused_at)
                        self._paused_at = None
                    continue
                failure = f"the lease is held by {self.holder!r}"
            except KubeError as e:
                failure = str(e)
            if self._stop.is_set():
                return
            if self.holder not in ("", self.me):  # seen held by another: they may drive now
                self._lost = (f"lease {self.name} is held by {self.holder!r} (not renewed for "
                              f"{self.clock() - self._renewed_at:.1f}s: {failure})")
                self.on_lost(self._lost)
                return
            if not self.is_leader() and self._paused_at is None:
                self._paused_at = self.clock()
                self.on_paused(f"could not renew lease {self.name} for "
                               f"{self._paused_at - self._renewed_at:.1f}s (deadline "
                               f"{self.renew_deadline_s:g}s): {failure}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.api_timeout_s + 1)

    def release(self) -> bool:
        """Give the Lease up (empty holder, expired at once) so a standby takes over now;
        return whether it was released. Only a Lease still ours is touched."""
        self.stop()
        if not self.is_leader() or self._lease is None:
            return False
        spec = dict(self._lease.get("spec") or {})
        stamp = micro_time(self.wall())
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=stamp,
                    acquireTime=stamp)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name,
                             "resourceVersion": self._lease["metadata"]["resourceVersion"]},
                "spec": spec}
        try:
            self.leases.replace(body, min(5.0, self.api_timeout_s))
        except KubeError:
            return False
        self._lost = "released"
        return True
