"""PURE: is training blocked, and by whom? Decided from the hook's heartbeats (beats.Beat).

Every training process sends a heartbeat every 0.5 s with how many collectives it completed
and whether it is inside one. From the last heartbeat of each process and `now`:

- a process is `Hung` when it had been heartbeating and then fell silent for `silence_s`
  (no bye: it did not exit cleanly), its host is one the discovery file lists and that is not
  being scaled in, and training is blocked on it: another process, heartbeating, is waiting in a
  collective (or an init), and none completed a collective since the silent one's last
  heartbeat (give or take `progress_slack_s`: cover_s, for what was already in flight and
  for late heartbeats; its peers that go on completing collectives show it later), and a
  peer has itself waited, by its own last heartbeat, at least `cover_s` (silence_s less two
  heartbeat periods: 2 s by default). The evidence must match the cost (the worker is fenced,
  deleted and replaced): seen in a demo, a rank whose heartbeats were late on a loaded node
  (it printed steps for a second after its last one) was declared at 3.0 s while its only
  waiting peer had just entered its collective ("longest 0.0s"). A frozen process's peers
  enter their wait at most one heartbeat period (it froze before its next heartbeat) and one
  step after its last heartbeat, and say so at most one heartbeat period later: at silence_s
  they said cover_s or more, so a frozen worker is still declared at silence_s (later by at
  most the step time). A silent process blocking peers that have not waited that long yet is
  reported (`unconfirmed`), not Hung. A frozen,
  deadlocked-with-the-GIL, partitioned or vanished process looks like that; a process that still
  heartbeats (a long step, a 2-minute checkpoint write, an evaluation) never does, and neither
  does one whose peers go on completing collectives (a lost heartbeat route).
  Processes that fell silent together are one incident, declared together so that they are
  fenced in one dead set and the survivors reset once (issue 40: a frozen node held ranks 0
  and 1; rank 1 was declared at 3.0 s, the survivors reset into a world that still held
  rank 0, declared 1.3 s later, and the rendezvous broke): when a process is Hung and its pod
  fell silent whole (its watcher's last word came with its last heartbeat, within
  `together_s` = two heartbeat periods, or it has none), every other process on the same
  node (`nodes`: host -> node) whose heartbeats and watcher stopped within together_s of its
  last heartbeat, and that has been silent for at least cover_s (and two heartbeat periods),
  is Hung with it (`Hung.along`), though its own silence is below silence_s: the heartbeats
  of two processes frozen at once stop at most one period apart (their phases differ), the
  second period is for the delivery. Not when a later word from its watcher shows it alive.
  A silent process whose watcher (a separate small process in its pod, hook/watch.py) still
  reports it running (state R, or CPU time growing: its GIL held by a long garbage-collector
  pass or a C extension) is given the stuck threshold before it is Hung; one the watcher
  reports stopped or idle, or whose watcher is silent too, is Hung at `silence_s` as before.
- a process is `Stuck` when it heartbeats (its other threads run) but its main thread stands
  still: the same position (file, line, instruction offset of its innermost Python frame), no
  I/O (storage, or the main thread's reads and writes), no collective completed, for the
  threshold (SUPERVISOR_STUCK_SECONDS; auto: the larger of STUCK_FLOOR_S and STUCK_STEPS times
  the job's recent p99 step time), while it is not in the collective the others wait in and
  every other process waits in one (for half the threshold at least): a deadlocked loader, a
  GPU kernel or a read that never returns, a rank-only code path that waits forever. A rank
  busy in Python, writing a checkpoint, or waiting in the same collective as everybody (a
  hang nobody can be named for) is never stuck; the stall rule is the last resort there.
- the job is `stalled` when no process completed a collective for `stall_s` while some still
  heartbeat: everybody is alive and nobody progresses (a deadlock the first rule cannot see).
- a rendezvous is `broken` when a host of the world horovodrun's driver last assigned (the
  driver hook reports each assignment) failed, processes still wait in an init (every process
  of the world's other members: one still on its way there is what the driver's barrier waits
  for, a survivor slow to reset), and no new
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
  that the supervisor can say hang detection is off for them; a problem that names a framework
  the hook does not fence (horovod.tensorflow, horovod.mxnet) is reported apart (`unfenced`).
  A process whose hook reports a problem takes part in none of the rules above: its counts may
  say nothing (a TensorFlow process never completes a collective the hook can see).
No I/O, no clock: `now` and all times are monotonic seconds passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from supervisor.decide.beats import Beat, heartbeating, judged

BEAT_S = 0.5  # the hook's heartbeat period (elastic_supervisor_hook.worker.BEAT_S)
BROKEN_AFTER_S = 5.0  # a failed member and no new world for this long: the rendezvous is broken
STUCK_AFTER_S = 15.0  # every member waiting in its init this long after a failure: stuck
UNMONITORED_AFTER_S = 60.0  # horovodrun has run this long: every listed host should heartbeat
STUCK_FLOOR_S = 20.0  # a stuck main thread: at least this long (SUPERVISOR_STUCK_SECONDS=auto)
STUCK_STEPS = 4  # and at least this many of the job's recent p99 step times


@dataclass(frozen=True)
class HangSettings:
    """silence_s: SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS; stall_s: SUPERVISOR_STALL_TIMEOUT_
    SECONDS; beat_s: the hook's heartbeat period."""

    silence_s: float = 3.0
    stall_s: float = 1800.0
    beat_s: float = BEAT_S
    stuck_s: float | None = None  # SUPERVISOR_STUCK_SECONDS; None: stuck_threshold's


