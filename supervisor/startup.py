"""The start of a run: what happens between an API client and the loop, against a real cluster.

In order: the launcher's references (the pod Events regard, and the Job that owns the job's
workers and state), the job's leader Lease (a second launcher waits here as a standby), the
stored fleet (slots and budgets), and adoption (workers and a state an older launcher pod owned
are re-owned by the Job, so the garbage collector never takes them with that pod).

The API server may be restarting or unreachable when a launcher starts: `ApiRetry` retries
transient errors (connection refused, timeouts, 429, 5xx, admission refusals) with jittered
exponential backoff (0.2 s doubling to 5 s), each call until it has failed for the start budget
in a row (START_TIMEOUT_SECONDS): then `StartTimedOut` (exit 3). A permanent error (RBAC
denial, 404 where an object must exist) is raised at once. A signal during the start ends it
(`Stopped`) without touching anything.
"""

from __future__ import annotations

import contextlib
import queue
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from supervisor.decide.fleet import slot_of
from supervisor.kube import KubeError
from supervisor.observe import Obj
from supervisor.workers import owner_reference

T = TypeVar("T")


class StartTimedOut(Exception):
    """The Kubernetes API did not answer a call within its budget (ApiRetry)."""


class Stopped(Exception):
    """A signal arrived during the start: `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} during the start")
        self.signum = signum


class Stopping:
    """The signals that arrive before the loop owns them (its handlers replace these).

    The handler only puts into a SimpleQueue: a signal handler runs in the main thread between
    two bytecodes of whatever it interrupted, and a threading.Event (or queue.Queue) takes a
    Lock that the interrupted code may hold (inside Event.wait itself): the handler would
    wait for it for good. SimpleQueue.put is reentrant."""

    def __init__(self) -> None:
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.signum: int | None = None

    def handle(self, signum: int, _frame: object = None) -> None:
        self.signum = signum
        self._signals.put_nowait(signum)

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, less if a signal arrives; whether one has."""
        if self.signum is None:
            with contextlib.suppress(queue.Empty):
                self._signals.get(timeout=timeout)
        return self.signum is not None

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)


class ApiRetry:
    """Runs start calls, retrying transient API errors within a budget (see the module).
    `phase` names its log lines (`<phase>.api_retrying`) and `budget` the budget in its
    error (the cleanup at the exit retries its read of the Job the same way)."""

    def __init__(self, budget_s: float, *, log: Any, stopping: Stopping,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 initial_s: float = 0.2, max_s: float = 5.0, phase: str = "start",
                 budget: str = "START_TIMEOUT_SECONDS") -> None:
        self.budget_s, self.log, self.stopping = budget_s, log, stopping
        self.clock, self.rng, self.initial_s, self.max_s = clock, rng, initial_s, max_s
        self.phase, self.budget = phase, budget

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Return fn(); retry it on retryable KubeErrors; raise StartTimedOut or Stopped."""
        delay, first = self.initial_s, None
        while True:
            self.stopping.check()
            try:
                return fn()
            except KubeError as e:
                if not e.retryable:
                    raise
                now = self.clock()
                first = now if first is None else first
                failing = now - first
                if failing >= self.budget_s:
                    raise StartTimedOut(
                        f"the Kubernetes API did not answer ({what}) for {failing:.1f}s "
                        f"({self.budget} {self.budget_s:g}): {e}") from e
                wait = min(delay * (0.5 + self.rng() / 2), self.budget_s - failing)
                self.log.warning(f"{self.phase}.api_retrying", call=what, reason=str(e),
                                 failing_s=round(failing, 2), retry_in_s=round(wait, 2))
                self.stopping.wait(wait)
                delay = min(self.max_s, delay * 2)


def adopted_owners(refs: Iterable[Mapping[str, Any]],
                   owner: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """Return the ownerReferences an object of the job should get so that it is owned by
    `owner` (a launcher's or a Job's references replaced), or None if it already is."""
    ours = owner_reference(owner)
    current = [dict(r) for r in refs]
    if current == [ours]:
        return None
    launchers = {("v1", "Pod"), ("batch/v1", "Job")}
    return [r for r in current if (r.get("apiVersion"), r.get("kind")) not in launchers] + [ours]


def to_adopt(pods: Iterable[Obj], job: str,
             owner: Mapping[str, str]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Return (name, uid, new ownerReferences) of the job's worker pods to re-own."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if slot_of(pod, job) is None or meta.get("deletionTimestamp"):
            continue
        refs = adopted_owners(meta.get("ownerReferences") or (), owner)
        if refs is not None:
            out.append((meta["name"], meta.get("uid", ""), refs))
    return sorted(out, key=lambda t: t[0])
