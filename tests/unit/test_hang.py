"""hang.assess: who blocks training, from the hook's heartbeats, on a fake clock.

Each scenario is a few processes as the supervisor's store holds them (beats.Beat: receipt
times of the last heartbeat and of the last growth of the completed-collectives counter) at
`now`; the whole Verdict is compared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from supervisor.decide.beats import Beat
from supervisor.decide.hang import (
    STUCK_AFTER_S,
    Broken,
    HangSettings,
    Hung,
    RendezvousStuck,
    Stall,
    Verdict,
    assess,
    run_progress,
)

S = HangSettings(silence_s=3.0, stall_s=600.0)
NOW = 1000.0
LISTED = {"10.0.0.1": 0.0, "10.0.0.2": 0.0, "10.0.0.3": 0.0}


def beat(host: str, *, last: float = NOW - 0.2, progress: float | None = NOW - 0.3,
         wait: float | None = None, kind: str | None = None, bye: float | None = None,
         pid: int = 100, rank: int = 0, problems: tuple[str, ...] = (),
         unfenced: str | None = None) -> Beat:
    return Beat(sender=f"{host}/{pid}", host=host, pid=pid, local_rank=0, first_seen=NOW - 60,
                last_seen=last, progress_at=progress, rank=rank, size=3, inits=1, done=10,
                wait_s=wait, waiting=kind if wait is not None else None, bye_at=bye,
                problems=problems, unfenced=unfenced)


def waiting(host: str, seconds: float, **kw: object) -> Beat:
    """A healthy process inside a collective for `seconds`, nothing completed since then."""
    fields: dict[str, object] = {"wait": seconds, "kind": "c", "progress": NOW - seconds - 0.3,
                                 **kw}
    return beat(host, **fields)  # type: ignore[arg-type]


FROZEN_AT = NOW - 3.4  # its last heartbeat


def frozen(host: str = "10.0.0.3", **kw: object) -> Beat:
    """A process whose heartbeats stopped 3.4 s ago."""
    fields: dict[str, object] = {"last": FROZEN_AT, "progress": FROZEN_AT - 0.2, "pid": 7,
                                 "rank": 2, **kw}
    return beat(host, **fields)  # type: ignore[arg-type]


def hung(host: str = "10.0.0.3", peers: int = 2, longest: float = 3.0,
         where: str = "a collective") -> Hung:
    return Hung(host, 7, pytest.approx(3.4), (  # type: ignore[arg-type]
        f"process 7 (rank 2) sent no heartbeat for 3.4s while {peers} peer process(es) waited "
        f"in {where} (longest {longest:.1f}s at its last heartbeat) and none completed one "
        "since"))


@pytest.mark.parametrize(("beats", "expected"), [
    pytest.param([beat("10.0.0.1"), beat("10.0.0.2"), beat("10.0.0.3")], Verdict(),
                 id="everyone heartbeats and progresses: nothing"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9), frozen()],
                 Verdict(hung=(hung(),)),
                 id="one silent while the others wait and nothing completes: Hung"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9),
                  frozen(last=NOW - 2.9)], Verdict(),
                 id="silent for less than the threshold: not yet"),
    pytest.param([waiting("10.0.0.1", 3.0), beat("10.0.0.2", progress=NOW - 3.6), frozen()],
                 Verdict(hung=(hung(peers=1),)),
                 id="one peer waiting is enough (another is busy between collectives)"),
    pytest.param([beat("10.0.0.1"), beat("10.0.0.2"), frozen()], Verdict(),
                 id="silent but nobody waits: it blocks nothing"),
    pytest.param([waiting("10.0.0.1", 1.0, progress=NOW - 1.0), waiting("10.0.0.2", 0.5),
                  frozen()], Verdict(),
                 id="silent but the others completed collectives since: a lost heartbeat route"),
    # The soak of 2026-12-02 (seed 12): one of three workers partitioned; the last heartbeat
    # of a peer that showed a collective completed came 1.05 s after the silent one's last
    # (it trained on until the cut, and its peers said so up to a period later, on a loaded
    # machine). With two periods of slack (1 s) nothing was ever said, and the job hung.
    pytest.param([waiting("10.0.0.1", 2.6, progress=FROZEN_AT + 1.05),
                  waiting("10.0.0.2", 2.6, progress=FROZEN_AT + 0.9), frozen()],
                 Verdict(hung=(hung(longest=2.6),)),
                 id="its peers' last collective seen 1.05s after its last heartbeat: Hung"),
    pytest.param([waiting("10.0.0.1", 1.2, progress=FROZEN_AT + 2.1),
                  waiting("10.0.0.2", 1.2, progress=FROZEN_AT + 2.1), frozen()], Verdict(),
                 id="its peers completed one 2.1s after its last heartbeat: not blocked by it"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9),
                  frozen(progress=None)], Verdict(hung=(hung(),)),
                 id="never progressed itself (frozen after its first init): Hung"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9),
                  frozen(bye=FROZEN_AT)], Verdict(),
                 id="it said bye (a clean exit): never Hung"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9), frozen(host="10.0.0.9")],
                 Verdict(), id="its host is not listed (scaled in, already failed): skip"),
    pytest.param([waiting("10.0.0.1", 3.0), waiting("10.0.0.2", 2.9),
                  frozen(problems=("Horovod 0.27.0 is not 0.28.x: not patched",))],
                 Verdict(problems=(("10.0.0.3", "Horovod 0.27.0 is not 0.28.x: not patched"),)),
                 id="a process whose hook reported a problem is not judged, it is reported"),
    pytest.param([replace(beat(h, progress=None, unfenced="horovod.mxnet"), first_seen=NOW - 700)
                  for h in ("10.0.0.1", "10.0.0.2")],
                 Verdict(unfenced=(("10.0.0.1", "horovod.mxnet"),
                                   ("10.0.0.2", "horovod.mxnet"))),
                 id="TensorFlow processes heartbeat, never progress: reported apart, no stall"),
    pytest.param([beat("10.0.0.1", wait=500.0, kind="c", progress=NOW - 700),
                  beat("10.0.0.2", progress=NOW - 700),
                  replace(beat("10.0.0.3", progress=None, unfenced="horovod.mxnet"),
                          first_seen=NOW - 5)],
                 Verdict(stall=Stall(700.0, 2), unfenced=(("10.0.0.3", "horovod.mxnet"),)),
                 id="an unfenced process that just started does not hide the others' stall"),
    pytest.param([waiting("10.0.0.1", 5.0), frozen(host="10.0.0.2"), frozen()],
                 Verdict(hung=(hung("10.0.0.2", peers=1, longest=5.0),
                               hung("10.0.0.3", peers=1, longest=5.0))),
                 id="two frozen at once: both Hung"),
    pytest.param([beat("10.0.0.1", wait=2.0, kind="i", progress=None),
                  beat("10.0.0.2", wait=1.8, kind="i", progress=None), frozen(progress=None)],
                 Verdict(hung=(hung(longest=2.0, where="an init"),)),
                 id="frozen while the others wait in the rendezvous of a reset: Hung"),
    pytest.param([beat("10.0.0.1", wait=500.0, kind="c", progress=NOW - 700),
                  beat("10.0.0.2", progress=NOW - 700), beat("10.0.0.3", progress=NOW - 700)],
                 Verdict(stall=Stall(700.0, 3)),
                 id="all heartbeat, nothing completes for the stall timeout: stalled"),
    pytest.param([beat("10.0.0.1", wait=120.0, kind="c", progress=NOW - 120),
                  beat("10.0.0.2", wait=119.0, kind="c", progress=NOW - 120),
                  beat("10.0.0.3", progress=NOW - 120)], Verdict(),
                 id="a 2-minute checkpoint on rank 2 while the others wait: neither"),
    pytest.param([beat("10.0.0.1", last=NOW - 900, progress=NOW - 950),
                  beat("10.0.0.2", last=NOW - 900, progress=NOW - 950)], Verdict(),
                 id="nobody heartbeats any more: no evidence of a stall"),
])
def test_assess(beats: list[Beat], expected: Verdict) -> None:
    assert assess(beats, LISTED, started_at=NOW - 30, settings=S, now=NOW) == expected


def watched_as(state: str | None, *, seen: float = NOW - 0.3, cpu_at: float | None = None,
               silent_for: float = 3.4) -> Beat:
    """A process silent for `silent_for` whose watcher said `state` at `seen` (None: no
    watcher), its CPU time last growing at `cpu_at`."""
    return replace(frozen(last=NOW - silent_for, progress=NOW - silent_for - 0.2),
                   proc_state=state, proc_seen=None if state is None else seen, proc_cpu=500,
                   proc_cpu_at=cpu_at)


@pytest.mark.parametrize(("silent", "hung_after"), [
    pytest.param(watched_as("R"), None,
                 id="silent, its watcher says it runs (the GIL held by a GC pass): not yet"),
    pytest.param(watched_as("S", cpu_at=NOW - 1.0), None,
                 id="sleeping between samples but its CPU time grows: runs, not yet"),
    pytest.param(watched_as("R", silent_for=20.5), "though its process ran (state R) for "
                 "longer than 20s", id="silent and running past the stuck threshold: Hung"),
    pytest.param(watched_as("T"), "", id="its watcher says it is stopped (SIGSTOP): Hung"),
    pytest.param(watched_as("t"), "", id="stopped by a tracer: Hung"),
    pytest.param(watched_as("S", cpu_at=NOW - 10), "",
                 id="asleep with no CPU (a deadlock with the GIL held): Hung"),
    pytest.param(watched_as("D", cpu_at=None), "", id="in uninterruptible I/O, no CPU: Hung"),
    pytest.param(watched_as("R", seen=NOW - 3.1), "",
                 id="its watcher fell silent too (a frozen node, a partition): Hung"),
    pytest.param(watched_as(None), "", id="no watcher (an older hook): its silence alone"),
])
def test_a_silent_process_gets_a_second_signal_from_its_watcher(
        silent: Beat, hung_after: str | None) -> None:
    beats = [waiting("10.0.0.1", 25.0), waiting("10.0.0.2", 24.0), silent]
    verdict = assess(beats, LISTED, started_at=NOW - 30, settings=S, now=NOW)
    if hung_after is None:
        assert verdict.hung == ()
        assert verdict.busy == (("10.0.0.3", 7, pytest.approx(3.4), silent.proc_state),)
    else:
        (h,) = verdict.hung
        assert h.host == "10.0.0.3" and f"no heartbeat for {NOW - silent.last_seen:.1f}s" \
            f"{' ' + hung_after if hung_after else ''} while" in h.detail, h.detail


def test_listed_hosts_without_a_heartbeat_are_reported_after_a_minute() -> None:
    beats = [beat("10.0.0.1")]
    listed = {"10.0.0.1": NOW - 100, "10.0.0.2": NOW - 100, "10.0.0.3": NOW - 10}
    early = assess(beats, listed, started_at=NOW - 30, settings=S, now=NOW)
    assert early.unmonitored == (), "horovodrun started 30 s ago: too early to say"
    late = assess(beats, listed, started_at=NOW - 100, settings=S, now=NOW)
    assert late.unmonitored == ("10.0.0.2",), "10.0.0.3 was listed only 10 s ago"


@pytest.mark.parametrize(("first_seen", "expected"), [
    pytest.param(NOW - 60, None, id="heartbeating for a minute: not yet"),
    pytest.param(NOW - 700, Stall(700.0, 1), id="heartbeating for 700 s: stalled"),
])
def test_with_no_progress_ever_a_stall_counts_from_the_first_heartbeat(
        first_seen: float, expected: Stall | None) -> None:
    beats = [replace(beat("10.0.0.1", progress=None, wait=650.0, kind="c"),
                     first_seen=first_seen)]
    verdict = assess(beats, LISTED, started_at=NOW - 800, settings=S, now=NOW)
    assert verdict.stall == expected


FAILED = NOW - 6.0  # the member that died
WORLD = (frozenset({"10.0.0.1", "10.0.0.3"}), NOW - 10.0)  # assigned before it died


@pytest.mark.parametrize(("beats", "failed_at", "world", "expected"), [
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)], {"10.0.0.3": FAILED},
                 WORLD, Broken("10.0.0.3", 1),
                 id="a member died while the others wait in its rendezvous: broken"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)],
                 {"10.0.0.3": NOW - 3.0}, WORLD, None,
                 id="not for BROKEN_AFTER_S yet: the driver may still assign a new world"),
    pytest.param([beat("10.0.0.1", wait=5.0, kind="i", progress=None)], {"10.0.0.3": FAILED},
                 (frozenset({"10.0.0.1"}), NOW - 5.5), None,
                 id="the driver assigned a world without it since: a normal reset"),
    pytest.param([beat("10.0.0.1", wait=0.2, kind="c")], {"10.0.0.3": FAILED}, WORLD, None,
                 id="nobody waits in an init: a failure in training, the survivors reset"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)], {"10.0.0.2": FAILED},
                 WORLD, None, id="the failed host was not a member of the world"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)], {"10.0.0.3": FAILED},
                 None, None, id="no word from the driver hook: not judged"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)],
                 {"10.0.0.3": NOW - 7.0}, (WORLD[0], NOW - 6.5), Broken("10.0.0.3", 1),
                 id="it failed 0.5 s before the assignment (the driver's view lags): broken"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None)],
                 {"10.0.0.3": NOW - 7.0}, (WORLD[0], NOW - 3.0), None,
                 id="failed before an assignment of 3 s ago: not for BROKEN_AFTER_S yet"),
    # Seen on real nodes (bench e2e_sequences): a worker SIGKILLed while a world of three
    # trained; one survivor waited in its init, the other (rank 0) was still on its way there 6 s
    # later, and horovodrun was restarted for nothing (the driver's barrier waited for rank 0).
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None),
                  beat("10.0.0.2", wait=None, kind=None, progress=None)], {"10.0.0.3": FAILED},
                 (WORLD[0] | {"10.0.0.2"}, WORLD[1]), None,
                 id="another member is not in its init yet (a slow reset): not broken"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None),
                  beat("10.0.0.2", wait=7.0, kind="i", progress=None)], {"10.0.0.3": FAILED},
                 (WORLD[0] | {"10.0.0.2"}, WORLD[1]), Broken("10.0.0.3", 2),
                 id="every other member waits in its init: broken"),
    pytest.param([beat("10.0.0.1", wait=8.0, kind="i", progress=None),
                  beat("10.0.0.2", wait=0.2, kind="c")], {"10.0.0.3": FAILED}, WORLD,
                 Broken("10.0.0.3", 1),
                 id="a process of a host outside the world does not hold it up"),
])
def test_a_rendezvous_broken_by_a_dead_member(beats: list[Beat], failed_at: dict[str, float],
                                              world: Any, expected: Broken | None) -> None:
    verdict = assess(beats, LISTED, started_at=NOW - 30, settings=S, now=NOW,
                     failed_at=failed_at, world=world)
    assert verdict.broken == expected


# The soak's 65 s stall: horovodrun restarted, the driver assigned {.1, .2}; .3, a replacement
# just listed and never a member, was evicted; both members waited in their init until Gloo's
# timeout. A host failed after the assignment, every member is there and waits: stuck.
PAIR = (frozenset({"10.0.0.1", "10.0.0.2"}), NOW - 30.0)
EVICTED = {"10.0.0.3": NOW - 25.0}


def init_wait(host: str, seconds: float, **kw: object) -> Beat:
    fields: dict[str, object] = {"wait": seconds, "kind": "i", "progress": None, **kw}
    return beat(host, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("beats", "failed_at", "world", "expected"), [
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)], EVICTED, PAIR,
                 RendezvousStuck("10.0.0.3", 2, pytest.approx(23.2)),
                 id="the soak's stall: members all waiting in init after a failure: stuck"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 14.0)], EVICTED, PAIR,
                 None, id="one member has waited less than STUCK_AFTER_S: not yet"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)], {}, PAIR, None,
                 id="nothing failed: a slow init of a large world is never stuck"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)],
                 {"10.0.0.3": NOW - 35.0}, PAIR, None,
                 id="the failure came before the assignment: the driver knew of it"),
    pytest.param([init_wait("10.0.0.1", 24.0)], EVICTED, PAIR, None,
                 id="a member has no process yet (still starting): waiting for it is normal"),
    pytest.param([init_wait("10.0.0.1", 24.0), waiting("10.0.0.2", 23.0)], EVICTED, PAIR,
                 None, id="a member is in a collective, not in an init: not this rule"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0),
                  init_wait("10.0.0.2", 2.0, pid=101)], EVICTED, PAIR, None,
                 id="one process of a member host joined 2 s ago: not yet"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0, last=NOW - 3.5)],
                 EVICTED, PAIR, None,
                 id="a member's process fell silent: hung or dead, not stuck"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)], EVICTED,
                 (PAIR[0], NOW - 10.0), None,
                 id="the world was assigned less than STUCK_AFTER_S ago"),
    pytest.param([init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)], EVICTED, None,
                 None, id="no word from the driver hook: not judged"),
])
def test_a_rendezvous_stuck_with_every_member_present(
        beats: list[Beat], failed_at: dict[str, float], world: Any,
        expected: RendezvousStuck | None) -> None:
    verdict = assess(beats, LISTED, started_at=NOW - 40, settings=S, now=NOW,
                     failed_at=failed_at, world=world)
    assert verdict.rendezvous_stuck == expected
    assert verdict.broken is None
    assert STUCK_AFTER_S == 15.0, "the table's waits are chosen around 15 s"


def test_a_broken_rendezvous_is_not_also_stuck() -> None:
    """A failed member and others waiting: `broken` (after 5 s) says it, not `stuck` too."""
    world = (frozenset({"10.0.0.1", "10.0.0.2", "10.0.0.3"}), NOW - 30.0)
    beats = [init_wait("10.0.0.1", 24.0), init_wait("10.0.0.2", 23.0)]
    verdict = assess(beats, LISTED, started_at=NOW - 40, settings=S, now=NOW,
                     failed_at=EVICTED, world=world)
    assert verdict.broken == Broken("10.0.0.3", 2)
    assert verdict.rendezvous_stuck is None


@pytest.mark.parametrize(("beats", "started", "expected"), [
    ([], NOW - 30, (30.0, 0)),  # no process heartbeats yet: nothing trained
    ([replace(beat("10.0.0.1"), done=500), replace(beat("10.0.0.2", pid=7), done=120)],
     NOW - 312.5, (312.5, 500)),  # a replacement joined late: the oldest process counts
    ([beat("10.0.0.1")], NOW + 5, (0.0, 10)),  # a clock read before the start: never negative
])
def test_what_a_restart_throws_away(beats: list[Beat], started: float,
                                    expected: tuple[float, int]) -> None:
    assert run_progress(beats, started, NOW) == expected


# Item 1 of issue 40, from a fresh `make demo`: rank 0 printed steps every ~40 ms until a
# second after its last heartbeat (it was late, not frozen), and was declared Hung at 3.0 s of
# silence while its only waiting peer said, at its last heartbeat, that it had just entered its
# collective ("longest 0.0s"). Its peers' own wait must cover most of the silence first.
LATE_AT = NOW - 3.0  # rank 0's last heartbeat; it ran (and its peer completed) until +0.95 s


def late(**kw: object) -> Beat:
    fields: dict[str, object] = {"last": LATE_AT, "progress": LATE_AT, "pid": 7, "rank": 0,
                                 **kw}
    return beat("10.0.0.3", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("peer", "silent", "hung_at"), [
    pytest.param(beat("10.0.0.1", last=NOW - 0.4, wait=0.0, kind="c", progress=LATE_AT + 0.95),
                 late(), None,
                 id="the demo: silent 3.0 s, its peer waited 0.0 s: not Hung, unconfirmed"),
    pytest.param(beat("10.0.0.1", last=NOW - 2.1, wait=0.0, kind="c", progress=LATE_AT + 0.9),
                 late(), None,
                 id="the peer's own heartbeat late too, at 0.0 s: not Hung"),
    pytest.param(beat("10.0.0.1", last=NOW - 0.3, wait=1.9, kind="c", progress=LATE_AT + 0.8),
                 late(), None,
                 id="a peer waited 1.9 s, under cover_s (2.0 s): not yet"),
    pytest.param(beat("10.0.0.1", last=NOW - 0.5, wait=2.0, kind="c", progress=LATE_AT + 0.5),
                 late(), 3.0,
                 id="frozen just before its next heartbeat: its peer waited 2.0 s at 3.0 s: Hung"),
    pytest.param(beat("10.0.0.1", last=NOW - 0.1, wait=2.8, kind="c", progress=LATE_AT),
                 late(), 3.0,
                 id="frozen right after its heartbeat: its peer waited 2.8 s: Hung at 3.0 s"),
    pytest.param(beat("10.0.0.1", last=NOW - 0.1, wait=2.1, kind="i", progress=None),
                 late(progress=None), 3.0,
                 id="frozen in a reset: its peer waited 2.1 s in the init: Hung at 3.0 s"),
])
def test_a_peer_must_have_waited_through_most_of_the_silence(
        peer: Beat, silent: Beat, hung_at: float | None) -> None:
    verdict = assess([peer, silent], LISTED, started_at=NOW - 30, settings=S, now=NOW)
    if hung_at is None:
        assert verdict.hung == ()
        assert verdict.unconfirmed == (("10.0.0.3", 7, pytest.approx(3.0),
                                        pytest.approx(peer.wait_s)),)
    else:
        (h,) = verdict.hung
        assert (h.host, h.silent_s, verdict.unconfirmed) == (
            "10.0.0.3", pytest.approx(hung_at), ())


def test_an_unconfirmed_silence_becomes_Hung_when_the_peer_has_waited_long_enough() -> None:
    """The demo's shape, had rank 0 frozen after all: its peer's wait grows with the time, and
    the evidence comes 2 s later (the peer then says 2.0 s): Hung at 5.0 s of silence."""
    later = NOW + 2.0
    peer = beat("10.0.0.1", last=later - 0.4, wait=2.0, kind="c", progress=LATE_AT + 0.95)
    verdict = assess([peer, late()], LISTED, started_at=NOW - 30, settings=S, now=later)
    assert [(h.host, round(h.silent_s, 1)) for h in verdict.hung] == [("10.0.0.3", 5.0)]


# Item 3 of issue 40, on real nodes: es-node-1 froze while it held rank 0 (10.0.0.1) and rank 1
# (10.0.0.2); rank 2 (10.0.0.3, es-node-2) waited. Rank 1 was declared at 3.0 s; rank 0, whose
# last heartbeat came 0.3 s later and whose watcher had last said "R" 2.8 s before, got
# worker.silent_but_running and was declared 1.3 s later, after the survivors' reset: the
# rendezvous broke. Both fell silent together: one incident, one verdict.
ON = {"10.0.0.1": "es-node-1", "10.0.0.2": "es-node-1", "10.0.0.3": "es-node-2"}
FREEZE = NOW - 3.0  # rank 1's last heartbeat


def on_frozen_node(host: str, last: float, *, watcher: float | None, state: str = "R",
                   pid: int = 7, rank: int = 1) -> Beat:
    """A process of the frozen node: its last heartbeat at `last`, its watcher's at
    `watcher` (None: no watcher), saying `state`."""
    return replace(beat(host, last=last, progress=last - 0.1, pid=pid, rank=rank),
                   proc_state=None if watcher is None else state, proc_seen=watcher,
                   proc_cpu=900, proc_cpu_at=watcher)


RANK1 = on_frozen_node("10.0.0.2", FREEZE, watcher=FREEZE - 0.1)
RANK0 = on_frozen_node("10.0.0.1", FREEZE + 0.3, watcher=FREEZE + 0.2, pid=6, rank=0)
RANK2 = waiting("10.0.0.3", 2.6, pid=8, rank=2)


@pytest.mark.parametrize(("beats", "nodes", "expected"), [
    pytest.param([RANK0, RANK1, RANK2], ON, [("10.0.0.1", None), ("10.0.0.2", None)],
                 id="the frozen node: rank 0 (silent 2.7 s, its watcher's last word R) is "
                    "Hung with rank 1, in one verdict"),
    pytest.param([RANK0, RANK1, RANK2], None, [("10.0.0.2", None)],
                 id="nodes unknown: each on its own evidence"),
    pytest.param([RANK0, RANK1, RANK2], {**ON, "10.0.0.1": "es-node-3"}, [("10.0.0.2", None)],
                 id="silent at the same time on another node: not the same incident"),
    pytest.param([replace(RANK0, last_seen=NOW - 0.2), RANK1, RANK2], ON, [("10.0.0.2", None)],
                 id="its neighbour heartbeats: not silent, not taken"),
    pytest.param([replace(RANK0, proc_seen=NOW - 0.2), RANK1, RANK2], ON, [("10.0.0.2", None)],
                 id="its neighbour's watcher still speaks (a GC pass, not a frozen node)"),
    pytest.param([RANK0, replace(RANK1, proc_state="T", proc_seen=NOW - 0.2), RANK2], ON,
                 [("10.0.0.2", None)],
                 id="the Hung one's watcher still speaks (SIGSTOP of one process): alone"),
    pytest.param([replace(RANK0, last_seen=FREEZE + 1.5, proc_seen=FREEZE + 1.5), RANK1,
                  RANK2], ON, [("10.0.0.2", None)],
                 id="fell silent 1.5 s later: not together"),
    pytest.param([on_frozen_node("10.0.0.1", FREEZE + 0.4, watcher=None, pid=6, rank=0),
                  on_frozen_node("10.0.0.2", FREEZE, watcher=None), RANK2], ON,
                 [("10.0.0.1", None), ("10.0.0.2", None)],
                 id="no watchers (an older hook): the heartbeats alone, 0.4 s apart"),
])
def test_the_processes_of_a_node_that_fell_silent_together_are_hung_together(
        beats: list[Beat], nodes: dict[str, str] | None,
        expected: list[tuple[str, None]]) -> None:
    verdict = assess(beats, LISTED, started_at=NOW - 30, settings=S, now=NOW, nodes=nodes)
    assert [(h.host, None) for h in verdict.hung] == expected
    lead = [h for h in verdict.hung if h.along is None]
    assert [h.host for h in lead] == ["10.0.0.2"], "rank 1 is found on its own evidence"
    along = [h for h in verdict.hung if h.along is not None]
    assert all(h.along == "10.0.0.2" and "on the same node es-node-1" in h.detail
               for h in along), along
    assert "10.0.0.1" not in {b[0] for b in verdict.busy} or not along


def test_without_the_group_rank_0_would_be_declared_only_later() -> None:
    """Today's order, the cause of the broken rendezvous: alone, rank 0 is busy (its
    watcher's R is younger than silence_s) and is declared only once that R is stale."""
    alone = assess([RANK0, RANK1, RANK2], LISTED, started_at=NOW - 30, settings=S, now=NOW)
    assert [b[0] for b in alone.busy] == [] and [h.host for h in alone.hung] == ["10.0.0.2"]
    later = assess([RANK0, RANK1, replace(RANK2, wait_s=3.9)], LISTED, started_at=NOW - 30,
                   settings=S, now=NOW + 1.3)
    assert [h.host for h in later.hung] == ["10.0.0.1", "10.0.0.2"]
