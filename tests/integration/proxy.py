"""A loopback TCP proxy in front of the real kube-apiserver, for API faults a restart cannot make.

`TcpProxy(target_port)` listens on a port of its own once `forward()` is called. `refuse()`
closes the listening socket (new connections are refused: an API server that is down) and drops
the open ones. `stall()` turns every open connection, and every one accepted until the next
`forward()`, into a dead one: it stays open but never moves another byte in either direction (a
request that never gets its answer: a dropped NAT entry, a frozen server). `forward()` makes new
connections work again; dead ones stay dead, so only a client that gives up on them recovers.
TLS passes through untouched (the server certificate is for 127.0.0.1, where the proxy listens
too). `kubeconfig(...)` writes a copy of a kubeconfig whose server is the proxy.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
from pathlib import Path

from localcluster.controlplane import free_ports


class TcpProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target>, with refuse / stall / forward switches."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = free_ports(1)[0]
        self.accepted = 0
        self.dead = 0  # connections stalled for good
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._dead: set[socket.socket] = set()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kubeconfig(self, source: Path, path: Path) -> Path:
        """Write `source` (a JSON kubeconfig) with its server replaced by the proxy's."""
        cfg = json.loads(source.read_text())
        for cluster in cfg["clusters"]:
            cluster["cluster"]["server"] = self.server
        path.write_text(json.dumps(cfg))
        path.chmod(0o600)
        return path

    def forward(self) -> TcpProxy:
        self._stalled.clear()
        with self._lock:
            if self._listener is None:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", self.port))
                s.listen(64)
                self._listener = s
                threading.Thread(target=self._accept, args=(s,), name="proxy-accept",
                                 daemon=True).start()
        return self

    def stall(self) -> None:
        with self._lock:
            self._stalled.set()
            self._dead.update(a for a, _ in self._pairs)

    def refuse(self) -> None:
        """Stop listening and close every connection (connection refused from now on)."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
        if listener is not None:
            listener.close()
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._closed.set()
        self.refuse()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
                self.accepted += 1
                if self._stalled.is_set():
                    self._dead.add(client)
            threading.Thread(target=self._pump, args=(client, upstream), name="proxy-pump",
                             daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        try:
            while not self._closed.is_set():
                if a in self._dead:
                    self.dead += 1
                    self._closed.wait()  # never another byte; closed with the proxy
                    return
                readable, _, _ = select.select([a, b], [], [], 0.1)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
