"""PURE: what `status` shows and what `scale` asks for, from API-shaped dicts.

`status` reads only the cluster (worker pods, the supervisor's state ConfigMap, its Events), never
the launcher's memory, so it works from a laptop with a kubeconfig. `scale` records the desired
worker count in the job's scale ConfigMap; the running supervisor watches it and applies it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.observe import Obj, condition
from supervisor.workers import LABEL_INCARNATION, LABEL_SLOT

TERMINAL = ("Succeeded", "Failed")


class ScaleError(Exception):
    """A scale request that cannot be recorded; the message says why and what is allowed."""


def target_workers(current: int, *, workers: int | None = None, add: int | None = None,
                   remove: int | None = None) -> int:
    """Return the worker count asked for by exactly one of --workers / --add / --remove."""
    given = [v for v in (workers, add, remove) if v is not None]
    if len(given) != 1:
        raise ScaleError("give exactly one of --workers N, --add K, --remove K")
    if workers is not None:
        return workers
    if add is not None:
        if add < 1:
            raise ScaleError(f"--add {add}: expected K >= 1")
        return current + add
    assert remove is not None
    if remove < 1:
        raise ScaleError(f"--remove {remove}: expected K >= 1")
    return current - remove


def check_range(want: int, limits: Mapping[str, int]) -> None:
    lo, hi = limits["minWorkers"], limits["maxWorkers"]
    if not lo <= want <= hi:
        raise ScaleError(f"{want} workers is outside [{lo}, {hi}] (the job's MIN_NP / MAX_NP "
                         "divided by SLOTS_PER_WORKER); refused")


def _container_restarts(pod: Obj) -> int:
    return sum(int(c.get("restartCount") or 0)
               for c in pod.get("status", {}).get("containerStatuses") or ())


def _state_of(pod: Obj) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for c in pod.get("status", {}).get("containerStatuses") or ():
        term = (c.get("state") or {}).get("terminated")
        if term:
            return f"exited {term.get('exitCode')}"
    return pod.get("status", {}).get("phase") or "Pending"


def status(job: str, namespace: str, *, pods: Iterable[Obj], state: Mapping[str, Any] | None,
           scale: Mapping[str, Any] | None, events: Iterable[Obj],
           last: int = 10) -> dict[str, Any]:
    """Return the job's status as JSON-ready data."""
    workers = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        labels = pod["metadata"].get("labels") or {}
        ready = condition(pod, "Ready")
        workers.append({
            "pod": pod["metadata"]["name"],
            "slot": int(labels[LABEL_SLOT]) if labels.get(LABEL_SLOT, "").isdigit() else None,
            "incarnation": int(labels[LABEL_INCARNATION])
            if labels.get(LABEL_INCARNATION, "").isdigit() else None,
            "host": pod.get("status", {}).get("podIP"),
            "node": pod.get("spec", {}).get("nodeName"),
            "phase": pod.get("status", {}).get("phase") or "Pending",
            "state": _state_of(pod),
            "ready": bool(ready and ready.get("status") == "True"),
            "containerRestarts": _container_restarts(pod),
        })
    live = [w for w in workers if w["phase"] not in TERMINAL and w["state"] != "Terminating"]
    ledger = (state or {}).get("ledger") or {}
    used, limit = ledger.get("total", 0), (state or {}).get("restartLimit")
    decisions = sorted(
        (e for e in events if e.get("reportingController") == "elastic-supervisor.io/supervisor"),
        key=_last_seen)[-last:]
    return {
        "job": job, "namespace": namespace,
        "desired": (state or {}).get("desiredWorkers"),
        "requested": (scale or {}).get("workers"),
        "live": len(live), "listed": len(workers),
        "restarts": {"used": used, "limit": limit,
                     "left": None if limit is None else max(0, limit - used)},
        "workers": workers,
        "quarantined": dict((state or {}).get("quarantined") or {}),
        "slow": list((state or {}).get("slow") or []),
        "progress": {k: v for k, v in ((state or {}).get("progress") or {}).items()
                     if k != "history"} or None,
        "incidents": list((state or {}).get("incidents") or [])[-last:],
        "decisions": [{"time": _last_seen(e), "type": e.get("type"),
                       "reason": e.get("reason"), "note": e.get("note"),
                       "count": (e.get("series") or {}).get("count", 1)} for e in decisions],
    }


