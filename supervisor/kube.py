"""ADAPTER: the only module importing the Kubernetes client.

Owns: building an API client (in-cluster or kubeconfig), the `Reflector` (list + watch with
paging, bookmarks, resume from the last resourceVersion, relist-and-diff on 410 Gone, jittered
exponential backoff, a client read timeout), the `EventRecorder` (events.k8s.io/v1 Events posted
from a background thread), the state ConfigMap, worker pods and the leader Lease, and the
mapping of client errors to our own `KubeError`s: an RBAC denial of our own verbs (`Forbidden`)
is permanent, an admission refusal of an object (`Refused`: quota, LimitRange, PodSecurity) is
not. Every call but a watch has a client timeout (connect and read), so a connection that
stalls mid-request is given up instead of holding the caller forever.

Objects cross this boundary as API-shaped dicts (camelCase JSON), never client model classes:
lists and watches are read with `_preload_content=False` and parsed with `json`, which is also
much cheaper than the client's model deserialisation at 1000 pods. Reflector threads never
block on their consumer: they hand every item to a non-blocking `sink` (a queue put).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import queue
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from supervisor import eventseries
from supervisor.model import EventSpec, SourceState, WatchEvent
from supervisor.observe import KIND_NAMES, EventType, Kind
from supervisor.workers import owner_reference

REPORTING_CONTROLLER = "elastic-supervisor.io/supervisor"
NODE_LEASE_NAMESPACE = "kube-node-lease"
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


# ---- errors -------------------------------------------------------------------------------------

class KubeError(Exception):
    """An API call failed. `retryable` says whether trying again later can help."""

    retryable = True

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = message  # the API's own words (e.g. for an Event note)


class Forbidden(KubeError):
    """403 from the authorizer: the supervisor's own permission is missing. Permanent."""

    retryable = False


class Refused(KubeError):
    """403 from admission: the request was allowed, this object was not (ResourceQuota
    exceeded, LimitRange, PodSecurity, a webhook). Freed quota or a relabelled namespace can
    admit it later: wait and retry, never fail the job for it. `detail` is the API's reason."""


class Gone(KubeError):
    """410: the resourceVersion is too old; relist."""


class NotFound(KubeError):
    retryable = False


class Damaged(KubeError):
    """An object we keep holds what we cannot read (hand-edited, truncated): permanent until
    someone fixes or deletes it; never reset in its place."""

    retryable = False


class Conflict(KubeError):
    """409: someone else wrote first (optimistic concurrency, or a quota being updated)."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: an object of that name is there (a create already done)."""


# The authorizer's denial: 'User "system:serviceaccount:ns:sa" cannot create resource "pods"
# in API group "" in the namespace "ns"'. OwnerReferencesPermissionEnforcement's: "cannot set
# blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on" /
# "cannot set an ownerRef on a resource you can't delete": also our own permission.
_DENIED = re.compile(r'\bcannot \w+ resource "|\bcannot set (blockOwnerDeletion|an ownerRef)\b')


def map_error(e: Exception, what: str) -> KubeError:
    """Return our error for a client exception raised while doing `what`."""
    if isinstance(e, ApiException):
        status = e.status
        reason, why = _status(e)
        err: KubeError
        if status == 403 and not _DENIED.search(reason):
            err = Refused(f"{what}: refused by admission: {reason}", 403)
        elif status == 403:
            err = Forbidden(f"{what}: forbidden: {reason}", 403)
        elif status == 410:
            err = Gone(f"{what}: resourceVersion expired (410 Gone)", 410)
        elif status == 404:
            err = NotFound(f"{what}: not found: {reason}", 404)
        elif status == 409 and why == "AlreadyExists":
            err = AlreadyExists(f"{what}: already exists: {reason}", 409)
        elif status == 409:
            err = Conflict(f"{what}: conflict: {reason}", 409)
        else:
            err = KubeError(f"{what}: HTTP {status}: {reason}", status)
            err.retryable = status in (429,) or (status or 0) >= 500 or status == 0
        err.detail = reason
        return err
    err = KubeError(f"{what}: {type(e).__name__}: {e}")
    err.detail = f"{type(e).__name__}: {e}"
    return err


