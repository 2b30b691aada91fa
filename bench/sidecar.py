"""Sidecar mode against the baked-in mode: recovery after a SIGKILL and a frozen worker.

The same stock-script job (bench/e2e_stock.py's, default settings, the hook on) in the two
modes, alternately on one cluster of real nodes: manifests/overlays/local (the supervisor in the
launcher image, horovodrun its child) and manifests/overlays/sidecar (the supervisor in its own
image as a native sidecar; horovodrun in the trainer image, which holds nothing of
elastic-supervisor, under es-run; the workers get the hook from an init container). Each job
goes through PLAN; resumed = fault injected -> rank 0's first batch after the reset that
follows it. The target: sidecar mode within the baked-in mode's bounds.
"""

from __future__ import annotations

from typing import Any

from bench.e2e_stock import on_real_nodes, one_job, summary
from localcluster.job import OVERLAY, SIDECAR_OVERLAY

PLAN = ("kill", "freeze process", "kill", "freeze process")
KILLS, HANGS = ("kill",), ("freeze process",)
RUNS = 2  # jobs per mode


def main(runs: int = RUNS) -> dict[str, Any]:
    jobs: dict[str, list[dict[str, Any]]] = {"baked": [], "sidecar": []}
    with on_real_nodes("sidecar") as (cluster, api, tmp):
        for i in range(runs):
            for mode, overlay in (("sidecar", SIDECAR_OVERLAY), ("baked", OVERLAY)):
                work = tmp / f"{mode}{i}"
                work.mkdir()
                print(f"bench sidecar: {mode} job {i + 1} of {runs}", flush=True)
                jobs[mode].append(one_job(cluster, api, work, PLAN, overlay=overlay))

    def of(mode: str, kinds: tuple[str, ...]) -> dict[str, Any] | None:
        return summary([f["resumed_s"] for j in jobs[mode] for f in j["faults"]
                        if f["fault"] in kinds and "resumed_s" in f])

    out: dict[str, Any] = {}
    for mode in ("sidecar", "baked"):
        kill, hang = of(mode, KILLS), of(mode, HANGS)
        out[mode] = {
            "resumed_after_kill_s": kill and {"median": kill["median"], "max": kill["max"]},
            "resumed_after_hang_s": hang and {"median": hang["median"], "max": hang["max"]},
            "horovodrun_restarts": sum(j["horovodrun_restarts"] for j in jobs[mode]),
        }
    sidecar = {**out["sidecar"], "baked_in_same_runs": out["baked"]}
    print(f"sidecar: {sidecar}", flush=True)
    return {"sidecar": sidecar, "sidecar_details": {"plan": list(PLAN), "runs": runs,
                                                     "jobs": jobs}}
