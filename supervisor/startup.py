"""The start of a run: what happens between an API client and the loop, against a real cluster.

In order (runner.py calls the steps): the launcher's references (the pod Events regard, and the
Job that owns the job's workers and state), the job's leader Lease (a second launcher waits
here as a standby), the stored fleet (slots and budgets), and adoption (workers and a state an
older launcher pod owned are re-owned by the Job, so the garbage collector never takes them
with that pod), then a server-side dry run of the worker template.

The API server may be restarting or unreachable when a launcher starts: `ApiRetry` retries
transient errors (connection refused, timeouts, 429, 5xx, admission refusals) with jittered
exponential backoff (0.2 s doubling to 5 s), each call until it has failed for the start budget
in a row (START_TIMEOUT_SECONDS): then `StartTimedOut` (exit 3). A permanent error (RBAC
denial, 404 where an object must exist) is raised at once. A signal during the start ends it
(`Stopped`) without touching anything. What a thread started before the loop reports (the
leader elector's news) a `Relay` holds until the loop takes it.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from supervisor import hostkeys, kube
from supervisor.config import Config, SshHostKeys
from supervisor.decide import fleet, incidents, progress, stragglers
from supervisor.decide.fleet import slot_of
from supervisor.kube import KubeError
from supervisor.leader import LeaderElector
from supervisor.model import EventSpec
from supervisor.observe import Obj
from supervisor.workers import owner_reference, worker_pod

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


class Relay:
    """Holds what an early thread reports until the loop can take it (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Any] = []
        self._sink: Callable[[Any], None] | None = None

    def __call__(self, item: Any) -> None:
        with self._lock:
            if self._sink is None:
                self._held.append(item)
                return
        self._sink(item)

    def attach(self, sink: Callable[[Any], None]) -> None:
        with self._lock:
            self._sink, held, self._held = sink, self._held, []
        for item in held:
            sink(item)


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


# ---- the start's steps against the API (runner.py runs them in order) --------------------

class LauncherMissing(Exception):
    """SUPERVISOR_POD_NAME names no pod: bad input (exit 2)."""


def references(cfg: Config, api: Any, retry: ApiRetry
                ) -> tuple[dict[str, str], dict[str, str] | None, dict[str, Any] | None]:
    """Return (what Events regard, the owner of workers and state, the launcher pod). In a
    pod: the pod, and the Job that made it (else the pod); a local run: the Job by name, no
    owner and no pod."""
    if not cfg.pod_name:
        return {"apiVersion": "batch/v1", "kind": "Job", "namespace": cfg.namespace,
                "name": cfg.job_name}, None, None
    try:
        pod = retry.call("read the launcher pod", lambda: kube.read_pod(
            api, cfg.namespace, cfg.pod_name, cfg.api_timeout_s))  # type: ignore[arg-type]
        return (*kube.refs_of(pod), pod)
    except kube.NotFound as e:
        raise LauncherMissing(
            f"SUPERVISOR_POD_NAME={cfg.pod_name!r}: no such pod in namespace {cfg.namespace}; "
            "expected the launcher pod's own name (downward API metadata.name)") from e


def lead(cfg: Config, elector: LeaderElector, retry: ApiRetry,
         stopping: Stopping, *, log: Any, events: Callable[[EventSpec], None]) -> None:
    """Acquire the job's leader Lease; a standby waits here (until it is released, expires, or
    a signal arrives). Nothing of the job is touched before."""
    since = time.monotonic()
    shown, next_log = None, 0.0
    while not retry.call("acquire the leader lease", elector.attempt):
        now = time.monotonic()
        if elector.holder != shown or now >= next_log:
            log.info("leader.waiting", holder=elector.holder, lease=elector.name,
                     waited_s=round(now - since, 1))
            if shown is None:
                events(EventSpec("Normal", "LeaderWaiting", "Lead",
                                 f"standby: job {cfg.job_name} is driven by {elector.holder} "
                                 f"(Lease {elector.name}); waiting until it ends or its lease "
                                 "expires"))
            shown, next_log = elector.holder, now + 30
        stopping.wait(elector.retry_s)
        stopping.check()
    log.info("leader.acquired", lease=elector.name, identity=elector.me,
             transitions=elector.transitions, waited_s=round(time.monotonic() - since, 1))


