"""ADAPTER: the `Reflector`: list + watch with paging, bookmarks, resume from the last
resourceVersion, relist-and-diff on 410 Gone, jittered exponential backoff, a client read
timeout. Reflector threads never block on their consumer: they hand every item to a
non-blocking `sink` (a queue put)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.rest import ApiException

from supervisor.kube.errors import Gone, KubeError, map_error
from supervisor.model import SourceState, WatchEvent
from supervisor.observe import KIND_NAMES, EventType, Kind

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