def _status(e: ApiException) -> tuple[str, str]:
    """Return the Status message (else the HTTP reason) and the Status reason of `e`."""
    try:
        body = json.loads(e.body or "{}")
        return body.get("message") or e.reason or "", body.get("reason") or ""
    except (ValueError, AttributeError):
        return str(e.reason), ""


def request_timeout(timeout_s: float) -> tuple[float, float]:
    """The client's (connect, read) timeout for a call that may take `timeout_s` seconds."""
    return min(5.0, timeout_s), timeout_s


class NotLeading(KubeError):
    """A write not sent: the leader's renew deadline is (about to be) passed. Retried once
    leadership is back; a standby may own the job by then."""


# Below this much time left before the renew deadline a write is not started at all.
MIN_WINDOW_S = 0.2


def write_timeout(timeout: tuple[float, float], window: Callable[[], float] | None,
                  what: str) -> tuple[float, float]:
    """The (connect, read) timeout of a write: its own, cut to what is left of the leader's
    renew deadline (`window`: seconds), so that a write started just before it cannot land
    after a standby took the job over (the connection is closed at the deadline, and a request
    it still held is never sent). NotLeading when too little is left to start one."""
    if window is None:
        return timeout
    left = window()
    if left < MIN_WINDOW_S:
        raise NotLeading(f"{what}: not sent, {max(0.0, left):.1f}s left before the leader's "
                         "renew deadline")
    return min(timeout[0], left), min(timeout[1], left)


# ---- client -------------------------------------------------------------------------------------

def in_cluster_namespace() -> str | None:
    """Return the pod's namespace from the service account mount, if running in a pod."""
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


def kubeconfig_namespace() -> str | None:
    """Return the current kubeconfig context's namespace, if a kubeconfig is readable."""
    try:
        _, current = config.list_kube_config_contexts()
    except (ConfigException, OSError, TypeError, ValueError):
        return None
    return (current or {}).get("context", {}).get("namespace")


def make_api_client(config_file: str | None = None) -> client.ApiClient:
    """Return an ApiClient: in-cluster service account if in a pod, else the kubeconfig.

    urllib3's own retries are switched off: they retry at once, without backoff, underneath
    ours; every retry here is the reflector's or the caller's, jittered and bounded.
    """
    cfg = client.Configuration()
    try:
        if (config_file is None and os.environ.get("KUBERNETES_SERVICE_HOST")
                and SA_NAMESPACE_FILE.exists()):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=config_file, client_configuration=cfg)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        raise KubeError(f"no usable Kubernetes credentials (in-cluster or KUBECONFIG): {e}") from e
    cfg.retries = False
    return _ApiClient(cfg)


