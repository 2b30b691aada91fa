"""Starting and stopping a cluster with real nodes leaves this machine as it was.

These start clusters of their own, so they run before the session's cluster starts (see
OWN_CLUSTER_FIRST in conftest.py): one cluster with real nodes per machine at a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config

from localcluster.hoststate import HostSnapshot
from localcluster.nodes import RECORD, Cluster, ClusterSettings, recover_stale
from localcluster.tarimage import TOOLBOX_IMAGE
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def run_a_pod(c: Cluster) -> None:
    api = config.new_client_from_config(config_file=str(c.kubeconfig))
    try:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", {
            "metadata": {"name": "p"},
            "spec": {"dnsPolicy": "Default", "containers": [{
                "name": "c", "image": TOOLBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "100000"]}]}})

        def running() -> bool:
            return core.read_namespaced_pod("p", "default").status.phase == "Running"

        wait_for(running, 60, what="a pod running on the real node")
    finally:
        api.close()


def test_teardown_leaves_no_host_state_behind() -> None:
    recover_stale()  # a cluster whose owner died before this session is not the host's state
    before = HostSnapshot.take()
    c = Cluster(ClusterSettings(nodes=1))
    with c:
        run_a_pod(c)
        during = before.leftovers()
        assert any("network links" in d for d in during), during  # it did change the host
        workdir = c.workdir
    assert before.leftovers() == [], "teardown left host state behind"
    assert not workdir.exists()
    assert not RECORD.exists()


def test_a_cluster_whose_owner_was_killed_is_cleaned_up_by_the_next_one(tmp_path: Path) -> None:
    recover_stale()
    before = HostSnapshot.take()
    ready = tmp_path / "ready"
    owner = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from localcluster.nodes import Cluster, ClusterSettings
c = Cluster(ClusterSettings(nodes=1)).start()
Path({str(ready)!r}).write_text(str(c.kubeconfig))
time.sleep(600)
"""], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: ready.exists() or owner.poll() is not None, 120, what="cluster up")
        assert owner.poll() is None, "the owner died while starting"
        record = json.loads(RECORD.read_text())
        os.kill(owner.pid, signal.SIGKILL)  # no teardown at all
        owner.wait()
        time.sleep(1)
        assert before.leftovers(), "a killed owner leaves host state (that is the point)"
        assert Path(record["workdir"]).exists()
    finally:
        if owner.poll() is None:
            owner.kill()
    c = Cluster(ClusterSettings(nodes=1))
    with c:
        run_a_pod(c)
    assert before.leftovers() == [], "the next cluster did not clean up after the dead one"
    assert not Path(record["workdir"]).exists()
