"""End to end with the seeds' TensorFlow script: recovery times on real nodes (bench key
`e2e_stock_tf`, beside the hook's cost per step that bench/tf_hook.py measures).

bench/e2e_stock.py's job and faults with tests/e2e/stock_tf_train.py (a `@tf.function` step with
`DistributedGradientTape`, `TensorFlowKerasState`, `@hvd.elastic.run`, a commit every batch;
nothing of ours, no checkpoint) in the TensorFlow trainer image, which can only run in the
sidecar mode: the sidecar overlay with its YOUR IMAGE lines naming elastic-supervisor-trainer-tf
(tests/e2e/jobs.your_image), 2 workers, the supervisor's defaults (the hang thresholds:
SUPERVISOR_STUCK_SECONDS=auto; the quarantine: SHIPPED_QUARANTINE), the backoff capped at 1 s.
One job, PLAN's faults one at a time once it is back at full size:
- resumed_after_kill_s: a SIGKILL (a worker's, rank 0's) -> rank 0's first batch after the
  reset; resumed_after_hang_s: a frozen process or a partition; resumed_after_stuck_s: a main
  thread deadlocked through the script's --hang-file (found after the auto threshold, >= 20 s);
- horovodrun_restarts: horovodrun started again (a restart starts this script over);
- steps_recomputed: the most batches computed again at one rollback after any fault.
"""

from __future__ import annotations

from typing import Any

from bench.e2e_stock import on_real_nodes, one_job, summary
from localcluster.job import SIDECAR_OVERLAY
from tests.e2e.jobs import (
    CHECKPOINT_MOUNT,
    HANG_FILE,
    SHIPPED_QUARANTINE,
    STOCK_DIR,
    STOCK_TF,
    TRAINER_TF,
    your_image,
)

PLAN = ("kill", "freeze process", "stuck", "kill rank 0", "partition", "kill",
        "freeze process", "stuck rank 0")
KILLS, HANGS, STUCK = ("kill", "kill rank 0"), ("freeze process", "partition"), \
    ("stuck", "stuck rank 0")


def median_max(samples: list[float]) -> dict[str, Any] | None:
    s = summary(samples)
    return {"median": s["median"], "max": s["max"]} if s else None


def main() -> dict[str, Any]:
    command = ["python", f"{STOCK_DIR}/{STOCK_TF.name}", "--batches", "1000000", "--sleep",
               "0.05", "--hang-file", f"{CHECKPOINT_MOUNT}/{HANG_FILE}"]
    with on_real_nodes("e2e_stock_tf") as (cluster, api, tmp):
        job = one_job(cluster, api, tmp, PLAN, overlay=SIDECAR_OVERLAY, stock=STOCK_TF,
                      command=command, transform=your_image(TRAINER_TF),
                      env=dict(SHIPPED_QUARANTINE))
    faults = job["faults"]

    def of(kinds: tuple[str, ...]) -> list[float]:
        return [f["resumed_s"] for f in faults if f["fault"] in kinds and "resumed_s" in f]

    details = {"plan": list(PLAN), "supervisor_env": dict(SHIPPED_QUARANTINE), "job": job,
               "resumed_after_kill_s": summary(of(KILLS)),
               "resumed_after_hang_s": summary(of(HANGS)),
               "resumed_after_stuck_s": summary(of(STUCK)),
               "full_size_s": summary([f["full_size_s"] for f in faults if "full_size_s" in f])}
    measured = {
        "resumed_after_kill_s": median_max(of(KILLS)),
        "resumed_after_hang_s": median_max(of(HANGS)),
        "resumed_after_stuck_s": median_max(of(STUCK)),
        "horovodrun_restarts": job["horovodrun_restarts"],
        "steps_recomputed": max((n for f in faults for n in f.get("steps_rerun", ())),
                                default=0),
    }
    print(f"e2e_stock_tf: {measured}", flush=True)
    return {"e2e_stock_tf": measured, "e2e_stock_tf_details": details}