@dataclass(frozen=True)
class Hung:
    host: str
    pid: int
    silent_s: float
    detail: str
    along: str | None = None  # declared with the Hung process of this host (same node)


@dataclass(frozen=True)
class Stall:
    since_s: float  # seconds without a completed collective
    alive: int  # processes still heartbeating


@dataclass(frozen=True)
class Broken:
    host: str  # the host that failed during the rendezvous
    waiting: int  # processes waiting in it


@dataclass(frozen=True)
class RendezvousStuck:
    host: str  # the host whose failure came last after the driver's assignment
    members: int  # hosts of the world, all waiting in their init
    waited_s: float  # the shortest of their waits


@dataclass(frozen=True)
class Stuck:
    host: str
    pid: int
    rank: int | None
    still_s: float  # how long its main thread has not moved
    threshold_s: float
    waiting: int  # peer processes waiting for it in a collective
    waited_s: float  # the shortest of their waits
    where: tuple[str, ...]  # its main thread's innermost frames
    detail: str


@dataclass(frozen=True)
class Verdict:
    hung: tuple[Hung, ...] = ()
    stall: Stall | None = None
    broken: Broken | None = None
    rendezvous_stuck: RendezvousStuck | None = None
    stuck: tuple[Stuck, ...] = ()  # ranks whose main thread stopped while the others wait
    # silent processes that would be Hung but whose watcher says they run (not yet Hung):
    # (host, pid, seconds silent, scheduler state)
    busy: tuple[tuple[str, int, float, str], ...] = ()
    # silent processes that would be Hung but whose peers have not waited cover_s yet (their
    # wait does not cover the silence: late heartbeats, not a freeze, until it does):
    # (host, pid, seconds silent, the longest peer wait at its last heartbeat)
    unconfirmed: tuple[tuple[str, int, float, float], ...] = ()
    unmonitored: tuple[str, ...] = ()  # listed hosts that never sent a heartbeat
    problems: tuple[tuple[str, str], ...] = ()  # (host, the hook's problem)
    # (host, a Horovod framework its processes use that the hook does not fence yet)
    unfenced: tuple[tuple[str, str], ...] = ()


def running(b: Beat, now: float, s: HangSettings) -> bool:
    """Whether the process's watcher, heard within silence_s, says it runs: scheduler state R,
    or (sleeping, in I/O) its CPU time grew within silence_s. Stopped (T, t), dead (Z, X),
    a watcher silent too (a frozen node, a partition): not running."""
    if b.proc_seen is None or now - b.proc_seen >= s.silence_s:
        return False
    if b.proc_state not in ("R", "S", "D"):
        return False
    return b.proc_state == "R" or (b.proc_cpu_at is not None
                                   and now - b.proc_cpu_at < s.silence_s)


