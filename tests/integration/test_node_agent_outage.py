"""The node agent through a real kube-apiserver outage, on a private control plane (see
conftest.restartable_control_plane): a pod that dies while the API is down gets its status
written once the API is back, and the agent's pod watch reconnects."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from localcluster.controlplane import ControlPlane
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.pods import agent_pods, container_state


@pytest.fixture(scope="module")
def core(restartable_control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    api = config.new_client_from_config(config_file=str(restartable_control_plane.kubeconfig))
    yield client.CoreV1Api(api)
    api.close()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        pass
    return False


def test_a_pod_dying_during_an_api_outage_is_reported_when_the_api_is_back(
        restartable_control_plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    cp = restartable_control_plane
    caplog.set_level(logging.INFO, logger="localcluster.nodeagent")
    with agent_pods(cp, core, make_namespace(core), tmp_path / "keys") as pods:
        pods.start_worker("w0")
        killed = threading.Event()

        def kill_while_down() -> None:
            wait_for(lambda: refused(cp.ports["apiserver"]), 15, what="kube-apiserver down")
            pods.agent.kill(pods.ref("w0"), signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill_while_down)
        killer.start()
        # From this thread: the control plane's children die with the thread that started them.
        cp.restart_apiserver(down_s=4)
        killer.join(20)
        assert killed.is_set()
        failed = [r.getMessage() for r in caplog.records if "pod.status_failed" in r.getMessage()]
        assert failed, "the status write failed while the API was down"

        done = pods.wait_terminated("w0", timeout=30)
        assert container_state(done)["terminated"]["exitCode"] == 137
        assert done["status"]["phase"] == "Failed"
        # The pod watch reconnected: a pod created after the outage is run.
        assert pods.start_worker("w1")["status"]["podIP"].startswith("127.")
