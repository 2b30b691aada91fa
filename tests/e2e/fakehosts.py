"""Real horovodrun on fake hosts (sshds on loopback addresses), without Kubernetes.

For the tests of the hook against Horovod itself: `HostSet` starts sshds on addresses
127.<block>.0.<n>, `HorovodRun` runs horovodrun (elastic, discovery from a file the test writes)
with the stock training script on them, optionally with the hook in its environment, and
collects its output; `Channel` plays the supervisor's end of the hook channel (collects
datagrams, sends fence pushes).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from localcluster.job import horovod_records
from localcluster.sshd import FakeHost, KeyPair
from supervisor.hook import HOOK_DIR
from supervisor.hook.elastic_supervisor_hook import wire
from tests.e2e.jobs import STOCK, STOCK_KERAS, STOCK_TF, TOUR_SLEEP, steps_of
from tests.helpers import wait_for

T = TypeVar("T")
STOCK_SCRIPTS = (STOCK.name, STOCK_TF.name, STOCK_KERAS.name)
# The TensorFlow environment `make setup` builds (scripts/build-tf-env.sh) the TF scripts run in.
TF_PYTHON = Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor")
                 ) / "tf-venv" / "bin" / "python"


class HostSet:
    """sshds on 127.<block>.0.1.. (one port for all), started on demand, stopped at close."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.key = KeyPair.generate(workdir / "keys")
        self.block = random.randint(16, 250)
        with socket.socket() as s:
            s.bind((f"127.{self.block}.0.1", 0))
            self.port = s.getsockname()[1]
        self.hosts: dict[str, FakeHost] = {}

    def start(self, n: int, host_key: Path | None = None) -> list[str]:
        """Start `n` more hosts (with `host_key` as their sshd host key, else one of their
        own each); return their addresses."""
        made = []
        for _ in range(n):
            address = f"127.{self.block}.0.{len(self.hosts) + 1}"
            workdir = self.workdir / f"host-{address}"
            if host_key is not None:
                workdir.mkdir(parents=True)
                shutil.copy(host_key, workdir / "ssh_host_ed25519_key")
            self.hosts[address] = FakeHost(address, self.port, self.key, workdir).start()
            made.append(address)
        return made

    def training(self, address: str) -> list[psutil.Process]:
        """The training processes running on a host (its sshd's sessions)."""
        host = self.hosts[address]
        assert host.proc is not None
        out = []
        for p in psutil.Process(host.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                line = " ".join(p.cmdline())
                if any(n in line for n in STOCK_SCRIPTS) and p.name().startswith("python"):
                    out.append(p)
        return out

    def close(self) -> None:
        for h in self.hosts.values():
            if h.proc is not None:  # sessions are in sessions of their own: kill them first
                with contextlib.suppress(psutil.NoSuchProcess):
                    for p in psutil.Process(h.proc.pid).children(recursive=True):
                        with contextlib.suppress(psutil.NoSuchProcess):
                            p.kill()
            h.stop()
        # A training process whose ssh session was killed (a fenced, stuck or frozen rank) is
        # no sshd's child any more: found by this test's directory on its command line. One
        # left behind (a TensorFlow rank deadlocked on purpose) ran through the whole
        # real-node phase of make test (2026-12-02), 0.5 GB and a share of the two cores.
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                line = " ".join(p.info["cmdline"] or ())
                if f"{self.workdir}/" in line and any(n in line for n in STOCK_SCRIPTS):
                    p.kill()


class Channel:
    """The supervisor's end of the hook channel: a UDP socket collecting what the hook says."""

    def __init__(self) -> None:
        self.key = wire.new_key()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[tuple[float, tuple[str, int], dict[str, Any]]] = []
        self.seq = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                data, addr = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                return
            body = wire.decode(self.key, data)
            if body is not None:
                self.received.append((time.monotonic(), addr, body))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [b for _, _, b in list(self.received) if b["t"] == kind]

    def push(self, body: dict[str, Any]) -> int:
        """Send `body` (as the supervisor) to every process that sent a heartbeat."""
        targets = {addr for _, addr, b in list(self.received) if b["t"] == "hb"}
        for addr in targets:
            self.seq += 1
            self.sock.sendto(wire.encode(self.key, {**body, "s": wire.SUPERVISOR,
                                                    "n": self.seq}), addr)
        return len(targets)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


class HorovodRun:
    """One horovodrun (elastic) of the stock script on `hosts`; its output is collected."""

    def __init__(self, workdir: Path, hosts: HostSet, *, np: int, min_np: int, max_np: int,
                 batches: int, channel: Channel | None, worker_hook: bool = True,
                 gloo_timeout_s: int = 60, script_args: Sequence[str] = (),
                 python: Path = Path(sys.executable), script: Path = STOCK) -> None:
        self.workdir, self.hosts = workdir, hosts
        self.hostfile = workdir / "hostfile"
        self.dead_file = workdir / "dead.json"
        self.stop_file = workdir / "stop"  # the stock script's --stop-file: see stop_at
        discover = workdir / "discover_hosts.sh"
        discover.write_text(f"#!/bin/sh\nexec cat {self.hostfile}\n")
        discover.chmod(0o755)
        self.argv = [
            str(python.parent / "horovodrun"), "-np", str(np), "--min-np", str(min_np),
            "--max-np", str(max_np), "--slots-per-host", "1",
            "--host-discovery-script", str(discover), "--ssh-port", str(hosts.port),
            "--ssh-identity-file", str(hosts.key.private), "--network-interface", "lo",
            "--gloo-timeout-seconds", str(gloo_timeout_s), "--start-timeout", "60",
            "--elastic-timeout", "120",
            str(python), str(script), "--batches", str(batches),
            "--stop-file", str(self.stop_file), *script_args]
        # horovodrun passes its environment on: the training processes' temporary files
        # (TensorFlow's autograph writes one per converted function and a killed process leaves
        # them) go under the test's directory, not the machine's /tmp.
        (self.workdir / "tmp").mkdir(exist_ok=True)
        self.env = {**os.environ, "TMPDIR": str(self.workdir / "tmp")}
        if channel is not None:
            self.env.update({
                "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK_DIR),
                                                            os.environ.get("PYTHONPATH")])),
                "ELASTIC_SUPERVISOR_HOOK_KEY": channel.key.hex(),
                "ELASTIC_SUPERVISOR_HOOK_PORT": str(channel.port),
                "ELASTIC_SUPERVISOR_HOOK_RUN": "1",  # as the supervisor names a run
                "ELASTIC_SUPERVISOR_HOOK_DEAD_FILE": str(self.dead_file),
                "ELASTIC_SUPERVISOR_HOOK_WORKER": "1" if worker_hook else "0"})
        self.lines: list[tuple[float, str]] = []
        self.proc: subprocess.Popen[str] | None = None

    def set_hosts(self, addresses: Sequence[str]) -> None:
        tmp = self.hostfile.with_suffix(".tmp")
        tmp.write_text("".join(f"{a}:1\n" for a in addresses))
        tmp.rename(self.hostfile)

    def stop_at(self, ahead: int = 20) -> int:
        """End training `ahead` batches past rank 0's last reported one; return that batch."""
        steps = [r for r in self.records() if "loss" in r]
        assert steps, "rank 0 reported no batch yet"
        target = int(steps[-1]["step"]) + ahead
        tmp = self.stop_file.with_suffix(".tmp")
        tmp.write_text(str(target))
        tmp.rename(self.stop_file)
        return target

    def declare_dead(self, addresses: Sequence[str]) -> None:
        tmp = self.dead_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(addresses)))
        tmp.rename(self.dead_file)

    def start(self) -> HorovodRun:
        self.proc = subprocess.Popen(self.argv, cwd=self.workdir, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def output(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def records(self) -> list[dict[str, Any]]:
        return horovod_records(self.output())

    def steps(self) -> list[dict[str, Any]]:
        return steps_of(self.records())

    def last_step(self) -> dict[str, Any] | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in list(self.lines)[-n:])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def horovod_on_fake_hosts(workdir: Path) -> Iterator[tuple[HostSet, list[HorovodRun]]]:
    """Hosts and the runs a test makes on them; everything is stopped at the end."""
    hosts = HostSet(workdir)
    runs: list[HorovodRun] = []
    try:
        yield hosts, runs
    finally:
        for r in runs:
            r.close()
        hosts.close()


def tour_on_fake_hosts(tmp_path_factory: Any, name: str,
                       start: Callable[[Path, HostSet, list[HorovodRun], Channel,
                                        contextlib.ExitStack], T]) -> Iterator[T]:
    """The body of a class-scoped fixture for a tour (several faults, one horovodrun): hosts,
    a channel and an exit stack that outlive the class's tests; `start` makes the tour."""
    tmp_path = tmp_path_factory.mktemp(name)
    with horovod_on_fake_hosts(tmp_path) as (hosts, runs), contextlib.ExitStack() as stack:
        channel = Channel()
        stack.callback(channel.close)
        yield start(tmp_path, hosts, runs, channel, stack)


def training_at_size_3(workdir: Path, hosts: HostSet, runs: list[HorovodRun],
                       listed: Sequence[str], *, batches: int, timeout: float = 180,
                       env: dict[str, str] | None = None, **kw: Any) -> HorovodRun:
    """A horovodrun of the stock script (np 3, min-np 2, max-np 3, TOUR_SLEEP s batches) on
    `listed`, returned once it trains at size 3 past batch 10; `kw` goes to HorovodRun."""
    run = HorovodRun(workdir, hosts, np=3, min_np=2, max_np=3, batches=batches,
                     script_args=["--sleep", TOUR_SLEEP], **kw)
    run.env.update(env or {})
    runs.append(run)
    run.set_hosts(listed)
    run.start()
    wait_for(lambda: (s := run.last_step()) and s["size"] == 3 and s["step"] > 10, timeout,
             what=f"training at size 3:\n{run.tail()}")
    return run
