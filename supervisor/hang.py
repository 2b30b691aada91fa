"""PURE: is training blocked, and by whom? Decided from the hook's heartbeats (channel.Beat).

Every training process sends a heartbeat every 0.5 s with how many collectives it completed
and whether it is inside one. From the last heartbeat of each process and `now`:

- a process is `Hung` when it had been heartbeating and then fell silent for `silence_s`
  (no bye: it did not exit cleanly), its host is one the discovery file lists and that is not
  being scaled in, and training is blocked on it: another process, heartbeating, is waiting in a
  collective (or an init), and none completed a collective since the silent one's last
  heartbeat (one heartbeat period of slack each way for what was already in flight). A frozen,
  deadlocked-with-the-GIL, partitioned or vanished process looks like that; a process that still
  heartbeats (a long step, a 2-minute checkpoint write, an evaluation) never does, and neither
  does one whose peers go on completing collectives (a lost heartbeat route).
- the job is `stalled` when no process completed a collective for `stall_s` while some still
  heartbeat: everybody is alive and nobody progresses (a deadlock the first rule cannot see).
- a rendezvous is `broken` when a host of the world horovodrun's driver last assigned (the
  driver hook reports each assignment) failed, processes still wait in an init, and no new
  assignment came for BROKEN_AFTER_S after both the failure and the assignment (a host that
  failed just before it can still be in it: the driver reads the discovery file once a
  second, so its view lags the file): Horovod 0.28 cannot finish that
  rendezvous without the host (e.g. a replacement killed while it joins), and the waiting
  processes abort (std::terminate) at the Gloo timeout, taking the job with them. Only a new
  horovodrun helps. (A host that fails while the world trains is not that: the survivors reset
  and the driver assigns a new world without it within about a second.)
- a rendezvous is `stuck` when a host failed after the driver's last assignment, and every
  member of that world is there, heartbeating, with all its processes waiting in an init for
  STUCK_AFTER_S, and still no new assignment: nobody the world needs is missing, yet it does
  not form. Seen in a soak on real nodes: right after a restart of horovodrun, a replacement
  just listed (not in the world) was evicted, and the two members waited in their init for 63
  s, until the Gloo timeout ended one of them (exit 255; Horovod then never uses its host
  again). A rendezvous whose members are all present forms in about a second (the driver's
  notification of a frozen coordinator holds it up to 6 s, see the hook), so STUCK_AFTER_S
  leaves room; the failure is required so that a slow first init of a large world, with
  nothing failed, is never taken for this. Only a new horovodrun helps, as for `broken`.
- hosts listed for long without any heartbeat, and the hook's own problems, are reported so
  that the supervisor can say hang detection is off for them.
No I/O, no clock: `now` and all times are monotonic seconds passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from supervisor.channel import Beat

BEAT_S = 0.5  # the hook's heartbeat period (elastic_supervisor_hook.worker.BEAT_S)
BROKEN_AFTER_S = 5.0  # a failed member and no new world for this long: the rendezvous is broken
STUCK_AFTER_S = 15.0  # every member waiting in its init this long after a failure: stuck
UNMONITORED_AFTER_S = 60.0  # horovodrun has run this long: every listed host should heartbeat


@dataclass(frozen=True)
class HangSettings:
    """silence_s: SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS; stall_s: SUPERVISOR_STALL_TIMEOUT_
    SECONDS; beat_s: the hook's heartbeat period."""

    silence_s: float = 3.0
    stall_s: float = 1800.0
    beat_s: float = BEAT_S


@dataclass(frozen=True)
class Hung:
    host: str
    pid: int
    silent_s: float
    detail: str


@dataclass(frozen=True)
class Stall:
    since_s: float  # seconds without a completed collective
    alive: int  # processes still heartbeating


@dataclass(frozen=True)
class Broken:
    host: str  # the host that failed during the rendezvous
    waiting: int  # processes waiting in it


@dataclass(frozen=True)
class Stuck:
    host: str  # the host whose failure came last after the driver's assignment
    members: int  # hosts of the world, all waiting in their init
    waited_s: float  # the shortest of their waits


@dataclass(frozen=True)
class Verdict:
    hung: tuple[Hung, ...] = ()
    stall: Stall | None = None
    broken: Broken | None = None
    stuck: Stuck | None = None
    unmonitored: tuple[str, ...] = ()  # listed hosts that never sent a heartbeat
    problems: tuple[tuple[str, str], ...] = ()  # (host, the hook's problem)


