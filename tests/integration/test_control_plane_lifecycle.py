"""The control plane stops cleanly (no orphan, ports free, dir gone) and keeps evidence on failure.

These start their own clusters (about 10 s each) instead of the session one, since they stop them.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import psutil
import pytest

from localcluster.controlplane import ControlPlane, ControlPlaneError, Settings, port_is_free


def _session_members(pids: dict[str, int]) -> list[psutil.Process]:
    """Every live process in the sessions of the given component pids."""
    sids = set(pids.values())
    alive = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) in sids and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def test_clean_stop_leaves_no_process_port_or_directory() -> None:
    cp = ControlPlane(Settings()).start()
    pids, ports, workdir = cp.pids(), cp.ports, cp.workdir
    assert set(pids) == {"etcd", "apiserver", "controller-manager", "scheduler"}
    assert all(psutil.pid_exists(p) for p in pids.values())
    assert not any(port_is_free(p) for n, p in ports.items() if n != "etcd-peer")
    cp.stop()
    assert _session_members(pids) == []
    assert all(port_is_free(p) for p in ports.values()), ports
    assert not workdir.exists()


def test_a_dead_component_is_reported_and_its_workdir_kept(capsys) -> None:
    cp = ControlPlane(Settings()).start()
    pids, workdir = cp.pids(), cp.workdir
    try:
        os.kill(pids["scheduler"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        with pytest.raises(ControlPlaneError, match="scheduler exited with -9"):
            while time.monotonic() < deadline:
                cp.check_alive()
                time.sleep(0.05)
    finally:
        cp.stop()
    assert _session_members(pids) == []
    assert workdir.is_dir() and (workdir / "logs" / "apiserver.log").is_file()
    assert f"kept {workdir}" in capsys.readouterr().err
    shutil.rmtree(workdir)


def test_missing_binaries_are_named(tmp_path) -> None:
    cp = ControlPlane(Settings(bin_dir=tmp_path))
    with pytest.raises(ControlPlaneError) as err:
        cp.start()
    msg = str(err.value)
    assert str(tmp_path) in msg and "etcd" in msg and "kube-apiserver" in msg
    assert "make setup" in msg
