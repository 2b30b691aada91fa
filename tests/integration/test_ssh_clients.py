"""kill_ssh_clients with real sshd fake hosts and real ssh clients: only the clients of the
given host inside the given process tree die; the worker then looks failed to its parent."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from localcluster.sshd import FakeHost, KeyPair, ssh_client_args
from supervisor.proc import kill_ssh_clients, ssh_clients_for
from tests.helpers import wait_for


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[KeyPair, int, list[FakeHost]]]:
    key = KeyPair.generate(tmp_path / "keys")
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    started = [FakeHost(a, port, key).start() for a in ("127.0.0.2", "127.0.0.3")]
    yield key, port, started
    for h in started:
        h.stop()


def sessions(host: FakeHost) -> list[psutil.Process]:
    """The remote `sleep` commands running in sessions of this fake host."""
    found = []
    for p in psutil.Process(host.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a session process may just have ended
            if p.name() == "sleep":
                found.append(p)
    return found


LAUNCHER = """
import subprocess, sys, time
# Like horovod's middlemen: each ssh runs under `sh -c`, in its own process group.
procs = [subprocess.Popen(["sh", "-c", cmd], start_new_session=True) for cmd in sys.argv[1:]]
print(" ".join(str(p.wait()) for p in procs), flush=True)
"""


def gone(pid: int) -> bool:
    """The process ended (a zombie, or reaped): asked in one step, since it may be reaped
    between a pid_exists and a Process (that race failed this test once, 2026-11-30)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_only_the_named_hosts_clients_in_the_tree_are_killed(hosts) -> None:
    key, port, (h2, h3) = hosts
    opts = " ".join(ssh_client_args(key, port))
    cmd = [f"ssh {opts} 127.0.0.2 sleep 600", f"ssh {opts} 127.0.0.3 sleep 600"]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *cmd], stdout=subprocess.PIPE,
                                text=True)
    outsider = subprocess.Popen(["ssh", *ssh_client_args(key, port), "127.0.0.2", "sleep", "600"])
    try:
        wait_for(lambda: len(sessions(h2)) == 2 and len(sessions(h3)) == 1, 15,
                 what="three ssh sessions established")
        in_tree = ssh_clients_for(launcher.pid, "127.0.0.2")
        assert len(in_tree) == 1 and in_tree[0].pid != outsider.pid

        by_host = kill_ssh_clients(launcher.pid, {"127.0.0.2", "127.0.0.9"})
        assert by_host == {"127.0.0.2": [in_tree[0].pid]}, "only hosts with clients appear"
        killed = by_host["127.0.0.2"]
        wait_for(lambda: gone(killed[0]), 5, what="killed ssh gone")
        assert ssh_clients_for(launcher.pid, "127.0.0.2") == []
        assert len(ssh_clients_for(launcher.pid, "127.0.0.3")) == 1
        assert outsider.poll() is None, "an ssh outside the tree was killed"

        kill_ssh_clients(launcher.pid, {"127.0.0.3"})
        codes = launcher.communicate(timeout=10)[0].split()
        assert codes == ["137", "137"], "the worker's shell must see its ssh die"
    finally:
        outsider.kill()
        launcher.kill()
        outsider.wait()
        launcher.wait()


def test_no_clients_for_an_unknown_host_or_a_dead_tree(hosts) -> None:
    assert ssh_clients_for(999_999_999, "127.0.0.2") == []
    assert kill_ssh_clients(psutil.Process().pid, {"127.0.0.9"}) == {}
    assert kill_ssh_clients(999_999_999, {"127.0.0.2"}) == {}
