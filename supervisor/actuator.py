"""ADAPTER: carries out the loop's changes to the cluster, each object on its own, in order.

The loop never blocks on the API: it hands `SaveState`, `CreatePod` and `DeletePod` to
`Actuator.submit`; a few threads run them and report each outcome to the loop's queue as an
`ActionDone`. The order that matters is kept (`runnable`, pure): operations on one object run in
the order submitted, and a pod operation waits for every state save submitted before it (so the
state that records a new incarnation is always saved before that incarnation's pod is created).
Nothing else waits for anything: like client-go's workqueue, each object is retried on its own,
with per-object jittered exponential backoff, so a create that a failing webhook keeps refusing
(500) never holds up a force delete on a lost node. A newer state replaces a save still queued
(the state is written whole: only the newest matters). Retryable errors (connection, timeouts,
429, 5xx) are reported once and retried; "already exists" on create and "gone" on delete count as
done (the operations are idempotent by pod name and UID).

What is fatal: a denial of the supervisor's own verbs (RBAC 403), a state another supervisor
wrote (a Conflict whose stored writer is not us: two supervisors must never share a job's
budgets), and a state save that fails for good (the pods queued behind it would belong to
incarnations no state records). After a fatal outcome nothing queued runs. A state ConfigMap
that is gone (404 on update) is created again. A create that admission refuses (ResourceQuota,
LimitRange, PodSecurity) is reported as `refused` and not retried here: the loop decides whether
and when that pod is still wanted. `may_act` (the job's leadership) is asked before every write,
retries included: while it says no, nothing is written and nothing is given up; the loop ends
the run if leadership is lost for good.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from supervisor import hostkeys
from supervisor.decide.script import CreatePod, DeletePod, KeepBudget, Op, SaveState
from supervisor.kube import (
    AlreadyExists,
    Backoff,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    Refused,
)
from supervisor.model import ActionDone

WORKERS = 4  # API calls in flight at once
PAUSED_POLL_S = 0.2  # how often a write held back by `may_act` asks again


class BudgetsApi(Protocol):
    def keep(self, body: Mapping[str, Any]) -> None: ...


class PodsApi(Protocol):
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete(self, name: str, uid: str | None, grace_s: int | None) -> None: ...


class SecretsApi(Protocol):
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...


class StateApi(Protocol):
    def load(self) -> tuple[dict[str, Any] | None, str | None]: ...
    def save(self, state: Mapping[str, Any], resource_version: str | None) -> str: ...


@dataclass
class Pending:
    """An operation waiting or retrying; `key` names its object."""

    seq: int
    op: Op
    submitted_at: float
    not_before: float = 0.0  # monotonic: its next try (backoff)
    backoff: Backoff | None = None  # its own (kube.Backoff), made at submit
    reported: bool = False  # its retryable error was reported
    note: str = ""
    running: bool = False
    # A pod's own ssh host key (hostkeys.py), made at its first try: the same on every retry.
    host_key: hostkeys.HostKey | None = None
    created: Mapping[str, Any] | None = None  # the pod as created, while its Secret is not
    began_at: float | None = None  # when its first try began (monotonic)
    pod_at: float | None = None  # when the pod call returned (monotonic)

    @property
    def key(self) -> str:
        return key_of(self.op)


def key_of(op: Op) -> str:
    if isinstance(op, SaveState):
        return "state"
    return "budget" if isinstance(op, KeepBudget) else f"pod/{_describe(op)[1]}"


def runnable(pending: Sequence[Pending], now: float) -> Pending | None:
    """The first operation (in submission order) that may run now: not running, its backoff
    over, no earlier operation on its object still pending, and, for a pod, no earlier state
    save pending."""
    blocked: set[str] = set()  # objects with an earlier operation pending
    saving = False  # an earlier state save is pending
    for p in sorted(pending, key=lambda p: p.seq):
        key = p.key
        if (not p.running and p.not_before <= now and key not in blocked
                and not (saving and key != "state")):
            return p
        blocked.add(key)
        saving = saving or key == "state"
    return None


@dataclass
class _Queue:
    items: list[Pending] = field(default_factory=list)
    seq: int = 0
    fatal: bool = False


class Actuator:
    """A few threads running operations by object; outcomes go to `sink` as ActionDone."""

    WRITER_KEY = "writer"

    def __init__(self, pods: PodsApi, store: StateApi, *, resource_version: str | None,
                 writer: str, sink: Callable[[ActionDone], None],
                 clock: Callable[[], float] = time.monotonic,
                 backoff_initial_s: float = 0.2, backoff_max_s: float = 5.0,
                 may_act: Callable[[], bool] = lambda: True, workers: int = WORKERS,
                 budgets: BudgetsApi | None = None, secrets: SecretsApi | None = None,
                 keygen: Callable[[str], hostkeys.HostKey] = hostkeys.generate) -> None:
        self.pods, self.store, self.rv, self.writer = pods, store, resource_version, writer
        self.budgets = budgets
        # Given: every pod created gets a host key of its own and a Secret holding it.
        self.secrets, self.keygen = secrets, keygen
        self.sink, self.clock, self.may_act = sink, clock, may_act
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._q = _Queue()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"actuator-{i}", daemon=True)
                         for i in range(workers)]

    def start(self) -> Actuator:
        for t in self._threads:
            t.start()
        return self

    def submit(self, op: Op) -> None:
        with self._cond:
            q = self._q
            if isinstance(op, SaveState | KeepBudget):
                queued = next((p for p in q.items if p.key == key_of(op) and not p.running),
                              None)
                if queued is not None:  # the newest replaces one not yet written
                    queued.op = op
                    self._cond.notify_all()
                    return
            q.seq += 1
            q.items.append(Pending(q.seq, op, self.clock(), backoff=Backoff(
                self.backoff_initial_s, self.backoff_max_s, random.random)))
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._q.items)

    def close(self, timeout: float = 10.0) -> int:
        """Finish what is queued within `timeout` seconds (at once if writes are not allowed
        now), then stop; return the operations abandoned."""
        deadline = self.clock() + timeout
        with self._cond:
            while (self._q.items and not self._q.fatal and self.may_act()
                   and self.clock() < deadline):
                self._cond.wait(min(PAUSED_POLL_S, max(0.0, deadline - self.clock())))
            self._stop.set()
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(2.0)
        with self._cond:
            return len(self._q.items)

    # -- the threads ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                item = self._next()
                if item is None:
                    return
                item.running = True
            outcome: ActionDone | _Retry | None = None
            try:
                outcome = self._attempt(item) if self.may_act() else None
            finally:
                with self._cond:
                    item.running = False
                    if outcome is None:  # held back: leadership paused
                        item.not_before = self.clock() + PAUSED_POLL_S
                    elif outcome is not _RETRY:
                        self._q.items.remove(item)
                        self._q.fatal = self._q.fatal or outcome.fatal
                    self._cond.notify_all()
            if outcome is not None and outcome is not _RETRY:
                self.sink(outcome)

    def _next(self) -> Pending | None:
        """Wait (holding the lock) for an operation that may run; None once stopped."""
        while not self._stop.is_set() and not self._q.fatal:
            now = self.clock()
            item = runnable(self._q.items, now)
            if item is not None:
                return item
            waits = [p.not_before - now for p in self._q.items
                     if not p.running and p.not_before > now]
            self._cond.wait(min(waits) if waits else None)
        return None

    def _attempt(self, item: Pending) -> ActionDone | _Retry:
        """One try of `item`: its final outcome, or _RETRY with its backoff set."""
        op = item.op
        what, name = _describe(op)
        if item.began_at is None:
            item.began_at = self.clock()
        try:
            self._once(item)
            return ActionDone(what, name, at=self.clock(), started_at=item.submitted_at,
                              note=item.note, began_at=item.began_at,
                              pod_at=item.pod_at if isinstance(op, CreatePod) else None)
        except KubeError as e:
            if isinstance(op, SaveState) and isinstance(e, NotFound) and self.rv:
                self.rv, item.note = None, "recreated: the ConfigMap was deleted"
                item.not_before = 0.0  # create it at once: it must be stored before what follows
                return _RETRY
            final = self._classify(op, e)
            if final is not None:
                return final
            if not item.reported:  # retryable: say so once, then keep trying
                self.sink(ActionDone(what, name, at=self.clock(), started_at=item.submitted_at,
                                     error=str(e), retrying=True))
                item.reported = True
        except Exception as e:  # a bug must reach the loop, not kill this thread
            return ActionDone(what, name, at=self.clock(), started_at=item.submitted_at,
                              error=f"{type(e).__name__}: {e}", fatal=True, note="bug")
        assert item.backoff is not None
        item.not_before = self.clock() + item.backoff.next()
        return _RETRY

    def _once(self, item: Pending) -> None:
        op = item.op
        if isinstance(op, SaveState):
            state = {**op.state, self.WRITER_KEY: self.writer}
            self.rv = self.store.save(state, self.rv)
        elif isinstance(op, CreatePod) and self.secrets is not None:
            self._create_with_host_key(item, op, self.secrets)
        elif isinstance(op, CreatePod):
            self.pods.create(op.body)
            item.pod_at = self.clock()
        elif isinstance(op, KeepBudget):
            if self.budgets is None:
                raise Forbidden("no PodDisruptionBudget API given to the actuator")
            self.budgets.keep(op.body)
        else:
            self.pods.delete(op.name, op.uid, op.grace_s)

    def _create_with_host_key(self, item: Pending, op: CreatePod, secrets: SecretsApi) -> None:
        """The pod, showing its own host key, then the Secret holding that key, owned by the
        pod (its uid): a retry after the pod was created makes only the Secret. The kubelet
        waits for a Secret volume that is not there yet, so the pod starts once it is."""
        if item.host_key is None:
            item.host_key = self.keygen(op.body["metadata"]["name"])
        if item.created is None:
            item.created = self.pods.create(hostkeys.with_host_key(op.body, item.host_key.public))
            item.pod_at = self.clock()
        try:
            secrets.create(hostkeys.secret_body(item.created, item.host_key))
        except AlreadyExists:
            pass  # an earlier try's, whose answer was lost: the same key
        except Refused as e:  # a quota on Secrets: the pod waits for it; try again
            raise KubeError(f"{e}; the pod waits for its host key's Secret", e.status) from e

    def _classify(self, op: Op, e: KubeError) -> ActionDone | None:
        """Return the final outcome of error `e`, or None to retry."""
        what, name = _describe(op)
        at = self.clock()
        if isinstance(op, KeepBudget) and (isinstance(e, Forbidden) or not e.retryable):
            return ActionDone(what, name, at=at, error=str(e))  # the job trains without it
        if isinstance(e, Forbidden):
            return ActionDone(what, name, at=at, error=str(e), fatal=True)
        if isinstance(op, CreatePod) and isinstance(e, Refused):
            return ActionDone(what, name, at=at, error=e.detail, refused=True)
        if isinstance(op, SaveState) and isinstance(e, Conflict):
            try:
                stored, rv = self.store.load()
            except KubeError:
                return None  # try the write again; it will conflict again and reload
            other = (stored or {}).get(self.WRITER_KEY)
            if other != self.writer:
                return ActionDone(what, name, at=at, fatal=True, error=(
                    f"{e}; the state was written by {other!r}, not by this supervisor "
                    f"({self.writer!r}): two supervisors must not run one job"))
            self.rv = rv
            return None
        if isinstance(op, CreatePod) and isinstance(e, AlreadyExists):
            return ActionDone(what, name, at=at, note="already exists")
        if isinstance(op, DeletePod) and isinstance(e, NotFound | Conflict):
            return ActionDone(what, name, at=at, note="already gone")
        if not e.retryable:
            # A state that cannot be stored must stop what was queued behind it.
            return ActionDone(what, name, at=at, error=str(e), fatal=isinstance(op, SaveState))
        return None


class _Retry:
    """An attempt that failed retryably; the operation stays queued."""


_RETRY = _Retry()


def _describe(op: Op) -> tuple[str, str]:
    if isinstance(op, SaveState):
        return "save", "state"
    if isinstance(op, CreatePod):
        return "create", op.body["metadata"]["name"]
    if isinstance(op, KeepBudget):
        return "budget", op.body["metadata"]["name"]
    return "delete", op.name
