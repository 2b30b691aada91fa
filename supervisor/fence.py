"""Fencing: the survivors give up on a worker the supervisor declared dead, at once.

Horovod 0.28.1 cannot abort a collective. A worker that freezes, or whose node is partitioned,
keeps its TCP connections open, so the survivors wait inside Gloo until the Gloo timeout
(60-300 s in practice; a short one aborts survivors when a replacement joins slowly). Killing
horovodrun's ssh client for the dead host (proc.kill_ssh_clients) makes the driver record the
failure, but not the survivors leave their collective. Two halves close that gap:

- launcher side, `FenceServer`: a small HTTP endpoint, `GET /fenced` ->
  `{"hosts": [...]}`, the host strings the supervisor declared dead. horovodrun forwards the
  launcher's environment to every worker, so the workers learn its port from
  `ELASTIC_SUPERVISOR_FENCE_PORT` and its address from `HOROVOD_GLOO_RENDEZVOUS_ADDR`.
- worker side, `WorkerFence`, installed by the training script: a daemon thread that, once a
  training step has been stalled for `stall_s`, asks the launcher which hosts are fenced; if a
  host of the current ring is, it shuts down this process's established TCP connections
  (except to Horovod's rendezvous server). Gloo then fails at once, Horovod raises
  HorovodInternalError, and the elastic loop rolls back to the last commit and resets without
  the dead host. Nothing happens while steps complete, nor for a stall no fenced host explains.

Only the standard library and psutil (for this process's own sockets, never a child's: those are
proc.py's) here: the worker half runs inside training processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

PORT_ENV = "ELASTIC_SUPERVISOR_FENCE_PORT"
PATH = "/fenced"
Endpoint = tuple[str, int]


# ---- launcher side ---------------------------------------------------------------------------

class FenceServer:
    """Serves the fenced hosts over HTTP on `port` (0: any free port) until closed."""

    def __init__(self, port: int = 0, bind: str = "") -> None:
        self._hosts: dict[str, float] = {}
        self._lock = threading.Lock()
        fence = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != PATH:
                    self.send_error(404, f"only {PATH} is served here")
                    return
                body = json.dumps({"hosts": fence.hosts()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:  # polled while stalled: keep quiet
                pass

        self._server = ThreadingHTTPServer((bind, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fence-server",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def add(self, host: str) -> None:
        """Declare `host` dead for the rest of the job (Horovod never sees a host twice)."""
        with self._lock:
            self._hosts.setdefault(host, time.time())

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._hosts)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# ---- worker side -----------------------------------------------------------------------------

def should_sever(stalled_s: float | None, stall_s: float, ring: frozenset[str],
                 fenced: Iterable[str]) -> list[str]:
    """PURE: the fenced hosts of the current ring if the step has been stalled long enough."""
    if stalled_s is None or stalled_s < stall_s:
        return []
    return sorted(ring.intersection(fenced))


def sever_connections(keep: Iterable[Endpoint], pid: int | None = None) -> int:
    """Shut down (both ways) the established TCP connections of this process, except those to
    the endpoints in `keep`; return how many. The shutdown reaches the very socket the
    collective library blocks on (a dup of its descriptor shares it); nothing is closed."""
    kept = set(keep)
    n = 0
    for c in psutil.Process(pid).net_connections(kind="tcp"):
        if c.status != psutil.CONN_ESTABLISHED or not c.raddr or c.fd < 0:
            continue
        if (c.raddr.ip, c.raddr.port) in kept:
            continue
        with contextlib.suppress(OSError):
            s = socket.socket(fileno=os.dup(c.fd))
            try:
                s.shutdown(socket.SHUT_RDWR)
                n += 1
            finally:
                s.close()
    return n


def fetch_fenced(url: str, timeout_s: float = 2.0) -> list[str]:
    """The hosts the launcher's FenceServer declares dead."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return [str(h) for h in json.loads(r.read())["hosts"]]


@dataclass
class Stall:
    since: float | None = None  # monotonic start of the running step; None between steps
    severed: float | None = None  # the step whose stall was already severed


class WorkerFence:
    """The worker half: watches the training steps and severs a collective a dead host holds.

    Use: `fence = WorkerFence.from_env()` after `hvd.init()` (None when not run by
    elastic-supervisor), `fence.ring(hosts)` after every (re)initialisation with the ring's
    host strings (e.g. `hvd.allgather_object(os.environ["HOROVOD_HOSTNAME"])`), and
    `with fence.step(): ...` around each training step.
    """

    def __init__(self, url: str, keep: Iterable[Endpoint], *, stall_s: float = 1.0,
                 poll_s: float = 0.5, fetch: Callable[[str], list[str]] = fetch_fenced,
                 sever: Callable[[Iterable[Endpoint]], int] = sever_connections,
                 clock: Callable[[], float] = time.monotonic,
                 report: Callable[[dict[str, object]], None] | None = None) -> None:
        self.url, self.keep, self.stall_s, self.poll_s = url, tuple(keep), stall_s, poll_s
        self._fetch, self._sever, self._clock = fetch, sever, clock
        self._report = report or (lambda rec: print(json.dumps(rec), file=sys.stderr,
                                                    flush=True))
        self._ring: frozenset[str] = frozenset()
        self._stall = Stall()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unreachable = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **kw: object) -> WorkerFence | None:
        """A started fence for a worker that elastic-supervisor's horovodrun launched, or
        None (no supervisor, or not under horovodrun)."""
        port, addr = env.get(PORT_ENV), env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        if not port or not addr:
            return None
        keep = [(addr, int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]))] if env.get(
            "HOROVOD_GLOO_RENDEZVOUS_PORT") else []
        keep.append((addr, int(port)))
        return cls(f"http://{addr}:{int(port)}{PATH}", keep, **kw).start()  # type: ignore[arg-type]

    def ring(self, hosts: Iterable[str]) -> None:
        """The host strings of the ring formed by the last (re)initialisation."""
        self._ring = frozenset(hosts)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._stall.since = self._clock()
        try:
            yield
        finally:
            self._stall.since = None

    def check(self) -> int | None:
        """One look: sever if a fenced ring host holds the running step; return how many
        connections were severed (None: nothing to do)."""
        since = self._stall.since
        if since is None or self._stall.severed == since:
            return None
        if self._clock() - since < self.stall_s:
            return None
        try:
            fenced = self._fetch(self.url)
        except (OSError, ValueError, KeyError) as e:
            if not self._unreachable:
                self._report({"event": "fence.unreachable", "url": self.url, "reason": str(e)})
                self._unreachable = True
            return None
        self._unreachable = False
        dead = should_sever(self._clock() - since, self.stall_s, self._ring, fenced)
        if not dead or self._stall.since != since:  # the step may have completed meanwhile
            return None
        self._stall.severed = since
        n = self._sever(self.keep)
        self._report({"event": "fence.severed", "hosts": dead, "connections": n,
                      "stalled_s": round(self._clock() - since, 2), "time": time.time()})
        return n

    def start(self) -> WorkerFence:
        self._thread = threading.Thread(target=self._run, name="elastic-fence", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
