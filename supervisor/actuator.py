"""ADAPTER: carries out the loop's changes to the cluster, in order, from one thread.

The loop never blocks on the API: it hands `SaveState`, `CreatePod` and `DeletePod` to
`Actuator.submit`; a single thread runs them in FIFO order (so the state that records a new
incarnation is always saved before that incarnation's pod is created) and reports each outcome to
the loop's queue as an `ActionDone`. Retryable errors (connection, timeouts, 429, 5xx) are
retried with jittered exponential backoff, reported once; "already exists" on create and "gone"
on delete count as done (the operations are idempotent by pod name and UID).

What is fatal: a denial of the supervisor's own verbs (RBAC 403), a state another supervisor
wrote (a Conflict whose stored writer is not us: two supervisors must never share a job's
budgets), and a state save that fails for good (the pods queued behind it would belong to
incarnations no state records). After a fatal outcome nothing queued runs. A state ConfigMap
that is gone (404 on update) is created again. A create that admission refuses (ResourceQuota,
LimitRange, PodSecurity) is reported as `refused` and not retried here: the loop decides whether
and when that pod is still wanted. Nothing runs while `may_act` says this supervisor is not the
job's leader.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from supervisor.kube import AlreadyExists, Conflict, Forbidden, KubeError, NotFound, Refused
from supervisor.model import ActionDone


class PodsApi(Protocol):
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete(self, name: str, uid: str | None, grace_s: int | None) -> None: ...


class StateApi(Protocol):
    def load(self) -> tuple[dict[str, Any] | None, str | None]: ...
    def save(self, state: Mapping[str, Any], resource_version: str | None) -> str: ...


@dataclass(frozen=True)
class SaveState:
    state: Mapping[str, Any]


@dataclass(frozen=True)
class CreatePod:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str | None
    grace_s: int | None


Op = SaveState | CreatePod | DeletePod


class Actuator:
    """One thread running operations in order; outcomes go to `sink` as ActionDone."""

    WRITER_KEY = "writer"

    def __init__(self, pods: PodsApi, store: StateApi, *, resource_version: str | None,
                 writer: str, sink: Callable[[ActionDone], None],
                 clock: Callable[[], float] = time.monotonic,
                 backoff_initial_s: float = 0.2, backoff_max_s: float = 5.0,
                 may_act: Callable[[], bool] = lambda: True) -> None:
        self.pods, self.store, self.rv, self.writer = pods, store, resource_version, writer
        self.sink, self.clock, self.may_act = sink, clock, may_act
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.queue: queue.Queue[Op | None] = queue.Queue()
        self._stop = threading.Event()
        self._abandoned = 0
        self._thread = threading.Thread(target=self._run, name="actuator", daemon=True)

    def start(self) -> Actuator:
        self._thread.start()
        return self

    def submit(self, op: Op) -> None:
        self.queue.put_nowait(op)

    def close(self, timeout: float = 10.0) -> int:
        """Finish what is queued within `timeout` seconds, then stop; return ops abandoned."""
        self.queue.put_nowait(None)
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(2.0)
        left = []
        while True:
            try:
                left.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return self._abandoned + sum(op is not None for op in left)

    def _run(self) -> None:
        while not self._stop.is_set():
            op = self.queue.get()
            if op is None:
                return
            if not self.may_act():  # no longer the job's leader: nothing more may change
                self._abandoned += 1
                self._stop.set()
                return
            if self._execute(op).fatal:
                self._stop.set()

    def _execute(self, op: Op) -> ActionDone:
        what, name = _describe(op)
        started = self.clock()
        delay, reported, note = self.backoff_initial_s, False, ""
        while True:
            try:
                self._once(op)
                done = ActionDone(what, name, at=self.clock(), started_at=started, note=note)
                self.sink(done)
                return done
            except KubeError as e:
                if isinstance(op, SaveState) and isinstance(e, NotFound) and self.rv:
                    self.rv, note = None, "recreated: the ConfigMap was deleted"
                    continue  # create it at once: the state must be stored before what follows
                final = self._classify(op, e)
                if final is not None:
                    self.sink(final)
                    return final
                if not reported:  # retryable: say so once, then keep trying
                    self.sink(ActionDone(what, name, at=self.clock(), started_at=started,
                                         error=str(e), retrying=True))
                    reported = True
            except Exception as e:  # a bug must reach the loop, not kill this thread
                bug = ActionDone(what, name, at=self.clock(), started_at=started,
                                 error=f"{type(e).__name__}: {e}", fatal=True, note="bug")
                self.sink(bug)
                return bug
            if self._stop.wait(delay * (0.5 + random.random())):
                return ActionDone(what, name, at=self.clock(), error="stopped", fatal=True)
            delay = min(self.backoff_max_s, delay * 2)

    def _once(self, op: Op) -> None:
        if isinstance(op, SaveState):
            state = {**op.state, self.WRITER_KEY: self.writer}
            self.rv = self.store.save(state, self.rv)
        elif isinstance(op, CreatePod):
            self.pods.create(op.body)
        else:
            self.pods.delete(op.name, op.uid, op.grace_s)

    def _classify(self, op: Op, e: KubeError) -> ActionDone | None:
        """Return the final outcome of error `e`, or None to retry."""
        what, name = _describe(op)
        at = self.clock()
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


def _describe(op: Op) -> tuple[str, str]:
    if isinstance(op, SaveState):
        return "save", "state"
    if isinstance(op, CreatePod):
        return "create", op.body["metadata"]["name"]
    return "delete", op.name
