"""End to end: real elastic Horovod training recovering from faults, timed from the job's logs.

Runs the main job exactly as `make demo` does (localcluster/demo.py: manifests/overlays/local on
the local cluster with three real nodes and the real images; the supervisor in the launcher pod
with the manifests' ServiceAccount; horovodrun training worker_image/train.py on 2 worker pods
over ssh), once per run in a namespace of its own on one cluster, and injects, one at a
time once the job is back at full size, the faults of PLAN. From
the launcher's log (rank 0's step lines, the supervisor's decisions and discovery changes),
over RUNS runs of the job:
- resume after a kill / a freeze: fault injected -> rank 0's first step after the reset;
- full size after the replacement: the replacement entered the discovery file (it was Ready)
  -> the first step at world size 2 again;
- steps rerun: for each rollback, the steps computed again (last step before it - last commit);
- goodput: the supervisor's (the progress it stored) against the one rank 0's printed steps give
  over the same window, by the same rule (localcluster.demo.goodput_from_steps).
All times are wall-clock differences on one machine (fault injector, supervisor and workers).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from localcluster import demo

PLAN = ("kill", "force-delete", "freeze", "kill")  # what fits in the overlay's 3000 steps
RUNS = 2


def rollbacks(steps: list[dict[str, Any]]) -> list[int]:
    """Steps computed again at each rollback of rank 0's step sequence."""
    out, prev = [], 0
    for s in steps:
        if s["step"] <= prev:
            out.append(prev - s["step"] + 1)
        prev = s["step"]
    return out


def summary(samples: list[float]) -> dict[str, Any] | None:
    if not samples:
        return None
    return {"median": round(statistics.median(samples), 2), "max": round(max(samples), 2),
            "n": len(samples), "samples": [round(x, 2) for x in samples]}


def main(plan: tuple[str, ...] = PLAN, runs: int = RUNS) -> dict[str, Any]:
    faults: list[tuple[str, demo.Fault]] = []
    rerun: list[int] = []
    goodput: list[dict[str, Any]] = []
    with demo.started_cluster() as cluster:
        for i in range(runs):
            out = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
            print(f"bench e2e: run {i + 1} of {runs}, logs in {out}")
            result = demo.run_job(out, plan, cluster, namespace=f"bench-e2e-{i + 1}")
            if result.code != 0:
                raise SystemExit(f"bench e2e: the launcher exited {result.code}; logs in {out}")
            faults += list(zip(plan, result.faults, strict=False))
            rerun += rollbacks(result.run.steps)
            g = demo.goodputs(result)
            if g is None:
                raise SystemExit(f"bench e2e: no goodput stored ({result.unread}); logs in {out}")
            goodput.append(g)

    def resumed(key: str) -> list[float]:
        return [f.resumed - f.at for k, f in faults if k == key and f.resumed is not None]

    full = [f.full - f.usable for _, f in faults if f.full is not None and f.usable is not None]
    details = {
        "plan": list(plan), "runs": runs,
        "faults": [{"fault": f.name, "detected_s": _since(f.detected, f.at),
                    "resumed_s": _since(f.resumed, f.at),
                    "replacement_usable_s": _since(f.usable, f.at),
                    "full_size_s": _since(f.full, f.at)} for _, f in faults],
        "resume_after_kill_s": summary(resumed("kill")),
        "resume_after_force_delete_s": summary(resumed("force-delete")),
        "resume_after_freeze_s": summary(resumed("freeze")),
        "full_size_after_replacement_s": summary(full),
        "steps_rerun": rerun,
        # the supervisor's goodput (its stored progress) against rank 0's printed steps over
        # the same window (localcluster.demo.goodput_from_steps); target: within 1 % (0.01)
        "goodput": goodput,
        "commit_every": 5,
    }
    kill, freeze = details["resume_after_kill_s"], details["resume_after_freeze_s"]
    e2e = {
        "resume_after_kill_s": kill["median"] if kill else None,
        "resume_after_freeze_s": freeze["median"] if freeze else None,
        "full_size_after_replacement_s": round(max(full), 2) if full else None,
        "steps_rerun_max": max(rerun) if rerun else None,
        "goodput_tool_vs_steps_diff_max": max((g["diff"] for g in goodput), default=None),
    }
    print(f"e2e: {e2e}")
    return {"e2e": e2e, "e2e_details": details}


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 2)