def cover_s(s: HangSettings) -> float:
    """How long a peer must have waited, by its own last heartbeat, for a silent process that
    blocks it to be Hung (see the module's doc): silence_s less two heartbeat periods."""
    return max(0.0, s.silence_s - 2 * s.beat_s)


def together_s(s: HangSettings) -> float:
    """How far apart the last words of processes frozen at once can come: two heartbeat
    periods (their phases differ by up to one, the delivery by less than another)."""
    return 2 * s.beat_s


def _heard(b: Beat) -> float:
    """When the last word of b's pod came: its last heartbeat, or its watcher's if later."""
    return b.last_seen if b.proc_seen is None else max(b.last_seen, b.proc_seen)


def _silent_with(b: Beat, h: Beat, now: float, s: HangSettings) -> bool:
    """Whether b fell silent together with the Hung h (see the module's doc): h's pod fell
    silent whole, b's heartbeats and watcher stopped within together_s of h's last heartbeat,
    and b has been silent for at least cover_s and two heartbeat periods."""
    window = together_s(s)
    return (_heard(h) - h.last_seen <= window
            and abs(b.last_seen - h.last_seen) <= window
            and _heard(b) <= max(b.last_seen, h.last_seen) + window
            and now - b.last_seen >= max(cover_s(s), 2 * s.beat_s))


def _together(lead: Iterable[Beat], monitored: list[Beat], watched: Mapping[str, float], *,
              nodes: Mapping[str, str], hung: set[str], now: float,
              s: HangSettings) -> dict[str, Hung]:
    """The processes Hung along with those of `lead` (found Hung on their own evidence): on
    the same node, fallen silent with them (_silent_with); by host, none of `hung`'s."""
    out: dict[str, Hung] = {}
    for h in lead:
        node = nodes.get(h.host)
        for b in monitored:
            if (node is None or b.host in hung or b.host in out or b.host not in watched
                    or b.bye_at is not None or nodes.get(b.host) != node
                    or not _silent_with(b, h, now, s)):
                continue
            silent = now - b.last_seen
            out[b.host] = Hung(b.host, b.pid, silent, (
                f"process {b.pid} (rank {b.rank}) sent no heartbeat for {silent:.1f}s, nor its "
                f"watcher, since process {h.pid} (rank {h.rank}) on {h.host}, on the same node "
                f"{node}, fell silent {abs(b.last_seen - h.last_seen):.1f}s apart and was found "
                "Hung: one incident (a frozen or cut-off node), declared together"), h.host)
    return out


def _blocks(b: Beat, fresh: list[Beat], waiting: list[Beat], s: HangSettings) -> bool:
    """Whether training is blocked on the silent `b`: another process heartbeats while waiting
    in a collective or an init, and none completed one since b's last heartbeat, give or take
    `progress_slack_s` (what was in flight, and late heartbeats)."""
    if not any(p.sender != b.sender for p in waiting):
        return False
    progressed = max((p.progress_at for p in fresh
                      if p.sender != b.sender and p.progress_at is not None), default=None)
    return progressed is None or progressed <= b.last_seen + progress_slack_s(s)


def progress_slack_s(s: HangSettings) -> float:
    """How long after a silent process's last heartbeat its peers may still be seen completing
    collectives with it (see the module's doc): cover_s, at least two heartbeat periods. A
    process trains on for up to one period after its last heartbeat, and its peers' heartbeat
    that shows their last collective (its time is when it came) comes up to one period after
    that; what a loaded machine adds to both (late sends, a busy receiver) needs the rest. Two
    periods alone (1 s) were too tight: in a soak (2026-12-02, seed 12) a worker partitioned
    from three was never declared, its peers' last progress most likely seen just over 1 s
    after its last heartbeat, and the job waited out Gloo's 60 s timeout and then hung."""
    return max(2 * s.beat_s, cover_s(s))