def _last_seen(event: Mapping[str, Any]) -> str:
    """When an Event was last observed: its series' last time, else its own."""
    return str((event.get("series") or {}).get("lastObservedTime") or event.get("eventTime")
               or "")


def duration(s: float) -> str:
    """A length of time in words: 45s, 4m10s, 2h05m (status and the timeline)."""
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def percent(v: Any) -> str:
    """A share 0..1 as "81.4 %" ("-" when there is none)."""
    return f"{100 * v:.1f} %" if isinstance(v, int | float) else "-"


def progress_lines(p: Mapping[str, Any] | None, last: Mapping[str, Any] | None) -> list[str]:
    """The progress line (step, rate, world, goodput) and the last incident with its phases."""
    if not p or p.get("since") is None:
        lines = ["", "PROGRESS: no training step seen yet"]
    else:
        lines = ["", _progress_line(p)]
    if last:
        phases = last.get("phases") or {}
        t0 = phases.get("detected")
        steps = ", ".join(f"{k} +{v - t0:.1f}s"  # in the order they were reached
                          for k, v in sorted(phases.items(), key=lambda kv: kv[1])
                          if k != "detected" and t0 is not None)
        state = "open" if last.get("open") else "over"
        lines.append(f"LAST INCIDENT #{last.get('id')} {last.get('label') or last.get('cause')}"
                     f" ({last.get('kind')}, {state}): {steps or 'detected'}; "
                     f"{last.get('redone', 0)} steps computed again, "
                     f"{last.get('lost_ws', 0):.0f} worker-seconds lost")
    return lines


def _progress_line(p: Mapping[str, Any]) -> str:
    state = "training" if p.get("training") else "not training"
    world = "-" if p.get("world") is None else p["world"]
    return (f"PROGRESS: step {p.get('step', 0)} ({p.get('redone', 0)} computed again), "
            f"{p.get('rate', 0.0):.2f} steps/s, {state}, world {world}/{p.get('desired')}; "
            f"goodput {percent(p.get('goodput'))} at full size, "
            f"{percent(p.get('goodput_any'))} training at all, over "
            f"{duration(p.get('wall_s') or 0.0)}")


def render(s: Mapping[str, Any]) -> str:
    """The `status` table (like `arena get`)."""
    r = s["restarts"]
    budget = (f"{r['used']}/{r['limit']} used, {r['left']} left" if r["limit"] is not None
              else f"{r['used']} used (no state yet)")
    asked = (f" (scale request {s['requested']})"
             if s["requested"] is not None and s["requested"] != s["desired"] else "")
    lines = [f"job {s['job']} in {s['namespace']}: desired {s['desired']}{asked}, live "
             f"{s['live']}, listed {s['listed']}; restarts {budget}", ""]
    cols = ("pod", "slot", "incarnation", "host", "node", "state", "ready", "containerRestarts")
    heads = ("WORKER", "SLOT", "INC", "HOST", "NODE", "STATE", "READY", "RESTARTS")
    rows = [[("-" if w[c] is None else str(w[c])) for c in cols] for w in s["workers"]]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(heads)]
    for row in [list(heads), *rows]:
        lines.append("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())
    lines += progress_lines(s.get("progress"), (s.get("incidents") or [None])[-1])
    if s.get("quarantined"):
        until = ", ".join(
            f"{n} (until {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))})"
            for n, t in sorted(s["quarantined"].items()))
        lines += ["", f"QUARANTINED NODES (no new worker of the job): {until}"]
    if s.get("slow"):
        lines += ["", "SLOW WORKERS (their own work per step, or their fastest link's round "
                  "trip, against the others' median): " + (
            ", ".join(f"{w.get('host')} (rank {', '.join(map(str, w.get('ranks') or []))}"
                      f"{', its links' if w.get('kind') == 'link' else ''}: "
                      f"{w.get('factor')}x, {w.get('outMs')} ms vs {w.get('medianMs')} ms, "
                      f"for {duration(float(w.get('forS') or 0))})" for w in s["slow"]))]
    lines += ["", "LAST DECISIONS"]
    for d in s["decisions"]:
        times = f" (x{d['count']})" if d.get("count", 1) > 1 else ""
        lines.append(f"{d['time']}  {d['type']:<7}  {d['reason']:<18}  {d['note']}{times}")
    if not s["decisions"]:
        lines.append("(none)")
    return "\n".join(lines)
