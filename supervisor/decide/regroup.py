"""PURE: after a failure, new workers are listed only once the survivors have regrouped.

When a worker fails, Horovod's driver regroups the survivors as soon as every worker of the old
world has reported (its barrier). A host that is in the discovery file at that moment joins the
new world, and the survivors wait in the rendezvous until its process has started (ssh, Python,
`import torch`, `hvd.init()`: 3-10 s): no batch is computed meanwhile. The supervisor creates a
replacement within milliseconds and it is often Ready before the survivors regroup, which was the
5.4 s worst case after a SIGKILL. So a host that would be added to the file is held back while a
regroup is pending: from the failure of a member of the training until a surviving process
reports a new `hvd.init()` and a completed collective after it (the hook's heartbeats), for at
most MAX_HOLD_S. The survivors resume at the smaller size at once and the new host joins right
after, through Horovod's host-added notification, at a commit point (no rollback). Nothing is
held when the survivors alone could not reach MIN_NP (the driver would wait for the new host),
when the driver's hook says the driver waits for hosts to assign the next world (whatever the
reason: Horovod's blacklist, a listing it has not read; held, the new host would keep the
survivors in `hvd.init` until MAX_HOLD_S ends),
or when no process heartbeats without a problem of its hook (no hook, or one that cannot see the
collectives, e.g. in a TensorFlow process: nothing would tell when to stop holding).
No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from supervisor.decide.beats import Beat, judged

MAX_HOLD_S = 15.0
# A listed host the driver's world has left out this long after its last assignment, while
# that world is below MAX_NP: Horovod missed it (see `missed`).
MISSED_AFTER_S = 8.0
# ... and this long while that world still holds a host no longer listed: its workers may still
# be leaving it (a graceful leave waits for the next commit: CI saw a Keras worker take 11.5 s);
# or while that world's workers wait in an init: they reset, and the driver assigns the next
# world once all of them have (make test on 2026-12-02: a Keras world took over 8 s).
MISSED_LEAVING_S = 24.0
# How long a missed host is taken out of the file: more than Horovod's 1 s discovery period.
REANNOUNCE_OUT_S = 2.5


@dataclass(frozen=True)
class Pending:
    """A regroup the survivors owe since `since` (monotonic); `inits`: each process's count of
    completed hvd.init() calls at that time."""

    since: float
    inits: Mapping[str, int]


def member_failed(hosts: Iterable[str], beats: Iterable[Beat],
                  world: frozenset[str] | None) -> bool:
    """Whether the survivors still owe a regroup for the failed hosts: one of them is in the
    world horovodrun's driver last assigned. A driver that already assigned a world without
    them has seen the failure first (the survivors' collective broke at once, on a SIGKILL
    often before the pod's status reached the supervisor): they regrouped or do so now, and
    holding new hosts back would only keep them out. With no word from the driver (None), a
    host heard from counts as a member (a replacement that never started makes nobody
    regroup)."""
    if world is not None:
        return any(h in world for h in hosts)
    heard = {b.host for b in beats}
    return any(h in heard for h in hosts)


def pending(beats: Iterable[Beat], now: float) -> Pending:
    """The regroup that a failure decided at `now` makes pending."""
    return Pending(now, {b.sender: b.inits for b in beats})


def regrouped(p: Pending, beats: Iterable[Beat]) -> bool:
    """Whether a process has initialised again since the failure and completed a collective."""
    return any(b.inits > p.inits.get(b.sender, 0) and b.progress_at is not None
               and b.progress_at > p.since and b.bye_at is None for b in beats)


def over(p: Pending, beats: Iterable[Beat], now: float, max_hold_s: float = MAX_HOLD_S, *,
         driver_waits: bool = False) -> bool:
    """Whether the regroup is no longer pending: done, given up on, nobody to tell (no
    process heartbeats whose hook reports no problem), or impossible without a new host (the
    driver said it waits for hosts to assign the next world: the survivors wait in `hvd.init`
    for it)."""
    beats = [b for b in beats if judged(b)]
    return driver_waits or now - p.since >= max_hold_s or not beats or regrouped(p, beats)


def held(p: Pending | None, beats: Iterable[Beat], *, listed: frozenset[str],
         usable: frozenset[str], slots_per_worker: int, min_np: int, now: float,
         max_hold_s: float = MAX_HOLD_S, driver_waits: bool = False) -> frozenset[str]:
    """The usable hosts to keep out of the discovery file for now: those not `listed` in it
    yet, while the regroup `p` is pending."""
    beats = list(beats)
    if p is None or over(p, beats, now, max_hold_s, driver_waits=driver_waits):
        return frozenset()
    new = usable - listed
    if len(usable - new) * slots_per_worker < min_np:
        return frozenset()
    return frozenset(new)


def missed(listed_since: Mapping[str, float], world: frozenset[str], world_at: float, *,
           listed: frozenset[str], slots_per_worker: int, max_np: int, now: float,
           resetting: bool = False, after_s: float = MISSED_AFTER_S) -> frozenset[str]:
    """Listed hosts Horovod missed: in the discovery file for `after_s`, yet left out of the
    world the driver last assigned `after_s` ago or more, while that world is below MAX_NP;
    MISSED_LEAVING_S instead of `after_s` while a host of that world is no longer `listed`, or
    while that world's workers are `resetting` (`in_an_init`).

    Horovod tells its workers about a new host once, when its discovery sees it appear; a host
    that appears while the workers reset (after a failure, two replacements ready a second
    apart) is told to processes that are in the rendezvous or not started, and is never
    taken in. Taking it out of the file for a moment and back makes Horovod see it appear
    again, now that the workers listen.

    A world with a host no longer listed is one the driver has yet to leave: its workers
    reset at their next commit, and the world after that takes the listed hosts in. A worker
    leaving gracefully may take longer than `after_s` to go (a Keras batch, a checkpoint; CI
    on 2026-11-30: 11.5 s), and taking the new host out then takes it out of the world being
    assigned (it exited 255 as the driver spawned it). That host's removal may also have
    reached the workers in a reset and been lost, like an arrival; then nothing else brings
    the world forward (make test the same evening: a tainted node's last worker trained on in
    a world with the new host left out, until its leave timed out at 60 s). So such a world
    gets MISSED_LEAVING_S, not never.

    Workers that wait in an init heard of the host and reset: the driver assigns the next
    world, with the host, once every one of them has, and a slow reset (a Keras worker on a
    loaded machine: over 8 s in make test on 2026-12-02) is no sign that Horovod missed it.
    Taking the host out then took it out of the world being assigned: its worker exited 255
    and was counted as a failure. Such a world gets MISSED_LEAVING_S too."""
    if resetting or not world <= listed:
        after_s = max(after_s, MISSED_LEAVING_S)
    if not world or now - world_at < after_s or len(world) * slots_per_worker >= max_np:
        return frozenset()
    return frozenset(h for h, since in listed_since.items()
                     if h not in world and now - since >= after_s)


def in_an_init(beats: Iterable[Beat], world: frozenset[str]) -> bool:
    """PURE: a training process on a host of `world` waits in an init (its last heartbeat):
    that world's workers are resetting (`missed`). Only beats the regroup reads (`judged`) of
    processes that did not say goodbye: one that ended in an init resets nothing."""
    return any(judged(b) and b.bye_at is None and b.host in world and b.waiting == "i"
               for b in beats)
