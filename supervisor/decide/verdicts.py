"""PURE: what the hook's heartbeats and the driver revealed (hang.Verdict), turned into failures
(Hung, stuck, the driver's exits: out of the host list for good) and restarts of horovodrun
(a stall, a broken or stuck rendezvous). core.manage calls `on_verdict` once a pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.decide import hang
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.plan import Note
from supervisor.model import EventSpec
from supervisor.observe import Obj

EXITED_GRACE_S = 2.0  # a process the driver saw fail: the pod's own status may say it first


@dataclass(frozen=True)
class Detected:
    """Failures found by the hook (found at `now`, out of the discovery file for good) and
    whether horovodrun must restart: (the Event's reason, why)."""

    failures: tuple[tuple[Failure, Obj], ...] = ()
    notes: tuple[Note, ...] = ()
    restart: tuple[str, str] | None = None


def on_verdict(verdict: hang.Verdict, listed: Mapping[str, str], pods: Mapping[str, Obj],
               failed: frozenset[str], exited: Mapping[str, tuple[int, float]], *,
               stall_timeout_s: float, now: float) -> Detected:
    """Turn hang.assess's verdict into failures of the usual path (a hung worker, or one whose
    main thread is stuck: Hung, with the verdict's detail) and a
    restart of horovodrun (a broken or stuck rendezvous, a stalled job); a worker whose
    training process horovodrun saw fail while its pod runs on (an OOM kill of the process, a
    crash, a `pkill`) is useless too, Horovod never uses its host again: after EXITED_GRACE_S
    (the pod's own status wins if it shows the container ended) it is an ExitCode failure with
    the code the driver saw. `listed`: host -> pod name of the published hosts; `failed`: UIDs
    already failed; `exited`: the driver's reports (empty while the job stops)."""
    failures: list[tuple[Failure, Obj]] = []
    notes: list[Note] = []
    seen = set(failed)
    declared: dict[str, tuple[str, str | None]] = {}

    def claim(host: str, at: float | None = None) -> tuple[str, Obj, str | None] | None:
        """The listed pod of `host` (name, pod, node), unless it failed already or its
        report is younger than EXITED_GRACE_S (at: when it came)."""
        name = listed.get(host)
        pod = pods.get(name) if name else None
        if pod is None or name is None or (at is not None and now - at < EXITED_GRACE_S):
            return None
        uid = pod["metadata"].get("uid", "")
        if uid in seen:
            return None
        seen.add(uid)
        return name, pod, pod.get("spec", {}).get("nodeName")

    for found in (*verdict.hung, *verdict.stuck):
        if (c := claim(found.host)) is None:
            continue
        name, pod, node = c
        failures.append((Failure(Cause.HUNG, name, pod["metadata"].get("uid", ""), node,
                                 detail=found.detail), pod))
        notes.append(_hang_note(found, name, node))
        if isinstance(found, hang.Hung):
            declared[found.host] = (name, node)
    notes += _together_notes(verdict.hung, declared)
    for host, (code, at) in exited.items():
        if (c := claim(host, at)) is None:
            continue
        name, pod, node = c
        uid = pod["metadata"].get("uid", "")
        detail = (f"its training process on {host} exited with {code} (seen by horovodrun; "
                  "the pod still runs, and Horovod does not use this host again)")
        failures.append((Failure(Cause.EXIT_CODE, name, uid, node, exit_code=code,
                                 detail=detail), pod))
        notes.append(Note("warning", "worker.process_exited", {
            "pod": name, "host": host, "exit_code": code}, EventSpec(
            "Warning", "WorkerProcessExited", "Detect", f"worker {name} ({host}): {detail}")))
    return Detected(tuple(failures), tuple(notes), _restart(verdict, stall_timeout_s))


def _together_notes(hung: tuple[hang.Hung, ...],
                    declared: Mapping[str, tuple[str, str | None]]) -> list[Note]:
    """One `workers.hung_together` per group of silent workers declared together (one dead
    set, one reset: hang.py); `declared`: host -> (pod, node) of the Hung workers failed now."""
    groups: dict[str, list[str]] = {}
    for h in hung:
        if h.along is not None and h.host in declared and h.along in declared:
            groups.setdefault(h.along, [h.along]).append(h.host)
    out = []
    for hosts in groups.values():
        pods = sorted(declared[x][0] for x in hosts)
        node = declared[hosts[0]][1]
        out.append(Note("warning", "workers.hung_together", {
            "node": node, "pods": pods, "hosts": sorted(hosts)}, EventSpec(
            "Warning", "WorkersHungTogether", "Detect",
            f"{len(pods)} workers on node {node} ({', '.join(pods)}) fell silent together: "
            "declared Hung together, fenced in one dead set (one reset of the survivors)")))
    return out


def _hang_note(found: hang.Hung | hang.Stuck, name: str, node: str | None) -> Note:
    """The log line and Event of a worker found Hung (silent) or Stuck (its main thread)."""
    if isinstance(found, hang.Hung):
        return Note("warning", "worker.hung", {
            "pod": name, "host": found.host, "pid": found.pid,
            "silent_s": round(found.silent_s, 2), "detail": found.detail,
            **({"along": found.along} if found.along else {})}, EventSpec(
            "Warning", "WorkerHung", "Detect", f"worker {name} ({found.host}): {found.detail}"))
    return Note("warning", "worker.stuck", {
        "pod": name, "host": found.host, "node": node, "pid": found.pid, "rank": found.rank,
        "still_s": round(found.still_s, 1), "threshold_s": round(found.threshold_s, 1),
        "where": list(found.where), "waiting": found.waiting,
        "waited_s": round(found.waited_s, 1)}, EventSpec(
        "Warning", "WorkerStuck", "Detect",
        f"worker {name} ({found.host}, node {node}): {found.detail}"))


def _restart(verdict: hang.Verdict, stall_timeout_s: float) -> tuple[str, str] | None:
    if (b := verdict.broken) is not None:
        return "RendezvousBroken", (
            f"worker {b.host} failed while {b.waiting} training process(es) waited for it in "
            "the rendezvous of horovodrun's world: Horovod 0.28 cannot finish that rendezvous "
            "(they would abort at the Gloo timeout)")
    if (k := verdict.rendezvous_stuck) is not None:
        return "RendezvousStuck", (
            f"all {k.members} host(s) of horovodrun's world waited in its rendezvous for "
            f"{k.waited_s:.0f}s after worker {k.host} failed, with no new world assigned: it "
            "does not form (they would abort at the Gloo timeout)")
    if (stall := verdict.stall) is not None:
        return "TrainingStalled", (
            f"no collective completed for {stall.since_s:.0f}s while {stall.alive} training "
            f"process(es) heartbeat (SUPERVISOR_STALL_TIMEOUT_SECONDS={stall_timeout_s:g})")
    return None