def _fresh(b: Beat, now: float, s: HangSettings) -> bool:
    return b.bye_at is None and now - b.last_seen < s.silence_s


def assess(beats: Iterable[Beat], watched: Mapping[str, float], *, started_at: float,
           settings: HangSettings, now: float, failed_at: Mapping[str, float] | None = None,
           world: tuple[frozenset[str], float] | None = None) -> Verdict:
    """Return what the heartbeats of one run of horovodrun say about the `watched` hosts
    (listed in the discovery file and not being scaled in, with since when);
    `started_at`: when that run of horovodrun started; `failed_at`: when hosts were found
    failed (in this run); `world`: the hosts of the driver's last assignment and when it came
    (None: the driver hook did not say)."""
    s = settings
    all_beats = list(beats)
    fresh = [b for b in all_beats if _fresh(b, now, s)]
    waiting = [b for b in fresh if b.wait_s is not None]
    hung: dict[str, Hung] = {}
    for b in all_beats:
        silent = now - b.last_seen
        if (b.host not in watched or b.bye_at is not None or b.problems
                or silent < s.silence_s or b.host in hung):
            continue
        peers = [p for p in waiting if p.sender != b.sender]
        if not peers:
            continue
        progressed = max((p.progress_at for p in fresh
                          if p.sender != b.sender and p.progress_at is not None), default=None)
        if progressed is not None and progressed > b.last_seen + 2 * s.beat_s:
            continue  # the others went on without it: it is not what blocks them
        longest = max(peers, key=lambda p: p.wait_s or 0.0)
        where = "an init" if longest.waiting == "i" else "a collective"
        hung[b.host] = Hung(b.host, b.pid, silent, (
            f"process {b.pid} (rank {b.rank}) sent no heartbeat for {silent:.1f}s while "
            f"{len(peers)} peer process(es) waited in {where} (longest {longest.wait_s:.1f}s at "
            f"its last heartbeat) and none completed one since"))
    last_progress = max((b.first_seen if b.progress_at is None else b.progress_at
                         for b in all_beats), default=started_at)
    stall = None
    if fresh and now - last_progress >= s.stall_s:
        stall = Stall(now - last_progress, len(fresh))
    broken = None
    if world is not None:
        members, assigned_at = world
        for host, at in sorted((failed_at or {}).items(), key=lambda x: x[1]):
            stuck = [b for b in fresh if b.waiting == "i" and b.host != host]
            if host in members and now - max(at, assigned_at) >= BROKEN_AFTER_S and stuck:
                broken = Broken(host, len(stuck))
                break
    stuck_verdict = None
    if world is not None and broken is None:
        stuck_verdict = _stuck(fresh, world, failed_at or {}, now)
    seen = {b.host for b in all_beats}
    unmonitored = tuple(sorted(
        h for h, since in watched.items()
        if h not in seen and now - max(since, started_at) >= UNMONITORED_AFTER_S))
    problems = tuple(sorted({(b.host, p) for b in all_beats for p in b.problems}))
    return Verdict(tuple(hung[h] for h in sorted(hung)), stall, broken, stuck_verdict,
                   unmonitored, problems)


def _stuck(fresh: list[Beat], world: tuple[frozenset[str], float],
           failed_at: Mapping[str, float], now: float) -> Stuck | None:
    """The `stuck` rule (see the module's doc): None unless a host failed after the world's
    assignment and every member host has fresh processes, all waiting in an init for at least
    STUCK_AFTER_S (their wait at the last heartbeat plus the time since)."""
    members, assigned_at = world
    late = sorted((at, h) for h, at in failed_at.items() if at > assigned_at)
    if not members or not late or now - assigned_at < STUCK_AFTER_S:
        return None
    waits: dict[str, list[float | None]] = {h: [] for h in members}
    for b in fresh:
        if b.host in waits:
            waits[b.host].append(b.wait_s + (now - b.last_seen)
                                 if b.waiting == "i" and b.wait_s is not None else None)
    if any(not ws or any(w is None or w < STUCK_AFTER_S for w in ws) for ws in waits.values()):
        return None
    shortest = min(w for ws in waits.values() for w in ws if w is not None)
    return Stuck(late[-1][1], len(members), shortest)


def run_progress(beats: Iterable[Beat], started_at: float, now: float) -> tuple[float, int]:
    """What a run of horovodrun has done so far: the seconds since it started and the most
    collectives one of its processes completed (what a restart throws away when the script
    keeps no checkpoint: it starts over at its first iteration)."""
    return max(0.0, now - started_at), max((b.done for b in beats), default=0)
