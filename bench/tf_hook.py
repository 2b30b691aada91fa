"""The hook's cost per step for TensorFlow (bench key `e2e_stock_tf`): bench/tf_hook_probe.py,
run in the TensorFlow environment `make setup` builds (scripts/build-tf-env.sh) with the hook's
directory on its PYTHONPATH, measures in one process the stock TF script's step (the seeds'
model and `@tf.function` step) and what the hook's two signals around its gradients add to it.

The block's other keys (resumed after a kill, a hang and a stuck main thread on real nodes,
restarts, steps computed again) are bench/e2e_stock_tf.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from supervisor.hook import HOOK_DIR
from tests.e2e.fakehosts import TF_PYTHON

PROBE = Path(__file__).with_name("tf_hook_probe.py")
RUNS = 3  # the probe's medians, each from its own process: the worst of them is reported


def probe() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(HOOK_DIR), "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([str(TF_PYTHON), str(PROBE)], env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> dict[str, Any]:
    runs = [probe() for _ in range(RUNS)]
    worst = max(runs, key=lambda r: r["percent_of_a_stock_step"])
    return {"e2e_stock_tf": {
        "hook_cost_per_step": {
            "percent_of_a_stock_step": worst["percent_of_a_stock_step"],
            "percent_of_a_stock_step_runs": [r["percent_of_a_stock_step"] for r in runs],
            "signals_us_per_step": worst["signals_us_per_step"],
            "stock_step_ms": worst["stock_step_ms"],
            "gradient_tensors": worst["gradient_tensors"],
            "tensorflow": worst["tensorflow"]}}}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
