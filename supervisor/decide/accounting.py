"""PURE: the job's accounting after each pass: its training progress (progress.py), its
incidents (incidents.py) and whether the state is due to be saved for them.

The loop (loop.py) hands in what the pass decided and what it sees, keeps the result and
turns it into metrics, log lines and Events; it decides nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from supervisor.decide import incidents, progress, script
from supervisor.decide.beats import Beat, heartbeating
from supervisor.decide.hostlist import HostMode
from supervisor.observe import Obj

SAVE_EVERY_S = 10.0  # the progress is saved with the state at least this often while it runs


@dataclass(frozen=True)
class Accounted:
    progress: progress.Progress
    book: incidents.Book
    reached: tuple[tuple[incidents.Incident, str], ...]  # (incident, phase) reached now
    closed: tuple[incidents.Incident, ...]  # closed now
    save: bool  # the state is due to be saved (an incident moved on, or SAVE_EVERY_S passed)
    saved_at: float  # when the progress was last due to be saved (epoch seconds)


def account(before: progress.Progress, book: incidents.Book, todo: Sequence[object],
            beats: Iterable[Beat], pods: Mapping[str, Obj], *, desired: int, mode: HostMode,
            job: str, now: float, wall: float, saved_at: float) -> Accounted:
    """The progress and the incidents after a pass whose script is `todo` (memory.Pass.todo);
    `beats`: this run's heartbeats; `pods`: the view's; `desired`: the processes asked for;
    `saved_at`: the last `Accounted.saved_at`."""
    beats = tuple(beats)
    after = progress.observe(before, beats, desired=desired, now=now, wall=wall)
    opened = incidents.opened_in(todo)
    created = tuple((t.create.slot, t.create.name) for t in todo
                    if isinstance(t, script.CreateWorker))
    wanted = {n for o in opened for n in o.pods} | {
        r for x in book.incidents if x.open for r in x.replacements} | {n for _, n in created}
    seen = {n: incidents.pod_seen(pods[n], mode, job) for n in wanted if n in pods}
    joined = frozenset(b.host for b in beats if b.rank is not None
                       and heartbeating(b, now, progress.FRESH_S, inclusive=True))
    fenced = frozenset(h for t in todo if isinstance(t, script.Fence) for h in t.hosts)
    new_book, reached = incidents.advance(book, incidents.Tick(
        wall, opened, fenced, created, seen, joined, after))
    was_open = {x.id for x in book.incidents if x.open}
    known = {x.id for x in book.incidents}
    closed = tuple(x for x in new_book.incidents
                   if not x.open and (x.id in was_open or x.id not in known))
    due = after.at is not None and after.since is not None and wall - saved_at >= SAVE_EVERY_S
    save = bool(reached) or due
    return Accounted(after, new_book, tuple(reached), closed, save,
                     wall if save else saved_at)
