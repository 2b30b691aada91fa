"""Fixtures for tests where the supervisor owns the workers (a worker template): a `Job`
whose pods a kubelet stand-in starts, and a factory of real supervisor processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.controlplane import ControlPlane
from tests.helpers import wait_for
from tests.integration.harness import AutoKubelet, Job, SupervisorProcess


@pytest.fixture(name="job")
def job_fixture(api_client: client.ApiClient, namespace: str) -> Iterator[Job]:
    j = Job(api_client, namespace)
    j.kubelet = AutoKubelet(j)
    yield j
    j.kubelet.close()
    j.close()


@pytest.fixture(name="supervisor")
def supervisor_fixture(control_plane: ControlPlane, namespace: str, tmp_path: Path, job: Job):
    made: list[SupervisorProcess] = []
    template = job.template(tmp_path / "worker.json")

    def make(**env: str) -> SupervisorProcess:
        env = {"SUPERVISOR_WORKER_TEMPLATE": str(template),
               "SUPERVISOR_BACKOFF_INITIAL_SECONDS": "0.5", **env}
        sup = SupervisorProcess(control_plane, namespace, tmp_path, **env)
        made.append(sup)
        return sup.start()

    yield make
    for sup in made:
        sup.close()


def running(job: Job, count: int, timeout: float = 30) -> list[str]:
    """Wait until `count` live worker pods are Running; return their names."""
    def check() -> list[str] | None:
        pods = job.pods()
        live = [n for n, p in sorted(pods.items()) if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        names = [n for n in live if pods[n].get("status", {}).get("phase") == "Running"]
        return names if len(names) == count == len(live) else None
    return wait_for(check, timeout, what=f"{count} running workers")


