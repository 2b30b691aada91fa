"""kube-apiserver restarted while real elastic Horovod training runs: the supervisor reconnects
(and relists), keeps training going, still acts on failures afterwards, and loses nothing.

A private control plane (the production node grace of 40 s; see conftest's
`restartable_control_plane`), so the restart cannot disturb the other tests.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from localcluster.controlplane import ControlPlane, free_ports
from tests.conftest import make_namespace
from tests.e2e.test_scenarios import STEPS, back_to_full_size, decision
from tests.e2e.training import check_training, elastic_job
from tests.integration.harness import scrape


@pytest.fixture
def api(restartable_control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    a = config.new_client_from_config(config_file=str(restartable_control_plane.kubeconfig))
    yield a
    a.close()


def test_training_survives_a_kube_apiserver_restart(
        restartable_control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path) -> None:
    cp = restartable_control_plane
    namespace = make_namespace(client.CoreV1Api(api))
    port = free_ports(1)[0]
    # The default leader lease (60 s) rides out the restart, not the scenarios' short one.
    with elastic_job(cp, api, namespace, tmp_path, steps=STEPS,
                     SUPERVISOR_METRICS_PORT=str(port),
                     SUPERVISOR_LEADER_LEASE_SECONDS="60") as job:
        job.start()
        job.wait_training(past=10, size=2, timeout=240)
        before = scrape(port)
        workers = sorted(job.live_workers())
        at = (job.last_step() or {"step": 0})["step"]

        cp.restart_apiserver(down_s=3)
        # Training never needed the API: it goes on at full size through the outage.
        job.wait_training(past=at + 10, size=2, timeout=120)
        p = "elastic_supervisor_"

        def reconnected() -> bool:
            now = scrape(port)
            return all(now.get(f'{p}watch_connects_total{{kind="{k}"}}', 0)
                       > before[f'{p}watch_connects_total{{kind="{k}"}}']
                       for k in ("pod", "node"))
        job.wait("the pod and node watches connected again", reconnected, 60)
        assert sorted(job.live_workers()) == workers, "nothing replaced: nothing failed"
        assert job.logs("worker.failed") == []

        # The supervisor still acts after the outage.
        victim, _ = job.victim()
        t0 = time.time()
        job.pods.agent.kill(job.pods.ref(victim), signal.SIGKILL)
        back_to_full_size(job, t0)
        assert job.wait_exit(300) == 0, job.tail()

        assert decision(job, victim)["action"] == "Restart"
        assert [e["event"] for e in job.logs("watch.broken")], "the outage was noticed"
        check_training(job.records(), STEPS, final_size=2)
        assert "WorkerRestarting" in job.reasons()
