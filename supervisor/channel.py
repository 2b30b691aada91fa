"""ADAPTER: the supervisor's end of the hook channel (UDP): heartbeats in, the dead set out.

One socket on SUPERVISOR_FENCE_PORT (UDP; 0: any free port) and one receiver thread. Every
datagram is authenticated with the key of this supervisor process (elastic_supervisor_hook.wire:
HMAC-SHA256, sequence numbers against replays) or dropped and counted; nothing an unauthenticated
sender does changes anything, and the socket holds no connection. Heartbeats of the current run
of horovodrun are recorded per process in a store the loop reads on its tick
(`snapshot`, like NodeLeases: a thousand workers send 2000 datagrams a second, which must not
go through the loop's queue). A process of an earlier run is told to exit.

`fence(hosts)` declares hosts dead for the rest of the run: it writes their host strings to the
dead file next to the discovery file (atomically; horovodrun's driver reads it before notifying
a coordinator) and pushes the dead set to every process that heartbeats; a heartbeat that shows
an older fence version gets it again in reply, so a lost push costs one heartbeat period. For
each dead host the set lists the addresses its processes reported (with their ports where the
address is a loopback one, shared by every process of the machine) and the host string itself
when it is an IP address.

A datagram is taken when it is authentic, parses (wire.parse), comes from the address of what it
speaks for (`bound`), has every field as the hook sends it (supervisor.datagrams) and is newer
than its sender's last, in that order: one from another address neither is said nor burns its
sender's sequence numbers. A bad one is counted (`invalid`), dropped, and said once per type and
field (`hook.datagram_invalid`). The receiver thread never ends on a datagram; if it ends
anyway, the loop's `revive` says so (`hook.receiver_restarted`) and starts it again.

What a supervisor process of a sidecar pod hands the next one (`adopt`): the state file next to
the dead file (`<dead file>.channel`), written at each new run, each fence, and each time the
sequence numbers reserved in it run out (a block of SEQ_BLOCK at a time): the run id, the
sequence numbers the process may have used, the fence version and the dead set. The workers
take commands only from a sequence above the last they took and a fence version above theirs,
so the next process goes on from there; they never take a "new supervisor" on its word.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from supervisor import datagrams, discovery
from supervisor.decide.beats import Beat, Driver
from supervisor.heartbeats import bound, driver_after, is_loopback, updated, watched
from supervisor.hook import HOOK_DIR
from supervisor.hook.elastic_supervisor_hook import (
    DEAD_ENV,
    KEY_ENV,
    KEY_FILE_ENV,
    PORT_ENV,
    RUN_ENV,
    WORKER_ENV,
    wire,
)
from supervisor.hook.elastic_supervisor_hook.wire import brief

FENCE_KEEP_S = 600.0  # a dead host stays in the pushed set this long (its peers reset by then)
FENCE_MAX = 256  # and at most this many, the most recent
FORGET_S = 600.0  # a process silent this long (or gone with a bye) is dropped from the store
SEQ_BLOCK = 1 << 20  # sequence numbers reserved in the state file at a time (one write each)


@dataclass(frozen=True)
class Snapshot:
    run: int
    started_at: float  # when this run's store was opened (monotonic)
    beats: Mapping[str, Beat]
    driver: Driver | None
    fence_version: int


@dataclass
class Counters:
    received: int = 0
    rejected: int = 0  # not authentic, replayed, the supervisor's own
    invalid: int = 0  # authentic, but a field that is not what the hook sends (datagrams.py)
    failed: int = 0  # raised while being recorded (a defect of ours: said once, dropped)
    stale_runs: int = 0  # datagrams of an earlier run of horovodrun
    unbound: int = 0  # authentic, but from an address that is not the host it speaks for
    pushed: int = 0
    replies: int = 0


def dead_entries(host: str, beats: Iterable[Beat]) -> list[list[Any]]:
    """PURE: the fence entries of one dead host: [address, ports or None (every port)]."""
    exclusive: set[str] = set()
    shared: dict[str, set[int]] = {}
    for b in beats:
        if b.host != host:
            continue
        for a in b.addrs:
            if is_loopback(a):
                shared.setdefault(a, set()).update(b.ports)
            else:
                exclusive.add(a)
    try:
        ipaddress.ip_address(host)
        if not is_loopback(host):
            exclusive.add(host)
    except ValueError:
        pass  # a DNS name: its processes' addresses only
    return ([[a, None] for a in sorted(exclusive)]
            + [[a, sorted(p)] for a, p in sorted(shared.items())])


def state_file(dead_file: Path) -> Path:
    """Where a supervisor process leaves the run's channel state for the next one."""
    return dead_file.with_name(dead_file.name + ".channel")