def dry_run_template(cfg: Config, pods: kube.Pods, *, owner: Mapping[str, str] | None,
                     retry: ApiRetry, log: Any) -> str | None:
    """Create a worker built from the template as a server-side dry run (the schema, defaults
    and admission a real create goes through): a template the API server finds invalid (422)
    is bad configuration, found before training starts, not at the first replacement. Return
    why it was rejected, or None. A refusal by admission (quota, PodSecurity, a webhook) can
    pass later: reported, not fatal."""
    assert cfg.worker_template is not None
    # Incarnation 0: a name no worker ever has (they count from 1), so no AlreadyExists.
    body = worker_pod(cfg.worker_template, job=cfg.job_name, slot=0, incarnation=0,
                      owner=owner)
    if cfg.ssh_host_keys == SshHostKeys.WORKER:  # the shape admission sees at each create
        body = hostkeys.with_host_key(body, hostkeys.generate("dry-run").public)

    def dry_run() -> str | None:
        """None, or what admission refused (it may admit later: not retried here)."""
        try:
            pods.create(body, dry_run=True)
        except kube.AlreadyExists:
            pass  # validated and admitted before the name was found taken
        except kube.Refused as e:
            return e.detail
        return None

    try:
        refused = retry.call("dry-run a worker pod", dry_run)
    except kube.KubeError as e:
        if e.status != 422:
            raise
        log.error("template.rejected", reason=e.detail)
        return (f"SUPERVISOR_WORKER_TEMPLATE={str(cfg.worker_template_file)!r}: the API server "
                f"rejects a worker pod built from it: {e.detail}")
    if refused is not None:
        log.warning("template.dry_run_refused", reason=refused)
    else:
        log.info("template.dry_run_ok", pod=body["metadata"]["name"])
    return None


def adopt(cfg: Config, api: Any, store: kube.StateStore, stored: dict[str, Any] | None,
           rv: str | None, *, owner: Mapping[str, str] | None, identity: str,
           retry: ApiRetry, log: Any, events: Callable[[EventSpec], None]
           ) -> str | None:
    """Re-own the job's workers and state that another owner (an older launcher pod) holds;
    return the state's resourceVersion after it."""
    if owner is None:
        return rv
    pods = kube.Pods(api, cfg.namespace, cfg.api_timeout_s)
    found = retry.call("list the workers", lambda: kube.list_pods(
        api, cfg.namespace, cfg.worker_selector, cfg.api_timeout_s))
    moved = []
    for name, uid, refs in to_adopt(found, cfg.job_name, owner):
        try:
            retry.call(f"re-own pod {name}",
                       lambda name=name, uid=uid, refs=refs: pods.set_owners(name, uid, refs))
            moved.append(name)
        except kube.KubeError as e:
            if e.status not in (404, 409, 422):  # gone, or another pod of that name now
                raise
    state = stored is not None and not store.owned()
    if state:
        def save() -> str:
            try:
                return store.save({**(stored or {}), "writer": identity}, rv)
            except kube.Conflict as e:  # nobody else may write it while we lead
                raise kube.KubeError(f"{e}: written by someone else during the start") from e
        rv = retry.call("re-own the state", save)
    if moved or state:
        log.info("owner.adopted", owner=f"{owner['kind']}/{owner['name']}", pods=moved,
                 state=state)
        events(EventSpec("Normal", "Adopted", "Start",
                         f"owned by {owner['kind']} {owner['name']} now: "
                         f"{len(moved)} worker pods{' and the state' if state else ''}"))
    return rv


def load_fleet(cfg: Config, store: kube.StateStore
               ) -> tuple[fleet.Fleet, str | None, dict[str, Any] | None]:
    """Return the stored fleet (or a new one), its resourceVersion and the stored state as
    read; raise KubeError or ValueError naming the ConfigMap when it cannot be used."""
    stored, rv = store.load()
    if stored is None:
        return fleet.initial(fleet.workers_for(cfg.np, cfg.slots_per_worker)), None, None
    try:
        progress.from_dict(stored.get("progress"))
        incidents.from_list(stored.get("incidents"))
        stragglers.moves_from_dict(stored.get("slowMoves"))
        return fleet.fleet_from_dict(stored), rv, stored
    except ValueError as e:
        raise ValueError(f"configmap {cfg.namespace}/{store.name}: {store.KEY}: {e}; fix or "
                         "delete it deliberately (deleting resets the restart budgets)") from e