def assess(beats: Iterable[Beat], watched: Mapping[str, float], *, started_at: float,
           settings: HangSettings, now: float, failed_at: Mapping[str, float] | None = None,
           world: tuple[frozenset[str], float] | None = None,
           nodes: Mapping[str, str] | None = None) -> Verdict:
    """Return what the heartbeats of one run of horovodrun say about the `watched` hosts
    (listed in the discovery file and not being scaled in, with since when); `nodes`: host ->
    its node (the processes of a node that fell silent together are Hung together);
    `started_at`: when that run of horovodrun started; `failed_at`: when hosts were found
    failed (in this run); `world`: the hosts of the driver's last assignment and when it came
    (None: the driver hook did not say)."""
    s = settings
    all_beats = list(beats)
    monitored = [b for b in all_beats if judged(b)]
    fresh = [b for b in monitored if heartbeating(b, now, s.silence_s)]
    waiting = [b for b in fresh if b.wait_s is not None]
    hung: dict[str, Hung] = {}
    lead: dict[str, Beat] = {}  # host -> the beat of the process found Hung on its own
    busy: list[tuple[str, int, float, str]] = []
    unconfirmed: list[tuple[str, int, float, float]] = []
    threshold = stuck_threshold(fresh, s)
    busy_bound = max(s.silence_s, threshold)
    for b in monitored:
        silent = now - b.last_seen
        if (b.host not in watched or b.bye_at is not None
                or heartbeating(b, now, s.silence_s) or b.host in hung):
            continue
        runs = running(b, now, s)
        blocked = _blocks(b, fresh, waiting, s)
        if blocked and runs and silent < busy_bound:
            busy.append((b.host, b.pid, silent, b.proc_state or ""))
            continue  # its GIL is held (a garbage-collector pass): it will speak again
        if not blocked:
            continue
        peers = [p for p in waiting if p.sender != b.sender]
        longest = max(peers, key=lambda p: p.wait_s or 0.0)
        if (longest.wait_s or 0.0) < cover_s(s):
            unconfirmed.append((b.host, b.pid, silent, longest.wait_s or 0.0))
            continue  # its peers' own wait does not cover its silence: late heartbeats
        where = "an init" if longest.waiting == "i" else "a collective"
        ran = (f" though its process ran (state {b.proc_state}) for longer than "
               f"{busy_bound:.0f}s" if runs else "")
        hung[b.host] = Hung(b.host, b.pid, silent, (
            f"process {b.pid} (rank {b.rank}) sent no heartbeat for {silent:.1f}s{ran} while "
            f"{len(peers)} peer process(es) waited in {where} (longest {longest.wait_s:.1f}s at "
            f"its last heartbeat) and none completed one since"))
        lead[b.host] = b
    hung.update(_together(lead.values(), monitored, watched,
                          nodes={} if nodes is None else nodes, hung=set(hung), now=now, s=s))
    last_progress = max((b.first_seen if b.progress_at is None else b.progress_at
                         for b in monitored), default=started_at)
    stall = None
    if fresh and now - last_progress >= s.stall_s:
        stall = Stall(now - last_progress, len(fresh))
    broken = None
    if world is not None:
        members, assigned_at = world
        # The other members' processes, all of them waiting in an init: one still on its way
        # there (a survivor slow to reset, on a loaded node) is what the driver's barrier waits
        # for, and it comes; the rendezvous is not broken (yet).
        others = [b for b in fresh if b.host in members and b.host not in (failed_at or {})]
        for host, at in sorted((failed_at or {}).items(), key=lambda x: x[1]):
            stuck = [b for b in fresh if b.waiting == "i" and b.host != host]
            if (host in members and now - max(at, assigned_at) >= BROKEN_AFTER_S and stuck
                    and all(b.waiting == "i" for b in others)):
                broken = Broken(host, len(stuck))
                break
    unformed = None
    if world is not None and broken is None:
        unformed = _stuck(fresh, world, failed_at or {}, now)
    seen = {b.host for b in all_beats}
    cut = now - UNMONITORED_AFTER_S  # (listed, and the run started, this long ago)
    unmonitored = () if started_at > cut else tuple(sorted(
        h for h, since in watched.items() if since <= cut and h not in seen))
    problems = {(b.host, p) for b in all_beats for p in b.problems}
    unfenced = {(b.host, b.unfenced) for b in all_beats if b.unfenced is not None}
    return Verdict(tuple(hung[h] for h in sorted(hung)), stall, broken, unformed,
                   stuck_ranks(fresh, watched, now, threshold),
                   tuple(sorted(x for x in busy if x[0] not in hung)),
                   tuple(sorted(x for x in unconfirmed if x[0] not in hung)), unmonitored,
                   tuple(sorted(problems)), tuple(sorted(unfenced)))


