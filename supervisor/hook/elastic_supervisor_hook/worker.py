"""The worker half, inside every training process: progress, heartbeats and the fence.

`Progress` wraps horovod.torch's blocking wait (`mpi_ops.synchronize`, which every collective
of horovod.torch ends in) and `mpi_ops.init`: it knows whether the process is inside a
collective (or an init) and since when, and counts the completed ones (progress).

`Beater`, a daemon thread started as the first `hvd.init()` begins (a process waiting in the
first rendezvous of a run is seen waiting there), sends a heartbeat to the supervisor every
BEAT_S over UDP (to HOROVOD_GLOO_RENDEZVOUS_ADDR, the launcher, on the channel's port): host,
pid, rank, size, inits, completed collectives (in all, and since the last init), the current
wait, a step's time outside collectives and inside them (the means of its last steps: a
straggler's own work is slow while its peers wait for it), the local endpoints of the process's
TCP connections, any problem of the hook, and what the main thread does: its position (file,
line and instruction offset of its innermost Python frame, sampled with sys._current_frames()),
its innermost frames when the position did not change since the last heartbeat, and the I/O
bytes of the process (storage) and of the main thread (reads and writes). The heartbeat thread
runs while the main thread waits in a C call, a GPU kernel, a lock or a read that never returns:
the supervisor sees it stand still while its peers wait for it in a collective (a stuck rank,
supervisor/decide/hang.py). The supervisor answers a heartbeat that shows an old fence version,
and pushes to every process when the set changes, the hosts it declared dead: for each, its
addresses, with the TCP ports its processes reported when the address is a loopback one (shared
by every process of the machine: loopback test hosts).

The fence: when a new dead set arrives, and again once the process has been inside a collective
for STALL_S while a dead host is known (once per stalled collective), it shuts down the
reading side of its established TCP connections to the dead hosts' endpoints (only those; never
the rendezvous server's; see `sever` for why not the writing side). The collective library
blocked on such a socket fails at once (or the next one does), Horovod raises
HorovodInternalError, and the elastic loop rolls back and resets without the dead host,
instead of waiting for the Gloo timeout. At once, not only when stalled: a host
the supervisor declared dead may still be alive and answering (its kubelet stopped, its node
NotReady, its ssh client killed): it must not stay in the ring behind Horovod's back.

An unfenced process (its framework is one the hook does not fence yet: the Beater gets
`fence=False`) still heartbeats and obeys "exit", and records the dead set's version (so the
supervisor does not resend it), but cuts nothing.

Standard library only, Python >= 3.8. The connections come from psutil (a Horovod dependency)
where it is installed, else from /proc (`TcpConnections`, said once on stderr).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import ipaddress
import os
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence, Tuple

from . import wire

BEAT_S = 0.5  # heartbeat period
# The local endpoints are read again after each init (Gloo's connections are made there) and at
# least this often: reading them costs a scan of the network namespace's TCP table.
ENDPOINTS_S = 10.0
STALL_S = 1.0  # inside one collective this long: a dead host's connections are cut
# Training time (Progress.stepped): a pause between two new steps longer than
# max(MIN_PAUSE_S, PAUSE_STEPS x the step time) is not training (supervisor/decide/progress.py).
MIN_PAUSE_S = 1.5
PAUSE_STEPS = 3.0
STEP_EWMA = 0.2
# Per-step timing (the stragglers: supervisor/decide/stragglers.py): the last STEP_WINDOW steps
# since the last init, their means without the slowest tenth in every heartbeat (a mean, not a
# median: a CPU quota lets a process run a few steps at full speed, then holds it for the rest of
# the CFS period, so most steps look fast and every few one is very slow; without the slowest
# tenth: one long pause, a checkpoint or a GC, is not a slow worker); the new world's first
# STEP_SKIP steps wait for its slowest member (the state's sync, a joiner still importing): not
# timed.
STEP_WINDOW = 31
STEP_SKIP = 3
MAX_PORTS = 2000
# The links to the world's other machines (the stragglers' second case: a slow link): at every
# heartbeat the kernel's smoothed round-trip time of each connection to another machine that
# sent data within the last LINK_ACTIVE_MS (an idle one keeps the time of its last transfer,
# which says nothing of the link now), the fastest per peer address; each heartbeat carries the
# mean of the last LINK_READINGS readings per peer (one reading is a moment: a narrowed link's
# round trip is long while a transfer queues and short between two, 0.1-13 ms on real nodes), at
# most MAX_LINKS peers (the fastest: a healthy process's fast links are what tells it apart from
# a slow one's), read on at most MAX_LINK_FDS connections (a full mesh of Gloo pairs).
LINK_READINGS = 8
LINK_ACTIVE_MS = 3000
MAX_LINKS = 8
MAX_LINK_FDS = 512
# struct tcp_info (linux/tcp.h, unchanged since 2.6): tcpi_last_data_sent and tcpi_rtt (u32,
# milliseconds and microseconds), and the length to ask for
TCPI_LAST_DATA_SENT, TCPI_RTT, TCPI_LEN = 44, 68, 104
TCP_INFO = getattr(socket, "TCP_INFO", 11)
Endpoint = Tuple[str, int]
# One fence entry: an address and the ports to match on it (None: every port).
DeadEntry = Tuple[str, Optional[Tuple[int, ...]]]


def saved_on_host_change(check: Callable[..., Any],
                         saved: Callable[[], None] = lambda: None) -> Callable[..., Any]:
    """Horovod's `State.check_host_updates`, saving the state before it raises
    HostsUpdatedInterrupt, and never letting that interrupt skip the sync after the reset.

    The save: every rank raises it at the same step (the update was broadcast), so what they
    hold then is consistent: a commit. Horovod then syncs the state from rank 0, and
    `ObjectState.sync` broadcasts the *saved* attributes (a step or batch counter) while the
    model and optimizer go as they are: without the save, a worker joining (or one leaving with
    another joining) sets the counters back to the last commit, up to a commit interval of
    steps counted and fed again, on a model that already learnt from them.

    The sync: Horovod's `run_fn` skips it when the updates a rank had seen were removals only
    (`skip_sync`). But the driver assigns the next world from the hosts it knows once the old
    world's barrier completes, which may be later: a worker added meanwhile (the replacement of
    one that leaves gracefully, listed before the leaver was let go) is in that world, and it
    always syncs. The survivors would train while it waits in the sync's broadcasts, a deadlock
    (seen on real nodes: an evicted Keras worker let go 4.7 s after its host was taken out, its
    replacement listed at 1.5 s). So every rank syncs after a host change: one broadcast of the
    state from rank 0, which on a removal only sends what every rank has already."""
    @functools.wraps(check)
    def check_host_updates(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check(state, *args, **kwargs)
        except Exception as e:
            if type(e).__name__ == "HostsUpdatedInterrupt":
                state.save()
                saved()
                if getattr(e, "skip_sync", False):
                    e.skip_sync = False  # type: ignore[attr-defined]
            raise

    return check_host_updates


def _plain(ip: str) -> str:
    return ip[7:] if ip.startswith("::ffff:") else ip


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(_plain(ip)).is_loopback
    except ValueError:
        return False


class Progress:
    """What the training thread(s) are doing, updated by the wrappers, read by the Beater."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.inflight: dict[object, tuple[float, str]] = {}  # token -> (start, "c" | "i")
        self.done = 0  # completed collectives and inits
        self.since_init = 0  # completed collectives since the last init (equal across a world)
        self.inits = 0
        self.rank: int | None = None
        self.size: int | None = None
        # Training progress, for the supervisor's goodput: optimizer steps (horovod.torch's
        # DistributedOptimizer.step), commits (saves of the state: State.commit saves), and
        # steps computed again: those since the last save, undone when a failed world rolls
        # the state back to it.
        self.steps = 0
        self.commits = 0
        self.redone = 0
        self.steps_saved = 0  # `steps` when the state was last saved
        # Training time, judged here where every step's time is known (the supervisor sees
        # heartbeats and its own passes): the pause from one new step (past every position
        # before: not one computed again) to the next is training when it is at most
        # max(MIN_PAUSE_S, PAUSE_STEPS x the step time); the sum of those, in seconds.
        self.trained_s = 0.0
        self.high = 0  # the highest position (steps - redone) reached
        self.new_at: float | None = None  # when it was reached (this process's clock)
        self.step_s: float | None = None  # the step time (EWMA of the training pauses)
        # Per-step timing: the seconds spent inside collectives so far (the union of the
        # collective waits: TensorFlow's executor runs several at once), how many are in
        # flight and since when, the clock and that sum at the last step, and each step's
        # (seconds outside collectives, seconds inside) since the last init. The collective
        # waits begin and end in TensorFlow's executor threads too: under a lock.
        self._timing = threading.Lock()
        self.coll_s = 0.0
        self.colls = 0
        self.coll_from = 0.0
        self.timed_from: tuple[float, float] | None = None
        self.skip = STEP_SKIP
        self.timed: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=STEP_WINDOW)

    def saved(self, commit: bool = False) -> None:
        """The state was saved (a commit, or the save before a host change)."""
        self.steps_saved = self.steps
        self.commits += commit

    def rolled_back(self) -> None:
        """A collective failed: Horovod's elastic loop restores the last saved state, so the
        steps since are done again (counted once, however often the failure is raised)."""
        self.redone += self.steps - self.steps_saved
        self.steps_saved = self.steps

    def waiting(self) -> tuple[float | None, str | None, float | None]:
        """(start of the oldest wait, its kind, start of the oldest collective wait)."""
        calls = list(self.inflight.values())
        if not calls:
            return None, None, None
        oldest = min(calls)
        collective = [t for t, kind in calls if kind == "c"]
        return oldest[0], oldest[1], (min(collective) if collective else None)

    def counted(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """An optimizer's `step`, counting each one that returns."""
        @functools.wraps(step)
        def counted_step(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            self.step()
            return result
        return counted_step

    def step(self) -> None:
        """A training step completed (an optimizer's step, or a step's reduced gradients)."""
        self.steps += 1
        now = self.clock()
        self.stepped(now)
        self.time_step(now)

    def time_step(self, now: float) -> None:
        """Time the step that ended at `now`: the seconds since the last step, split into those
        inside collectives (waiting for the peers, and the transfer) and those outside (this
        process's own work: compute, input)."""
        with self._timing:
            inside = self.coll_s + (now - self.coll_from if self.colls else 0.0)
            last, self.timed_from = self.timed_from, (now, inside)
            if last is None:
                return
            if self.skip:
                self.skip -= 1
                return
            gap, waited = max(0.0, now - last[0]), max(0.0, inside - last[1])
            self.timed.append((max(0.0, gap - waited), min(gap, waited)))

    def step_times(self) -> tuple[float, float, int] | None:
        """(mean seconds outside collectives per step, mean inside, steps timed) over the last
        STEP_WINDOW steps since the last init, each mean without its slowest tenth (a garbage
        collection, a checkpoint: a pause of one step); None before any."""
        with self._timing:
            timed = list(self.timed)
        if not timed:
            return None
        return _trimmed([o for o, _ in timed]), _trimmed([w for _, w in timed]), len(timed)

    def stepped(self, now: float) -> None:
        """A step returned at `now`: a new one adds the pause since the last new one to the
        training time when that pause is short enough (supervisor/decide/progress.py's rule)."""
        pos = self.steps - self.redone
        if pos <= self.high:
            return  # computed again after a rollback: no progress
        new = pos - self.high
        self.high = pos
        last, self.new_at = self.new_at, now
        if last is None:
            return
        gap = max(0.0, now - last)
        step_s = gap / new if self.step_s is None else self.step_s
        if gap <= max(MIN_PAUSE_S, PAUSE_STEPS * step_s):
            self.trained_s += gap
            self.step_s = (1 - STEP_EWMA) * step_s + STEP_EWMA * gap / new
        elif self.step_s is None:
            self.step_s = step_s

    def begin(self, token: object, kind: str) -> None:
        """A wait of `kind` ("c": a collective, "i": an init) begins, known as `token`."""
        now = self.clock()
        if kind == "c":
            with self._timing:
                if not self.colls:
                    self.coll_from = now
                self.colls += 1
        self.inflight[token] = (now, kind)

    def end(self, token: object, kind: str, completed: bool = True) -> None:
        """The wait `token` is over; `completed`: it succeeded (counted as done)."""
        was = self.inflight.pop(token, None)
        if was is not None and was[1] == "c":
            now = self.clock()
            with self._timing:
                self.colls = max(0, self.colls - 1)
                if not self.colls:
                    self.coll_s += max(0.0, now - self.coll_from)
        if completed:
            self.done += 1
            self.since_init = 0 if kind == "i" else self.since_init + 1
            if kind == "i":  # a new world: its steps are timed afresh
                with self._timing:
                    self.timed.clear()
                    self.timed_from, self.skip = None, STEP_SKIP

    def forget(self, kind_of: Callable[[object], bool]) -> None:
        """Drop the waits whose token `kind_of` picks: waits that will never end (the ops of a
        TensorFlow graph that failed: its end signal never runs)."""
        for token in [t for t in list(self.inflight) if kind_of(t)]:
            self.inflight.pop(token, None)
        with self._timing:
            self.colls = sum(1 for _, kind in list(self.inflight.values()) if kind == "c")

    def wrap(self, fn: Callable[..., Any], kind: str,
             after: Callable[[], None] | None = None) -> Callable[..., Any]:
        """`fn`, timed as a wait of `kind` ("c": a collective, "i": an init); `after` runs
        after each successful call."""
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = object()
            self.begin(token, kind)
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                self.end(token, kind, completed=False)
                raise
            self.end(token, kind)
            if after is not None:
                after()
            return result
        return wrapper


def _trimmed(values: list[float]) -> float:
    """The mean of `values` without its highest tenth, and at least the highest one of two or
    more (a new world's first dozen steps: one slow start is not a slow worker)."""
    n = len(values)
    kept = sorted(values)[:n - max(n // 10, 1 if n > 1 else 0)]
    return sum(kept) / len(kept)


def local_endpoints(connections: Iterable[Any]) -> tuple[list[str], list[int]]:
    """The local addresses of established TCP connections, and their local ports on loopback
    addresses (those are shared by every process of a machine)."""
    addrs, ports = set(), set()
    for c in connections:
        if c.status != "ESTABLISHED" or not c.laddr or not c.raddr:
            continue
        ip = _plain(c.laddr[0])
        addrs.add(ip)
        if is_loopback(ip):
            ports.add(int(c.laddr[1]))
    return sorted(addrs), sorted(ports)[:MAX_PORTS]


Link = Tuple[Endpoint, Endpoint]  # an established TCP connection: (local, remote) endpoint


def links(connections: Iterable[Any]) -> dict[Link, int]:
    """PURE: the established TCP connections that have an fd in this process, by endpoints."""
    out = {}
    for c in connections:
        if c.status == "ESTABLISHED" and c.laddr and c.raddr and c.fd is not None and c.fd >= 0:
            out[((_plain(c.laddr[0]), int(c.laddr[1])),
                 (_plain(c.raddr[0]), int(c.raddr[1])))] = int(c.fd)
    return out


def peer_links(connections: Iterable[Any], keep: Iterable[Endpoint]) -> dict[int, str]:
    """PURE: fd -> remote address of the established connections to another machine (neither
    loopback nor one of its own local addresses: a pod's processes talk to each other over its
    IP), except those to `keep` (the supervisor, the rendezvous), at most MAX_LINK_FDS."""
    kept = _endpoints(keep)
    out: dict[int, str] = {}
    for (local, remote), fd in sorted(links(connections).items(), key=lambda x: x[1]):
        if remote[0] != local[0] and not is_loopback(remote[0]) and remote not in kept:
            out[fd] = remote[0]
            if len(out) >= MAX_LINK_FDS:
                break
    return out


def tcp_rtt(fd: int, remote: str) -> tuple[int, int] | None:
    """(smoothed round-trip time in microseconds, milliseconds since it last sent data) of this
    process's socket `fd`, from the kernel's tcp_info, or None: not a TCP socket to `remote`
    any more (closed, its number reused), or unreadable. A dup is read: nothing of the
    library's socket changes."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        if _plain(str(s.getpeername()[0])) != remote:
            return None
        raw = s.getsockopt(socket.IPPROTO_TCP, TCP_INFO, TCPI_LEN)
    except (OSError, IndexError, TypeError):
        return None
    finally:
        s.close()
    if len(raw) < TCPI_RTT + 4:
        return None
    return struct.unpack_from("I", raw, TCPI_RTT)[0], struct.unpack_from(
        "I", raw, TCPI_LAST_DATA_SENT)[0]


def peer_rtts(samples: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """PURE: (remote address, round-trip time in microseconds, milliseconds since it last sent
    data) of each link -> the fastest active link's time per address (microseconds)."""
    best: dict[str, int] = {}
    for ip, rtt_us, idle_ms in samples:
        if idle_ms <= LINK_ACTIVE_MS and rtt_us > 0 and rtt_us < best.get(ip, 1 << 32):
            best[ip] = rtt_us
    return best


class LinkTimes:
    """The last LINK_READINGS readings of `peer_rtts`; `means()` is what a heartbeat carries:
    per peer address the mean of its readings (a peer not active in a reading has none), in
    milliseconds, the MAX_LINKS fastest."""

    def __init__(self) -> None:
        self.readings: collections.deque[dict[str, int]] = collections.deque(
            maxlen=LINK_READINGS)

    def add(self, reading: dict[str, int]) -> None:
        self.readings.append(reading)

    def means(self) -> dict[str, float]:
        sums: dict[str, list[int]] = {}
        for reading in self.readings:
            for ip, us in reading.items():
                sums.setdefault(ip, []).append(us)
        mean = {ip: sum(v) / len(v) for ip, v in sums.items()}
        fastest = sorted(mean.items(), key=lambda x: (x[1], x[0]))[:MAX_LINKS]
        return {ip: round(us / 1000, 3) for ip, us in fastest}


def _endpoints(keep: Iterable[Endpoint]) -> set[Endpoint]:
    return {(_plain(ip), int(port)) for ip, port in keep}


def severable(connections: Iterable[Any], dead: Sequence[DeadEntry],
              keep: Iterable[Endpoint]) -> list[int]:
    """PURE: the fds of established connections whose remote end is a dead host's endpoint
    (address, and port where the entry lists ports), except those to `keep`."""
    kept = _endpoints(keep)
    by_addr: dict[str, set | None] = {}
    for raw, ports in dead:
        addr = _plain(raw)
        if ports is None or by_addr.get(addr, set()) is None:
            by_addr[addr] = None
        else:
            by_addr.setdefault(addr, set()).update(ports)  # type: ignore[union-attr]
    fds = []
    for (_, remote), fd in links(connections).items():
        ip, port = remote
        if remote in kept or ip not in by_addr:
            continue
        ports = by_addr[ip]
        if ports is None or port in ports:
            fds.append(fd)
    return sorted(fds)


def world_links(before: Iterable[Link], after: Iterable[Link],
                keep: Iterable[Endpoint]) -> frozenset[Link]:
    """PURE: the connections a world's collective library opened: established while the process
    joined the world (after its init, not before it), except those to `keep`."""
    kept = _endpoints(keep)
    return frozenset(link for link in set(after) - set(before) if link[1] not in kept)


def sever(fds: Iterable[int]) -> int:
    """Shut down the reading side of the sockets `fds` of this process; return how many. The
    shutdown reaches the very socket the collective library blocks on (a dup shares it);
    nothing is closed, so no descriptor changes owner under the library's feet.

    Only the reading side: Gloo fails a pair (every operation waiting on it) when a read
    returns end-of-file, which a read shutdown makes at once. A write shutdown would add a
    trap: a send posted to the pair before Gloo has seen that end-of-file meets EPIPE, is
    queued, and is never failed (Gloo fails only bound buffers' queued sends; Horovod's are
    unbound), so the process waits in it for the whole Gloo timeout. With the writing side
    open that send goes into the kernel's buffer and completes."""
    n = 0
    for fd in fds:
        with contextlib.suppress(OSError):
            s = socket.socket(fileno=os.dup(fd))
            try:
                s.shutdown(socket.SHUT_RD)
                n += 1
            finally:
                s.close()  # the dup only
    return n


WHERE_FRAMES = 3  # the main thread's innermost frames a heartbeat names while it stands still
LOCALS = 32  # the innermost frame's local variables its position digests


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


_PLAIN = (int, float, bool, str, bytes, type(None))


def _locals_digest(frame: Any) -> str:
    """A digest of the frame's local variables (plain values, else which object): a Python loop
    is always sampled at the same instruction (where the main thread hands the GIL over, so the
    position alone aliases), but its variables change every iteration."""
    try:
        items = list(frame.f_locals.items())[:LOCALS]
    except Exception:
        return ""
    return format(hash(tuple(
        (k, v if (isinstance(v, _PLAIN) and not isinstance(v, (str, bytes))) or (
            isinstance(v, (str, bytes)) and len(v) <= 64) else id(v)) for k, v in items))
        & 0xFFFFFFFF, "x")


def position(frame: Any) -> tuple[str, list[str]]:
    """Where a thread stands, from its innermost Python frame: a position that changes
    whenever it executes Python (file, line, instruction offset, its local variables), and
    its WHERE_FRAMES innermost frames as "file:line function" (a thread inside a C call, a GPU
    kernel or a lock keeps both)."""
    if frame is None:
        return "", []
    code = frame.f_code
    pos = f"{code.co_filename}:{frame.f_lineno}:{frame.f_lasti}:{_locals_digest(frame)}"
    where, f = [], frame
    while f is not None and len(where) < WHERE_FRAMES:
        where.append(f"{_short(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return pos, where


def io_fields(text: str, keys: Sequence[str]) -> int:
    """PURE: the sum of `keys` in a /proc/<pid>/io text."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        values[name.strip()] = value.strip()
    return sum(int(values[k]) for k in keys if values.get(k, "").isdigit())


def io_bytes(main_tid: int) -> int | None:
    """The process's storage I/O (read_bytes + write_bytes: a checkpoint, a dataset) plus
    every byte the main thread moved through read and write calls (rchar + wchar: a loader
    that reads in the main thread), or None where /proc has no io file. Sockets count only
    through the main thread: Horovod's background thread talks to its peers all the time."""
    try:
        with open("/proc/self/io") as f:
            process = io_fields(f.read(), ("read_bytes", "write_bytes"))
        with open(f"/proc/self/task/{main_tid}/io") as f:
            return process + io_fields(f.read(), ("rchar", "wchar"))
    except (OSError, ValueError):
        return None


class Connection(NamedTuple):
    """One TCP socket of this process, as psutil's `pconn` shows it (the fields used here)."""

    fd: int
    laddr: tuple[Any, ...]  # (ip, port), or () when unbound
    raddr: tuple[Any, ...]  # (ip, port), or () when not connected
    status: str


# /proc/net/tcp's `st` column (include/net/tcp_states.h), named as psutil names them
TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING", "0C": "NEW_SYN_RECV"}


def _proc_address(text: str, little_endian: bool) -> tuple[Any, ...]:
    """An "ADDR:PORT" of /proc/net/tcp{,6} (the address in 32-bit words of the kernel's byte
    order), as (ip, port); () for the unspecified address and port 0."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    if little_endian:
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)
    number = int(port, 16)
    if number == 0 and ip in ("0.0.0.0", "::"):
        return ()
    return (ip, number)


def parse_proc_tcp(text: str, sockets: dict[int, int],
                   little_endian: bool = sys.byteorder == "little") -> list[Connection]:
    """PURE: the connections of a /proc/net/tcp or tcp6 table whose socket inode is one of
    this process's (`sockets`: inode -> fd)."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or not cols[9].isdigit() or int(cols[9]) not in sockets:
            continue
        with contextlib.suppress(ValueError, OSError):
            out.append(Connection(sockets[int(cols[9])], _proc_address(cols[1], little_endian),
                                  _proc_address(cols[2], little_endian),
                                  TCP_STATES.get(cols[3].upper(), "NONE")))
    return out


def proc_tcp_connections(proc: str = "/proc/self",
                         tables: tuple[str, ...] = ("tcp", "tcp6")) -> list[Connection]:
    """This process's TCP connections read from /proc, as psutil reads them: its socket fds
    (proc/fd links "socket:[inode]") matched with the tables of the process's own network
    namespace (`proc`/net; ("udp", "udp6") for its UDP sockets, their states meaningless)."""
    sockets = {}
    for name in os.listdir(f"{proc}/fd"):
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(f"{proc}/fd/{name}")
            if target.startswith("socket:["):
                sockets[int(target[8:-1])] = int(name)
    out: list[Connection] = []
    for table in tables:
        with contextlib.suppress(FileNotFoundError), open(f"{proc}/net/{table}") as f:
            out += parse_proc_tcp(f.read(), sockets)
    return out


class TcpConnections:
    """Reads this process's TCP connections: with psutil (a Horovod dependency) when it is
    installed, else from /proc, said once on stderr. Called, it returns them (or raises)."""

    def __init__(self) -> None:
        self._read: Callable[[], list[Any]] | None = None

    def _reader(self) -> Callable[[], list[Any]]:
        try:
            import psutil
        except ImportError:
            print("elastic-supervisor hook: psutil is not installed: this process's TCP "
                  "connections are read from /proc instead", file=sys.stderr, flush=True)
            return proc_tcp_connections

        def read() -> list[Any]:
            process = psutil.Process()
            # net_connections since psutil 6.0; before, connections (Debian bullseye's 5.8)
            read = getattr(process, "net_connections", None) or process.connections
            return list(read(kind="tcp"))

        return read

    def __call__(self) -> list[Any]:
        if self._read is None:
            self._read = self._reader()
        return self._read()


def _address(host: str) -> str:
    """`host` as the source address of its datagrams reads (an IP address; a name resolved)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class Beater:
    """The heartbeat thread of one training process; also receives the fence and acts on it."""

    def __init__(self, progress: Progress, *, key: bytes, supervisor: Endpoint, run: str,
                 host: str, local_rank: int, keep: Sequence[Endpoint],
                 problems: Sequence[str] = (),
                 connections: Callable[[], list[Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 exit_process: Callable[[int], None] = os._exit, fence: bool = True) -> None:
        self.progress, self.key, self.supervisor, self.run = progress, key, supervisor, run
        # The supervisor's messages come from its socket only: every process of the job holds
        # the key, none can send from that address (the job's pods drop every capability,
        # NET_RAW included, and the port is the supervisor's).
        self.supervisor_from = (_address(supervisor[0]), supervisor[1])
        self.foreign = 0  # signed datagrams from another address, dropped
        self.host, self.local_rank, self.keep = host, local_rank, tuple(keep)
        self.problems = list(problems)
        self.connections = TcpConnections() if connections is None else connections
        self.clock, self.exit_process = clock, exit_process
        self.fence = fence  # False: an unfenced framework's process: nothing is ever cut
        self.sender = wire.new_sender_id()
        self.seq = 0
        self._sending = threading.Lock()
        self.dead: list[DeadEntry] = []
        self.fence_version = 0
        self.severed_stall: tuple[float, int] | None = None  # (stall start, fence version)
        self.severed_version = 0  # the last fence version whose connections were cut
        self.endpoints: tuple[list[str], list[int]] = ([], [])
        self.endpoints_read: tuple[int, float] | None = None  # (inits, when)
        self.peers: dict[int, str] = {}  # fd -> address of the links to other machines
        self.links = LinkTimes()  # the round trips of the links to other machines
        main = threading.main_thread()
        self.main_ident, self.main_tid = main.ident, getattr(main, "native_id", os.getpid())
        self.last_pos = ""
        self.watcher: Any = None
        self.replays = wire.Replays(limit=4)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastic-supervisor-hook",
                                        daemon=True)

    def start(self, watch_env: dict[str, str] | None = None) -> Beater:
        """Start heartbeating; with `watch_env` (the hook's environment), start the process
        watcher too (watch.py: the second signal when this process falls silent)."""
        self._thread.start()
        atexit.register(self.bye)
        if watch_env is not None:
            self.watcher = self._watch(watch_env)
        return self

    def _watch(self, env: dict[str, str]) -> Any:
        import subprocess

        from . import watch
        hook_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            return subprocess.Popen(
                watch.command(hook_dir), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env={**env, watch.OF_ENV: self.sender, watch.PID_ENV: str(os.getpid()),
                     watch.TARGET_ENV: f"{self.supervisor[0]}:{self.supervisor[1]}"})
        except OSError as e:
            # Not a problem of the hook (those switch hang detection off for the process):
            # without its watcher a silent process is judged by its silence alone, as before.
            print(f"elastic-supervisor hook: cannot start the process watcher: {e!r} (a "
                  "silent process is judged by its silence alone)", file=sys.stderr, flush=True)
            return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher.wait(5)

    # -- sending ---------------------------------------------------------------------------------

    def _send(self, body: dict[str, Any]) -> None:
        # Numbered and sent in one step: the bye (at exit, from the main thread) and the
        # heartbeats (this thread) would otherwise leave in another order than numbered, and
        # the supervisor drops a number lower than one it took (both byes were lost so).
        with self._sending:
            if body.get("t") == "hb" and self._stop.is_set():
                return  # said bye, or closed
            self.seq += 1
            body.update(s=self.sender, n=self.seq, run=self.run)
            with contextlib.suppress(OSError):
                self.sock.sendto(wire.encode(self.key, body), self.supervisor)

    def heartbeat(self) -> dict[str, Any]:
        """The next heartbeat's body (without sender and sequence number)."""
        p, now = self.progress, self.clock()
        start, kind, _ = p.waiting()
        last = self.endpoints_read
        if last is None or last[0] != p.inits or now - last[1] >= ENDPOINTS_S:
            self.endpoints_read = (p.inits, now)
            try:
                conns = self.connections()
                self.endpoints = local_endpoints(conns)
                self.peers = peer_links(conns, self.keep)
            except Exception as e:  # never let the thread die of psutil
                self._problem(f"cannot read this process's connections: {e!r}")
        # a reading at every heartbeat, empty without links: what was read ages out with it
        self.links.add(peer_rtts((ip, *rtt) for fd, ip in self.peers.items()
                                 if (rtt := tcp_rtt(fd, ip)) is not None))
        addrs, ports = self.endpoints
        pos, where = position(sys._current_frames().get(self.main_ident))
        body = {"t": "hb", "pid": os.getpid(), "host": self.host, "lr": self.local_rank,
                "rank": p.rank, "size": p.size, "inits": p.inits, "done": p.done,
                "dc": p.since_init, "st": p.steps, "cm": p.commits, "rd": p.redone,
                "tr": round(p.trained_s, 3),
                "wait": None if start is None else round(now - start, 3),
                "in": kind, "addrs": addrs, "ports": ports, "fv": self.fence_version,
                "problems": self.problems, "pos": pos, "io": io_bytes(self.main_tid)}
        timed = p.step_times()
        if timed is not None:
            body.update(so=round(timed[0], 5), sw=round(timed[1], 5), sn=timed[2])
        rtts = self.links.means()
        if rtts:
            body["rt"] = rtts
        if pos and pos == self.last_pos:
            body["where"] = where  # standing still: say where (only then: datagrams stay small)
        self.last_pos = pos
        return body

    def bye(self) -> None:
        """Tell the supervisor this process ends on purpose (at interpreter exit); no heartbeat
        follows (one would tell the supervisor the process is back, then fall silent)."""
        self._stop.set()
        for _ in range(2):
            self._send({"t": "bye", "pid": os.getpid(), "host": self.host,
                        "lr": self.local_rank})

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            print(f"elastic-supervisor hook: {text}", file=sys.stderr, flush=True)

    # -- receiving -------------------------------------------------------------------------------

    def receive(self, data: bytes, source: Endpoint) -> None:
        """Handle one datagram from `source`: only the supervisor's, from its own address."""
        body = wire.decode(self.key, data)
        if body is None or body["s"] != wire.SUPERVISOR:
            return
        if tuple(source[:2]) != self.supervisor_from:
            self.foreign += 1
            if self.foreign == 1:  # said once (a problem in every heartbeat from then on)
                self._problem(f"datagrams signed as the supervisor's come from another address "
                              f"(first {source[0]}:{source[1]}) than the supervisor's "
                              f"({self.supervisor_from[0]}:{self.supervisor_from[1]}): "
                              "dropped (another holder of the job's key)")
            return
        if not self.replays.accept(body["s"], body["n"]):
            return
        if body["t"] == "exit" and body.get("run") == self.run:
            print(f"elastic-supervisor hook: exiting: {body.get('why', 'asked to')}",
                  file=sys.stderr, flush=True)
            self.exit_process(1)
        elif body["t"] == "fence" and isinstance(body.get("v"), int) \
                and body["v"] > self.fence_version and isinstance(body.get("dead"), list):
            dead = []
            for entry in body["dead"]:
                with contextlib.suppress(TypeError, ValueError):
                    addr, ports = entry
                    dead.append((str(addr), None if ports is None
                                 else tuple(int(p) for p in ports)))
            self.dead, self.fence_version = dead, body["v"]
            self.check()

    def check(self) -> int | None:
        """Cut the dead hosts' connections for a new dead set, or when a collective has been
        stalled STALL_S; return how many were cut (None: nothing to do)."""
        if not self.dead or not self.fence:
            return None
        _, _, since = self.progress.waiting()
        fresh = self.severed_version != self.fence_version
        stalled = (since is not None and self.clock() - since >= STALL_S
                   and self.severed_stall != (since, self.fence_version))
        if not (fresh or stalled):
            return None
        self.severed_version = self.fence_version
        if stalled:
            self.severed_stall = (since, self.fence_version)
        try:
            connections = self.connections()
            fds = severable(connections, self.dead, self.keep)
        except Exception as e:
            self._problem(f"cannot read this process's connections: {e!r}")
            return None
        if not fds:
            if fresh and since is not None:  # a new dead set, stalled, nothing of it to cut
                remotes = sorted({ip for (_, (ip, _)) in links(connections)})
                print(f'{{"event": "fence.nothing_to_cut", "host": "{self.host}", '
                      f'"stalled_s": {self.clock() - since:.2f}, "remotes": {remotes!r}, '
                      f'"dead": {[a for a, _ in self.dead]!r}, "time": {time.time():.3f}}}'
                      .replace("'", '"'), file=sys.stderr, flush=True)
            return None
        n = sever(fds)
        print(f'{{"event": "fence.severed", "host": "{self.host}", "connections": {n}, '
              f'"stalled_s": {0.0 if since is None else self.clock() - since:.2f}, '
              f'"time": {time.time():.3f}}}',
              file=sys.stderr, flush=True)
        return n

    def _next_wake(self, next_beat: float) -> float:
        _, _, since = self.progress.waiting()
        wake = next_beat
        if self.dead and self.fence and since is not None and self.severed_stall != (
                since, self.fence_version):
            wake = min(wake, since + STALL_S)
        return wake

    def _run(self) -> None:
        next_beat = self.clock()
        while not self._stop.is_set():
            now = self.clock()
            if now >= next_beat:
                self._send(self.heartbeat())
                next_beat = now + BEAT_S
            self.check()
            self.sock.settimeout(max(0.005, self._next_wake(next_beat) - self.clock()))
            try:
                data, source = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                if self._stop.wait(BEAT_S):
                    return
                continue
            self.receive(data, source)