@dataclass(frozen=True)
class Carried:
    """What the state file hands the next supervisor process: every sequence number the last
    one may have used is at most `seq`; its fence version, dead hosts (-> when, on the
    supervisor's clock) and their fence entries."""

    seq: int
    version: int
    fenced: Mapping[str, float]
    entries: Mapping[str, list[list[Any]]]


def _entry(e: Any) -> bool:
    return (isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
            and (e[1] is None or (isinstance(e[1], list)
                                  and all(map(datagrams.port, e[1])))))


def carried(text: str, run_id: str, now: float) -> Carried:
    """PURE: the state file `text` of run `run_id`; raise ValueError saying what is wrong.
    Times later than `now` (another clock) are taken as `now`."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    got = doc.get("run") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or got != run_id:
        raise ValueError(f"written for run {brief(got)}, not {run_id}")
    seq, version, fenced, entries = (doc.get(k) for k in ("seq", "version", "fenced", "entries"))
    if not (datagrams.COUNT.accepts(seq) and datagrams.COUNT.accepts(version)):
        raise ValueError(f"seq={brief(seq)}, version={brief(version)}: expected integers "
                         "0..2^63-1")
    if not (isinstance(fenced, dict) and isinstance(entries, dict)
            and all(isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
                    and isinstance(entries.get(h), list) and all(map(_entry, entries[h]))
                    for h, t in fenced.items())):
        raise ValueError("fenced, entries: expected host -> time and host -> [[address, "
                         "ports or null], ...] for the same hosts")
    return Carried(seq, version, {h: min(float(t), now) for h, t in fenced.items()},
                   {h: entries[h] for h in fenced})


@dataclass
class _Run:
    number: int
    started_at: float
    beats: dict[str, Beat] = field(default_factory=dict)
    fenced: dict[str, float] = field(default_factory=dict)  # host -> when
    entries: dict[str, list[list[Any]]] = field(default_factory=dict)  # host -> entries
    version: int = 0
    driver: Driver | None = None
    sweep_at: float = 0.0  # next time forgotten processes are dropped


class HookChannel:
    """The UDP endpoint, the store of heartbeats and the dead set (one per supervisor)."""

    def __init__(self, port: int = 0, *, dead_file: Path, worker_hook: bool = True,
                 clock: Callable[[], float] = time.monotonic, bind: str = "",
                 key_file: tuple[Path, bytes] | None = None, hook_dir: Path = HOOK_DIR,
                 log: Any = None) -> None:
        # Where the processes horovodrun starts find the hook (sidecar mode: the shared dir).
        self.hook_dir = hook_dir
        # The key: the job's (a file every process reads, never in an environment), else one
        # of this process's own, handed over in horovodrun's environment.
        self.key_file, self.key = key_file[0] if key_file else None, (
            key_file[1] if key_file else wire.new_key())
        # Runs are named <epoch>.<n>: a datagram recorded under an earlier supervisor process
        # with the same key is of no run of this one.
        self.epoch = os.urandom(4).hex()
        self.dead_file, self.worker_hook, self.clock = dead_file, worker_hook, clock
        self.state_file = state_file(dead_file)
        self.log = log if log is not None else structlog.get_logger()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((bind, port))
        self.port = int(self.sock.getsockname()[1])
        self.counters = Counters()
        self._replays = wire.Replays()
        # host string -> its pod's IP, from the loop's view (`bind_hosts`): a process speaks
        # only for the host whose address it sends from.
        self._addresses: Mapping[str, str] = {}
        self.last_unbound: tuple[str, str] | None = None  # (source, what it spoke for)
        self._lock = threading.Lock()
        self._run = _Run(0, clock())
        self._seq = 0
        self._reserved = 0  # the sequence numbers up to this one are in the state file
        # what was said of bad datagrams: (type, field), ("raised", the exception's class)
        self._said: set[tuple[str, str]] = set()
        self._ended: str | None = None  # why the receiver thread ended, if it did
        self._stop = threading.Event()
        self._thread = self._receiver()

    def _receiver(self) -> threading.Thread:
        return threading.Thread(target=self._serve, name="hook-channel", daemon=True)

    def start(self) -> HookChannel:
        self._thread.start()
        return self

    def revive(self) -> bool:
        """Start the receiver thread again if it ended while the channel is open (the loop
        calls this on every pass); say so. Return whether it did."""
        if self._stop.is_set() or self._thread.ident is None or self._thread.is_alive():
            return False
        self.log.error("hook.receiver_restarted", reason=self._ended or "unknown",
                       port=self.port)
        self._ended = None
        self._thread = self._receiver()
        self._thread.start()
        return True

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET,
                                                         socket.SOCK_DGRAM) as s:
            s.sendto(b"", ("127.0.0.1", self.port))  # wakes the receiver
        self._thread.join(5)
        self.sock.close()

    # -- runs of horovodrun ----------------------------------------------------------------------

    def new_run(self, base_pythonpath: str | None) -> dict[str, str]:
        """Open the store of the next run of horovodrun (the previous run's processes are told
        to exit when they speak) and return the environment that puts the hook in it."""
        with self._lock:
            self._run = _Run(self._run.number + 1, self.clock())
            self._save()
        discovery.write_atomic(self.dead_file, "[]")
        key = ({KEY_FILE_ENV: str(self.key_file)} if self.key_file is not None
               else {KEY_ENV: self.key.hex()})
        return {
            "PYTHONPATH": ":".join(p for p in (str(self.hook_dir), base_pythonpath) if p),
            **key, PORT_ENV: str(self.port), RUN_ENV: self.run_id(self._run.number),
            WORKER_ENV: "1" if self.worker_hook else "0", DEAD_ENV: str(self.dead_file),
        }

    def adopt(self, run_id: str, key_hex: str | None) -> None:
        """Take over the current run of horovodrun from an earlier supervisor process (sidecar
        mode: it runs on): its run id (epoch.number) and, without a key file, its key; from the
        state file, its sequence, fence version and dead set. Raise ValueError when the id and
        key are not what new_run hands out. A state file that cannot be read is said
        (`hook.channel_state_lost`): the sequence and the version then start from the wall
        clock (microseconds, seconds), above what a process of the run took, and the hosts
        declared dead before are forgotten."""
        epoch, _, number = run_id.partition(".")
        if len(epoch) != 8 or not number.isdigit():
            raise ValueError(f"run id {run_id!r}: expected <8 hex digits>.<run number>")
        bytes.fromhex(epoch)
        key = None if self.key_file is not None or key_hex is None else bytes.fromhex(key_hex)
        now = self.clock()
        try:
            state = carried(self.state_file.read_text(), run_id, now)
            self.log.info("hook.channel_adopted", run=run_id, fence_version=state.version,
                          dead=sorted(state.fenced))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            self.log.warning("hook.channel_state_lost", file=str(self.state_file),
                             reason=str(e), run=run_id)
            wall = time.time()
            state = Carried(int(wall * 1e6), int(wall), {}, {})
        with self._lock:
            self.epoch = epoch
            self._run = _Run(int(number), now, fenced=dict(state.fenced),
                             entries=dict(state.entries), version=state.version)
            self._seq = self._reserved = state.seq
            if key is not None:
                self.key = key

    def run_id(self, number: int) -> str:
        """What the processes of run `number` carry in their datagrams."""
        return f"{self.epoch}.{number}"

    def exit_run(self, why: str) -> int:
        """Ask every process of the current run to exit (the run is being restarted)."""
        with self._lock:
            run, targets = self._run.number, {b.source for b in self._run.beats.values()}
        for addr in targets:
            for _ in range(2):
                self._send({"t": "exit", "run": self.run_id(run), "why": why}, addr)
        return len(targets)

    # -- the loop's side -------------------------------------------------------------------------

    def driver(self) -> Driver | None:
        """What the driver hook said last in the current run (cheaper than a snapshot)."""
        with self._lock:
            return self._run.driver

    def snapshot(self) -> Snapshot:
        with self._lock:
            r = self._run
            return Snapshot(r.number, r.started_at, dict(r.beats), r.driver, r.version)

    def next_silence(self, silence_s: float) -> float | None:
        """The earliest time a process that is heartbeating now would have been silent for
        `silence_s` (None: no such process): when the loop should look again."""
        with self._lock:
            seen = [b.last_seen for b in self._run.beats.values() if b.bye_at is None]
        now = self.clock()
        future = [t + silence_s for t in seen if t + silence_s > now]
        return min(future) if future else None

    def fence(self, hosts: Iterable[str]) -> int:
        """Declare `hosts` dead: dead file first (the driver), then a push to every process.
        Returns how many processes the push went to."""
        now = self.clock()
        with self._lock:
            r = self._run
            new = [h for h in hosts if h not in r.fenced]
            if not new:
                return 0
            for h in new:
                r.fenced[h] = now
                r.entries[h] = dead_entries(h, r.beats.values())
            r.version += 1
            all_dead = sorted(r.fenced)
            body = self._fence_body(r, now)
            targets = {b.source for b in r.beats.values()
                       if b.host not in r.fenced and b.bye_at is None}
            self._save()  # before anybody takes the new version: the next process goes on
        discovery.write_atomic(self.dead_file, json.dumps(all_dead))
        for addr in targets:
            self._send(dict(body), addr)
        self.counters.pushed += len(targets)
        return len(targets)

    def fenced(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._run.fenced)

    # -- the receiver thread ---------------------------------------------------------------------

    def _fence_body(self, r: _Run, now: float) -> dict[str, Any]:
        recent = sorted((t, h) for h, t in r.fenced.items() if now - t < FENCE_KEEP_S)
        dead = [e for _, h in recent[-FENCE_MAX:] for e in r.entries[h]]
        return {"t": "fence", "v": r.version, "dead": dead}

    def _save(self) -> None:
        """Write the state file (under the lock: the last write holds the latest state)."""
        r = self._run
        if r.number == 0:
            return  # no run yet: what is there may be the state of the run about to be adopted
        text = json.dumps({"run": self.run_id(r.number), "seq": self._reserved,
                           "version": r.version, "fenced": r.fenced, "entries": r.entries})
        try:
            discovery.write_atomic(self.state_file, text)
        except OSError as e:
            self.log.warning("hook.channel_state_unsaved", file=str(self.state_file),
                             reason=str(e))

    def _send(self, body: dict[str, Any], addr: tuple[str, int]) -> None:
        with self._lock:
            self._seq += 1
            seq = self._seq
            if seq > self._reserved:
                self._reserved = seq + SEQ_BLOCK
                self._save()
        # A process gone or unreachable: its silence speaks for it.
        with contextlib.suppress(OSError):
            self.sock.sendto(wire.encode(self.key, {**body, "s": wire.SUPERVISOR, "n": seq}),
                             addr)

    def _serve(self) -> None:
        try:
            self._receive()
        except BaseException as e:  # whatever ends it: the loop's revive says so, restarts it
            self._ended = repr(e)

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except OSError:
                if self._stop.is_set():
                    return
                continue
            try:
                self.handle(data, addr)
            except Exception as e:  # a defect of ours: this datagram is lost, not the thread
                self.counters.failed += 1
                if ("raised", type(e).__name__) not in self._said:
                    self._said.add(("raised", type(e).__name__))
                    self.log.error("hook.datagram_failed", source=addr[0],
                                   reason=brief(e, 200), exc_info=True)

    def bind_hosts(self, addresses: Mapping[str, str]) -> None:
        """The workers' host strings and their pods' IPs, as the loop sees them now."""
        self._addresses = dict(addresses)

    def _invalid(self, source: str, found: datagrams.Defect) -> None:
        """Count a bad datagram; say it once per type and field."""
        self.counters.invalid += 1
        if (found.kind, found.field) not in self._said:
            self._said.add((found.kind, found.field))
            self.log.warning("hook.datagram_invalid", source=source, type=found.kind or None,
                             field=found.field, reason=found.line)

    def handle(self, data: bytes, addr: tuple[str, int]) -> None:
        """Record one datagram (the receiver thread; tests call it directly)."""
        self.counters.received += 1
        payload = wire.authentic(self.key, data)
        if payload is None:
            self.counters.rejected += 1
            return
        try:
            body = wire.parse(payload)
        except wire.Malformed as e:
            self._invalid(addr[0], datagrams.Defect("", e.field, str(e)))
            return
        if body["s"] == wire.SUPERVISOR:
            self.counters.rejected += 1
            return
        now, reply, found = self.clock(), None, None
        # Who may say it first (a datagram from another address neither is said nor burns its
        # sender's sequence numbers), then what it says, then whether it is new.
        with self._lock:
            r = self._run
            if not bound(body, addr[0], r.beats, self._addresses):
                self.counters.unbound += 1
                host = body.get("host")
                self.last_unbound = (addr[0], host[:datagrams.HOST_CHARS]
                                     if isinstance(host, str) and host else body["t"])
            elif (found := datagrams.defect(body)) is not None:
                pass  # said below, out of the lock
            elif not self._replays.accept(body["s"], body["n"]):
                self.counters.rejected += 1
            elif str(body.get("run")) != self.run_id(r.number):
                self.counters.stale_runs += 1
                if body["t"] == "hb":
                    reply = {"t": "exit", "run": str(body.get("run")),
                             "why": "this run of horovodrun was restarted"}
            elif body["t"] == "driver":
                r.driver = driver_after(r.driver, body, now)
            elif body["t"] == "ps":
                of = r.beats.get(str(body.get("of")))
                if of is not None:
                    r.beats[of.sender] = watched(of, body, now)
            else:
                beat = updated(r.beats.get(body["s"]), body, addr, now)
                if beat is not None:
                    r.beats[body["s"]] = beat
                    if body["t"] == "hb" and body.get("fv") != r.version and r.version:
                        reply = self._fence_body(r, now)
                    self._forget(r, now)
        if found is not None:
            self._invalid(addr[0], found)
        if reply is not None:
            self.counters.replies += 1
            self._send(reply, addr)

    def _forget(self, r: _Run, now: float) -> None:
        if now < r.sweep_at:
            return
        r.sweep_at = now + 10.0
        for s, b in list(r.beats.items()):
            if now - b.last_seen > FORGET_S or (b.bye_at is not None
                                                 and now - b.bye_at > FORGET_S):
                del r.beats[s]


def unbound_note(channel: HookChannel | None) -> str:
    """What to add to a "no heartbeat" warning when authentic datagrams were refused for
    their source address."""
    if channel is None or channel.last_unbound is None:
        return ""
    source, host = channel.last_unbound
    return (f"; {channel.counters.unbound} authentic datagram(s) were refused because they did "
            f"not come from their host's pod IP (the last from {source} for {host}): is pod "
            "traffic translated (SNAT) between the workers and the launcher?")