class _ApiClient(client.ApiClient):
    """The client's ApiClient, except that a TLS error (urllib3's SSLError: a connection reset
    in the handshake, an API server going down or a proxy dropping us) stays what the client
    means it to be, an ApiException with status 0 (retried): the client wraps it without a
    body and then crashes decoding that body (AttributeError, which would end the run as a bug)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().request(*args, **kwargs)
        except ApiException as e:
            if e.body is None:
                e.body = b""
            raise


def lister(api: client.ApiClient, kind: Kind, namespace: str, selector: str) -> Callable[..., Any]:
    """Return the list function for `kind` (pods: namespaced + selector; nodes: all; leases:
    the node heartbeats in kube-node-lease)."""
    core = client.CoreV1Api(api)
    if kind is Kind.POD:
        def list_pods(**kw: Any) -> Any:
            return core.list_namespaced_pod(namespace, label_selector=selector, **kw)
        return list_pods
    if kind is Kind.SCALE:  # one ConfigMap, named by `selector` (a field selector)
        def list_scale(**kw: Any) -> Any:
            return core.list_namespaced_config_map(namespace, field_selector=selector, **kw)
        return list_scale
    if kind is Kind.LEASE:
        coordination = client.CoordinationV1Api(api)

        def list_leases(**kw: Any) -> Any:
            return coordination.list_namespaced_lease(NODE_LEASE_NAMESPACE, **kw)
        return list_leases
    return core.list_node


# ---- reflector ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WatchSettings:
    """Timings of one reflector. Seconds."""

    read_timeout_s: float = 90.0  # > the ~60 s bookmark gap: a dead socket is noticed after this
    connect_timeout_s: float = 5.0
    server_timeout_s: float = 300.0  # the server ends each watch after ~this (jittered -20%)
    page_size: int = 250
    backoff_initial_s: float = 0.2
    # A watch comes back at most this long (plus a connect timeout) after the API server does:
    # the supervisor decides nothing until its view is synced again. At 30 s a soak's watches
    # came back 32 s and 42 s after a 3-minute outage ended and a frozen node waited for them;
    # at 5 s an outage costs the server one attempt per reflector every 2.5-5 s.
    backoff_max_s: float = 5.0


class Backoff:
    """Jittered exponential backoff ("full jitter" over a doubling cap)."""

    def __init__(self, initial: float, maximum: float, rng: Callable[[], float]) -> None:
        self.initial, self.maximum, self.rng = initial, maximum, rng
        self.attempt = 0

    def next(self) -> float:
        cap = min(self.maximum, self.initial * 2 ** self.attempt)
        self.attempt += 1
        return cap / 2 + self.rng() * cap / 2

    def reset(self) -> None:
        self.attempt = 0


class Reflector:
    """List + watch one kind of object in a thread, handing WatchEvents / SourceStates to `sink`."""

    def __init__(
        self,
        kind: Kind,
        list_fn: Callable[..., Any],
        sink: Callable[[WatchEvent | SourceState], None],
        settings: WatchSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
        transform: Callable[[Kind, Mapping[str, Any]], Mapping[str, Any]] | None = None,
    ) -> None:
        self.kind, self.list_fn, self.sink = kind, list_fn, sink
        # Applied to every object before it is handed on (e.g. observe.slim: keep less memory).
        self.transform = transform or (lambda _kind, obj: obj)
        self.settings = settings or WatchSettings()
        self.clock, self.rng = clock, rng
        self.backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s, rng)
        self.resource_version: str | None = None
        self.known: dict[str, str] = {}  # name -> resourceVersion, for relist diffs
        self.fatal: KubeError | None = None
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"reflector-{kind}", daemon=True)
        self._broken = False
        self.connects = 0
        self.relists = 0

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.reconnect()
        self._thread.join(timeout)

    def reconnect(self) -> None:
        """End the current watch connection now (it may be silently dead: a partition that
        just healed); unless stopped, the thread resumes from the last resourceVersion."""
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                # urllib3 >= 2.3 can interrupt a blocking read from another thread.
                (getattr(resp, "shutdown", None) or resp.close)()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- thread body --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # a bug: never die silently, the loop must stop the run
            self.sink(SourceState(self.kind, self.clock(), broken=True, fatal=True,
                                  crashed=True, reason=f"reflector crashed: {e!r}"))
            raise

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                started = self.clock()
                delivered = self._watch_once()
                if not delivered and self.clock() - started < 1.0:
                    # The server ended a watch at once without a word: never spin on that.
                    self._stop.wait(self.backoff.next())
            except KubeError as e:
                if isinstance(e, Gone):
                    self.resource_version = None
                if not e.retryable:
                    self.fatal = e
                    self.sink(SourceState(self.kind, self.clock(), broken=True, reason=str(e),
                                          fatal=True))
                    return
                if not self._broken:
                    self.sink(SourceState(self.kind, self.clock(), broken=True, reason=str(e)))
                    self._broken = True
                if isinstance(e, Gone):
                    continue  # relist at once: the server is there, our RV is just too old
                self._stop.wait(self.backoff.next())

    def _relist(self) -> None:
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        rv = ""
        while True:
            kw: dict[str, Any] = {
                "limit": self.settings.page_size, "_preload_content": False,
                "_request_timeout": (self.settings.connect_timeout_s,
                                     self.settings.read_timeout_s),
            }
            if token:
                kw["_continue"] = token
            body = self._call(lambda kw=kw: self.list_fn(**kw), "list")
            # Transform page by page, so at most one page of full objects is alive at once.
            items.extend(self.transform(self.kind, it) for it in body.get("items") or ())
            meta = body.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            token = meta.get("continue")
            if not token:
                break
        now = self.clock()
        fresh = {it["metadata"]["name"]: it for it in items}
        del items
        kind_name = KIND_NAMES[self.kind]
        for name in [n for n in self.known if n not in fresh]:
            self.known.pop(name)
            self.sink(WatchEvent(self.kind, EventType.DELETED, {
                "kind": kind_name, "metadata": {"name": name}}, now, relist=True))
        for name, obj in fresh.items():
            prev = self.known.get(name)
            rv_obj = obj["metadata"].get("resourceVersion", "")
            if prev == rv_obj:
                continue
            obj.setdefault("kind", kind_name)
            etype = EventType.ADDED if prev is None else EventType.MODIFIED
            self.known[name] = rv_obj
            self.sink(WatchEvent(self.kind, etype, obj, now, relist=True))
        self.resource_version = rv
        self.relists += 1
        self.sink(SourceState(self.kind, now, synced=True, broken=False, relisted=True))

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            resp = fn()
            try:
                return json.loads(resp.data)
            finally:
                resp.release_conn()
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise map_error(e, f"{what} {self.kind}s") from e

    def _watch_once(self) -> bool:
        """Run one watch connection to its end; return whether it delivered anything."""
        s = self.settings
        server_timeout = int(s.server_timeout_s * (0.8 + 0.2 * self.rng()))
        try:
            resp = self.list_fn(
                watch=True, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=max(1, server_timeout),
                _preload_content=False, _request_timeout=(s.connect_timeout_s, s.read_timeout_s),
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"watch {self.kind}s") from e
        self._resp = resp
        self.connects += 1
        self._broken = False
        self.sink(SourceState(self.kind, self.clock(), broken=False))
        got_any = False
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    return got_any
                ev = json.loads(line)
                etype, obj = ev.get("type"), ev.get("object") or {}
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise Gone(f"watch {self.kind}s: 410 Gone: {obj.get('message')}", 410)
                    raise KubeError(f"watch {self.kind}s: error event {obj}", code)
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype == "BOOKMARK":
                    self.resource_version = rv or self.resource_version
                    got_any = True
                    self.sink(SourceState(self.kind, self.clock()))
                    continue
                if etype not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                name = obj["metadata"]["name"]
                if etype == "DELETED":
                    self.known.pop(name, None)
                else:
                    self.known[name] = rv or ""
                self.resource_version = rv or self.resource_version
                got_any = True
                self.sink(WatchEvent(self.kind, EventType(etype), self.transform(self.kind, obj),
                                     self.clock()))
            if got_any:
                self.backoff.reset()
            return got_any
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            if self._stop.is_set():
                return got_any
            raise map_error(e, f"watch {self.kind}s") from e
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()


def _lines(resp: Any) -> Iterator[bytes]:
    """Yield complete newline-terminated lines from a streaming HTTP response."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1:]
            if line.strip():
                yield line
    if buf.strip():
        yield buf


