"""kube-apiserver restarted while real elastic Horovod training runs on real nodes: the
supervisor (in its launcher pod, through the `kubernetes` Service) reconnects and relists, keeps
training going, still acts on failures afterwards, and loses nothing. The kubelets of the
session's cluster reconnect too (the outage is shorter than the node controller's grace)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.e2e.jobs import Job, check_training
from tests.integration.harness import scrape

STEPS = 3000  # ~150 s of training at full size: outlasts the restart and the kill
METRICS_PORT = 9400  # the manifests' SUPERVISOR_METRICS_PORT, on the launcher pod's IP


def test_training_survives_a_kube_apiserver_restart(make_job: Callable[..., Job]) -> None:
    # The manifests' leader lease (60 s) rides out the restart; a 10 s one would end the run
    # with exit 7 (leadership lost), which is right but not what this checks.
    job = make_job(steps=STEPS, env={"SUPERVISOR_LEADER_LEASE_SECONDS": "60"})
    job.wait_training(past=10, size=2, timeout=420)
    launcher = job.launcher()
    assert launcher is not None
    ip = launcher["status"]["podIP"]
    before = scrape(METRICS_PORT, ip)
    workers = sorted(job.live_workers())
    at = (job.last_step() or {"step": 0})["step"]

    assert job.cluster.cp is not None
    job.cluster.cp.restart_apiserver(down_s=3)
    # Training never needed the API: it goes on at full size through the outage.
    job.wait_training(past=at + 10, size=2, timeout=120)
    p = "elastic_supervisor_"

    def reconnected() -> bool:
        now = scrape(METRICS_PORT, ip)
        return all(now.get(f'{p}watch_connects_total{{kind="{k}"}}', 0)
                   > before[f'{p}watch_connects_total{{kind="{k}"}}'] for k in ("pod", "node"))
    job.wait("the pod and node watches connected again", reconnected, 90)
    assert sorted(job.live_workers()) == workers, "nothing replaced: nothing failed"
    assert job.logs("worker.failed") == []

    # The supervisor still acts after the outage.
    victim, _ = job.victim()
    t0 = time.time()
    job.kill_container(victim)
    job.back_to(2, t0)
    assert job.wait_exit(400) == 0, job.tail()

    assert job.decision(victim)["action"] == "Restart"
    assert job.logs("watch.broken"), "the outage was noticed"
    check_training(job.records(), STEPS, final_size=2)
    assert "WorkerRestarting" in job.reasons()