def _stuck(fresh: list[Beat], world: tuple[frozenset[str], float],
           failed_at: Mapping[str, float], now: float) -> RendezvousStuck | None:
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
    return RendezvousStuck(late[-1][1], len(members), shortest)


def run_progress(beats: Iterable[Beat], started_at: float, now: float) -> tuple[float, int]:
    """What a run of horovodrun has done so far: the seconds since it started and the most
    collectives one of its processes completed (what a restart throws away when the script
    keeps no checkpoint: it starts over at its first iteration)."""
    return max(0.0, now - started_at), max((b.done for b in beats), default=0)


def stuck_threshold(beats: Iterable[Beat], settings: HangSettings) -> float:
    """How long a main thread must stand still to be stuck: SUPERVISOR_STUCK_SECONDS, or (auto)
    the larger of STUCK_FLOOR_S and STUCK_STEPS times the p99 of the recent step times (the
    intervals between heartbeats that showed progress, GAPS per process): a job whose steps
    take a minute must not see a rank stuck in every long kernel."""
    if settings.stuck_s is not None:
        return settings.stuck_s
    gaps = sorted(g for b in beats for g in b.gaps)
    if not gaps:
        return STUCK_FLOOR_S
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    return max(STUCK_FLOOR_S, STUCK_STEPS * p99)


def stuck_ranks(fresh: list[Beat], watched: Mapping[str, float], now: float,
                threshold: float) -> tuple[Stuck, ...]:
    """The `stuck` rule: a process that heartbeats (its other threads run) whose main thread
    has not moved (position, I/O, progress) for the threshold, is not in the collective its
    peers wait in, and every other process heartbeating is waiting in a collective (for half
    the threshold at least) or is stuck itself: training is blocked on it. A rank busy in
    Python (its position moves), writing a checkpoint (its I/O moves), or in the same
    collective as everybody (a hang nobody can be named for: the stall rule's) is never
    stuck. Ranks on hosts not watched (scaled in, not listed) are never named. `threshold`:
    stuck_threshold's."""

    def still(b: Beat) -> float:
        return -1.0 if b.still_since is None else now - b.still_since

    # Linear in the processes: at 1,000 workers stuck in one collective every one of them is
    # a candidate, and this runs on every tick.
    candidates = {b.sender for b in fresh if still(b) >= threshold and b.waiting != "i"}
    waiting = [p for p in fresh if p.waiting == "c"]
    waits = sorted(((p.wait_s or 0.0) + now - p.last_seen, p.sender) for p in waiting)
    counts = sorted((p.since_init, p.sender) for p in waiting if p.since_init is not None)
    # processes neither waiting in a collective nor stuck themselves: training is not blocked
    busy = {p.sender for p in fresh if p.waiting != "c" and p.sender not in candidates}
    named = []
    for x in fresh:
        if x.sender not in candidates or x.host not in watched or busy - {x.sender}:
            continue
        peer_waits = [w for w, sender in waits[:2] if sender != x.sender][:1]
        n_waiting = len(waiting) - (x.waiting == "c")
        if not n_waiting or not peer_waits or peer_waits[0] < threshold / 2:
            continue
        most = [c for c, sender in counts[-2:] if sender != x.sender][-1:]
        if x.waiting == "c" and not (x.since_init is not None and most
                                     and most[0] > x.since_init):
            continue  # in the same collective as the others: nobody to name
        where = x.where or (x.pos,)
        inside = "outside any collective" if x.waiting is None else (
            "still in an older collective (its peers completed it)")
        named.append(Stuck(x.host, x.pid, x.rank, still(x), threshold, n_waiting,
                           peer_waits[0], x.where, (
            f"process {x.pid} (rank {x.rank}): its main thread has not moved for "
            f"{still(x):.0f}s (at {'; '.join(where)}), {inside}, with no I/O, while "
            f"{n_waiting} peer process(es) waited in a collective (at least "
            f"{peer_waits[0]:.0f}s); stuck after {threshold:.0f}s")))
    return tuple(sorted(named, key=lambda k: (k.host, k.pid)))