# ---- events -------------------------------------------------------------------------------------

def micro_time(t: dt.datetime) -> str:
    """Format a MicroTime: exactly six fractional digits, UTC, 'Z'."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(namespace: str, w: eventseries.Write, when: str, *, instance: str,
               regarding: Mapping[str, str]) -> dict[str, Any]:
    """The events.k8s.io/v1 Event the recorder creates for `w` (first seen at MicroTime
    `when`)."""
    spec = w.spec
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": w.name, "namespace": namespace},
            "eventTime": when, "type": spec.type, "reason": spec.reason,
            "action": spec.action, "note": spec.note[:1024],
            "reportingController": REPORTING_CONTROLLER, "reportingInstance": instance[:128],
            "regarding": dict(regarding)}


def series_patch(w: eventseries.Write, when: str) -> dict[str, Any]:
    """The patch that brings an Event's series to `w.count`, last observed at `when`."""
    return {"series": {"count": w.count, "lastObservedTime": when}}


class EventRecorder:
    """Posts events.k8s.io/v1 Events about the launcher pod from a background thread.

    `record` never blocks the caller; if the API is slow, up to `capacity` events queue up and
    further ones are dropped (counted). Repeated and similar Events become series and combined
    Events (eventseries.Correlator, as client-go's EventCorrelator), so a storm of decisions
    costs a bounded number of writes; the decisions' log lines are unaffected. Failures are
    reported through `on_error`; a write that stalls is given up after `timeout_s`.
    """

    def __init__(self, api: client.ApiClient, namespace: str, *,
                 regarding: Mapping[str, str], instance: str,
                 on_error: Callable[[KubeError], None], capacity: int = 1000,
                 timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events = client.EventsV1Api(api)
        self.namespace, self.regarding, self.instance = namespace, regarding, instance
        self.on_error, self.timeout, self.clock = on_error, request_timeout(timeout_s), clock
        self.queue: queue.Queue[EventSpec | None] = queue.Queue(capacity)
        self.dropped = 0
        self.posted = 0  # Events created
        self.updated = 0  # series written
        self.recorded = 0
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def record(self, spec: EventSpec) -> None:
        try:
            self.queue.put_nowait(spec)
            self.recorded += 1
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued and the series held back (up to `timeout` seconds) and stop
        the thread."""
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        series = eventseries.Correlator()
        while True:
            due = series.next_due()
            try:
                spec = self.queue.get(timeout=None if due is None
                                      else max(0.0, due - self.clock()))
            except queue.Empty:
                self._write(series.due(self.clock()))
                continue
            if spec is None:
                self._write(series.flush())
                return
            now = self.clock()
            name = f"{self.instance}.{uuid.uuid4().hex[:12]}"
            self._write(series.observe(spec, now, name) + series.due(now))

    def _write(self, writes: list[eventseries.Write]) -> None:
        for w in writes:
            when = micro_time(dt.datetime.now(dt.UTC))
            try:
                if w.create:
                    self.events.create_namespaced_event(self.namespace, event_body(
                        self.namespace, w, when, instance=self.instance,
                        regarding=self.regarding), _request_timeout=self.timeout)
                    self.posted += 1
                else:
                    self.events.patch_namespaced_event(w.name, self.namespace,
                                                       series_patch(w, when),
                                                       _request_timeout=self.timeout)
                    self.updated += 1
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
                verb = "create" if w.create else "update the series of"
                self.on_error(map_error(e, f"{verb} events.k8s.io/v1 Event"))


# ---- ownership ----------------------------------------------------------------------------------

def read_pod(api: client.ApiClient, namespace: str, pod: str,
             timeout_s: float = 30.0) -> dict[str, Any]:
    """Return the pod as the API server has it (a dict); NotFound if it does not exist."""
    try:
        resp = client.CoreV1Api(api).read_namespaced_pod(
            pod, namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return dict(json.loads(resp.data))
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"get pod {namespace}/{pod}") from e


def launcher_refs(api: client.ApiClient, namespace: str, pod: str,
                  timeout_s: float = 30.0) -> tuple[dict[str, str], dict[str, str]]:
    """Return (the launcher pod, the owner of the job's objects) as references (refs_of)."""
    return refs_of(read_pod(api, namespace, pod, timeout_s))


def refs_of(obj: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Return (the launcher pod `obj`, the owner of the job's objects) as references.

    The owner is the batch/v1 Job that controls the launcher pod: its next pod (a Job retry)
    has the same one, and a finished launcher pod can go (PodGC, node removal) without taking
    the workers or the budgets. A launcher pod without a Job owns them itself."""
    meta = obj["metadata"]
    namespace = meta["namespace"]
    regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                 "name": meta["name"], "uid": meta["uid"]}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and (ref.get("apiVersion"), ref.get("kind")) == (
                "batch/v1", "Job"):
            return regarding, {"apiVersion": "batch/v1", "kind": "Job", "namespace": namespace,
                               "name": ref["name"], "uid": ref["uid"]}
    return regarding, regarding


def drop_connections(api: client.ApiClient) -> None:
    """Close the client's pooled connections: after a partition they may be silently dead,
    and a call on one would wait its whole timeout; the next calls connect anew."""
    with contextlib.suppress(Exception):
        api.rest_client.pool_manager.clear()


def read_job(api: client.ApiClient, namespace: str, name: str,
             timeout_s: float = 30.0) -> dict[str, Any]:
    """The batch/v1 Job `name` as a dict; raise KubeError (NotFound if it is gone)."""
    try:
        resp = client.BatchV1Api(api).read_namespaced_job(
            name, namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return json.loads(resp.data)  # type: ignore[no-any-return]
    except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        raise map_error(e, f"get job {namespace}/{name}") from e


def pod_reference(api: client.ApiClient, namespace: str, name: str,
                  timeout_s: float = 30.0) -> dict[str, str]:
    """Return an ObjectReference to the pod `name` (with its UID); raise KubeError."""
    return launcher_refs(api, namespace, name, timeout_s)[0]


def create_config_map(api: client.ApiClient, namespace: str, body: Mapping[str, Any],
                      timeout_s: float = 30.0) -> dict[str, Any]:
    """Create ConfigMap `body` (its name may be a generateName); return it as created."""
    meta = body["metadata"]
    what = f"create configmap {namespace}/{meta.get('name') or meta.get('generateName', '')}"
    try:
        resp = client.CoreV1Api(api).create_namespaced_config_map(
            namespace, body, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return dict(json.loads(resp.data))
    except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        raise map_error(e, what) from e


# ---- state --------------------------------------------------------------------------------------

def decode_state(raw: str, where: str) -> dict[str, Any]:
    """The JSON object `raw` (a ConfigMap value we keep, named by `where`); raise Damaged with
    one line when it is not JSON, holds a number JSON has not (NaN, Infinity, 1e400), or is not
    an object."""
    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value

    def constant(text: str) -> float:
        raise ValueError(f"{text} is not a JSON number")

    try:
        state = json.loads(raw, parse_float=finite, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        raise Damaged(f"{where} is not JSON ({e or 'nested too deep'}); fix or delete it "
                      "deliberately") from e
    if not isinstance(state, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number",
                float: "a number"}.get(type(state), "null")
        raise Damaged(f"{where} is not a JSON object ({kind}: {raw[:40]!r}); fix or delete it "
                      "deliberately")
    return state


class StateStore:
    """The supervisor's persisted state: ConfigMap `name` (key state.json), owned by the
    launcher Job so it goes with the job, written with optimistic concurrency.

    `save` with the resourceVersion `load` returned; a Conflict means someone (an earlier or a
    second supervisor) wrote meanwhile: load again and re-apply, never overwrite blindly. A
    save writes `owner` as the only owner (re-owning a state an older launcher pod owned);
    without one, it keeps the owners it loaded. NotFound on an update: the ConfigMap was
    deleted; save again with None to create it.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str,
                 owner: Mapping[str, str] | None, key: str = "state.json", *,
                 timeout_s: float = 30.0, window: Callable[[], float] | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name, self.owner, self.KEY = namespace, name, owner, key
        self.timeout = request_timeout(timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)
        self.owners: list[dict[str, Any]] = []  # the ownerReferences last loaded or saved

    def load(self) -> tuple[dict[str, Any] | None, str | None]:
        """Return (state, resourceVersion), or (None, None) if nothing is stored yet."""
        try:
            resp = self.core.read_namespaced_config_map(self.name, self.namespace,
                                                        _preload_content=False,
                                                        _request_timeout=self.timeout)
            cm = json.loads(resp.data)
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise map_error(e, f"get configmap {self.namespace}/{self.name}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"get configmap {self.namespace}/{self.name}") from e
        self.owners = list(cm["metadata"].get("ownerReferences") or ())
        raw = (cm.get("data") or {}).get(self.KEY)
        state = None if raw is None else decode_state(
            raw, f"configmap {self.namespace}/{self.name}: {self.KEY}")
        return state, cm["metadata"]["resourceVersion"]

    def owned(self) -> bool:
        """Whether the ConfigMap loaded is owned as `save` would own it."""
        return self.owner is None or self.owners == [owner_reference(self.owner)]

    def save(self, state: Mapping[str, Any], resource_version: str | None) -> str:
        """Store `state` if the ConfigMap is still at `resource_version` (None: create it);
        return the new resourceVersion; raise Conflict if someone wrote meanwhile."""
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/managed-by": "elastic-supervisor"}}
        owners = [owner_reference(self.owner)] if self.owner is not None else self.owners
        if owners:
            meta["ownerReferences"] = owners
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {self.KEY: json.dumps(state, sort_keys=True)}}
        what = f"{'create' if resource_version is None else 'update'} configmap " \
               f"{self.namespace}/{self.name}"
        timeout = write_timeout(self.timeout, self.window, what)
        try:
            if resource_version is None:
                resp = self.core.create_namespaced_config_map(self.namespace, body,
                                                              _preload_content=False,
                                                              _request_timeout=timeout)
            else:
                meta["resourceVersion"] = resource_version
                resp = self.core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                               _preload_content=False,
                                                               _request_timeout=timeout)
            saved = json.loads(resp.data)["metadata"]
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e
        self.owners = list(saved.get("ownerReferences") or ())
        return saved["resourceVersion"]


def list_pods(api: client.ApiClient, namespace: str, selector: str,
              timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Return the pods matching `selector` as dicts (status, cleanup, adoption)."""
    try:
        resp = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False,
            _request_timeout=request_timeout(timeout_s))
        return json.loads(resp.data).get("items") or []
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"list pods in {namespace}") from e


def list_events(api: client.ApiClient, namespace: str, timeout_s: float = 30.0, *,
                controller: str | None = None) -> list[dict[str, Any]]:
    """Return the events.k8s.io/v1 Events of `namespace` as dicts (for status and tests);
    with `controller`, only those it reported (selected by the API server: a namespace holds
    the kubelet's and the scheduler's Events about every pod too)."""
    selector = {} if controller is None else {
        "field_selector": f"reportingController={controller}"}
    try:
        resp = client.EventsV1Api(api).list_namespaced_event(
            namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s),
            **selector)
        return json.loads(resp.data).get("items") or []
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"list events in {namespace}") from e


class _CoreWriter:
    """The core API in `namespace`, each write's timeout cut to the leader's time left."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 request_timeout_s: float = 30.0,
                 window: Callable[[], float] | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.timeout = namespace, request_timeout(request_timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)


class Pods(_CoreWriter):
    """Creates, deletes and re-owns worker pods (bodies are API-shaped dicts); raises
    KubeError."""

    def create(self, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create the pod (`dry_run`: only validated and admitted by the API server, all its
        admission included, nothing stored)."""
        what = (f"{'dry-run ' if dry_run else ''}create pod "
                f"{self.namespace}/{body['metadata']['name']}")
        extra = {"dry_run": "All"} if dry_run else {}
        timeout = self.timeout if dry_run else write_timeout(self.timeout, self.window, what)
        try:
            resp = self.core.create_namespaced_pod(self.namespace, body, _preload_content=False,
                                                   _request_timeout=timeout, **extra)
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e

    def delete(self, name: str, uid: str | None, grace_s: int | None) -> None:
        """Delete pod `name` (only if it still has `uid`); grace 0 forces it."""
        what = f"delete pod {self.namespace}/{name}"
        body = client.V1DeleteOptions(
            grace_period_seconds=grace_s,
            preconditions=client.V1Preconditions(uid=uid) if uid else None)
        timeout = write_timeout(self.timeout, self.window, what)
        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=body,
                                            _preload_content=False,
                                            _request_timeout=timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e

    def delete_all(self, label_selector: str, field_selector: str = "") -> list[str]:
        """Delete every pod matching the selectors in one call (graceful); return their
        names, sorted."""
        what = f"delete pods {self.namespace} ({label_selector} {field_selector})".strip()
        try:
            resp = self.core.delete_collection_namespaced_pod(
                self.namespace, label_selector=label_selector,
                field_selector=field_selector or None, _preload_content=False,
                _request_timeout=self.timeout)
            body = json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise map_error(e, what) from e
        return sorted(item["metadata"]["name"] for item in body.get("items") or ())

    def set_owners(self, name: str, uid: str, owners: list[Mapping[str, Any]]) -> None:
        """Replace the ownerReferences of pod `name`, if it is still the pod with `uid`."""
        what = f"patch pod {self.namespace}/{name} ownerReferences"
        patch = [{"op": "test", "path": "/metadata/uid", "value": uid},
                 {"op": "add", "path": "/metadata/ownerReferences", "value": list(owners)}]
        try:
            self.core.patch_namespaced_pod(name, self.namespace, patch, _preload_content=False,
                                           _request_timeout=self.timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e


class Budgets:
    """Keeps the workers' PodDisruptionBudget (policy/v1); raises KubeError."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 request_timeout_s: float = 30.0,
                 window: Callable[[], float] | None = None) -> None:
        self.policy = client.PolicyV1Api(api)
        self.namespace, self.timeout = namespace, request_timeout(request_timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)

    def keep(self, body: Mapping[str, Any]) -> None:
        """Create the budget `body`, or set the minAvailable of the one of its name."""
        name = body["metadata"]["name"]
        what = f"keep poddisruptionbudget {self.namespace}/{name}"
        try:
            self.policy.create_namespaced_pod_disruption_budget(
                self.namespace, body, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
            return
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            err = map_error(e, f"create poddisruptionbudget {self.namespace}/{name}")
        if not isinstance(err, AlreadyExists):
            raise err
        patch = {"spec": {"minAvailable": body["spec"]["minAvailable"]}}
        try:
            self.policy.patch_namespaced_pod_disruption_budget(
                name, self.namespace, patch, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"patch poddisruptionbudget {self.namespace}/{name}") from e


class Secrets(_CoreWriter):
    """Creates the Secret holding a worker's own ssh host key (supervisor/hostkeys.py): create
    only, never read (the pod owns it, and it goes with the pod); raises KubeError."""

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        what = f"create secret {self.namespace}/{body['metadata']['name']}"
        try:
            resp = self.core.create_namespaced_secret(
                self.namespace, body, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
            return {"metadata": json.loads(resp.data)["metadata"]}  # never the key
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e


# ---- the leader Lease ---------------------------------------------------------------------------

class Leases:
    """Reads and writes coordination.k8s.io/v1 Leases in `namespace` (dicts); raises KubeError.
    `replace` carries the resourceVersion of the body (optimistic concurrency: Conflict)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout_s: float = 30.0) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.timeout_s = namespace, timeout_s

    def get(self, name: str, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Return the Lease, or None if there is none."""
        try:
            resp = self.coordination.read_namespaced_lease(
                name, self.namespace, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except ApiException as e:
            if e.status == 404:
                return None
            raise map_error(e, f"get lease {self.namespace}/{name}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"get lease {self.namespace}/{name}") from e

    def create(self, body: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            resp = self.coordination.create_namespaced_lease(
                self.namespace, body, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"create lease {self.namespace}/{name}") from e

    def replace(self, body: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            resp = self.coordination.replace_namespaced_lease(
                name, self.namespace, body, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"update lease {self.namespace}/{name}") from e
