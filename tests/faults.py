"""Fault injection for the hang tests, in one place.

`PodFaults` is the interface the stock-script lane uses on the worker pods of a job on the real
nodes (localcluster.job.MainJob): kill a container, force delete, freeze the training processes
of a pod, freeze a whole node, partition a pod (iptables on its pod IP: each pod has its own
network namespace). Below it, the primitives for the fake hosts of the Horovod-level tests
(tests/e2e/fakehosts.py), where every "host" shares this machine's network namespace and talks
over 127.0.0.1: partitioning one means dropping every packet of its processes' sockets (by
their exact endpoints, and, for sockets they open later, by a cgroup v2 path they are moved to)
and every packet to or from its address. Every rule lives in a chain of its own; the chain and
the cgroup are removed in a finally, and `partitioned` checks that they are gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

from localcluster.hoststate import PARTITION_PREFIX
from localcluster.kubelet import ready_condition

CGROUP2 = Path("/sys/fs/cgroup/unified")


LINK_QUEUE_MS = 100  # slow_link's queue: what waits longer is dropped (and sent again)


class PodFaults:
    """Faults on the worker pods of one job on real nodes, as they happen in a cluster."""

    def __init__(self, job: Any, script: str) -> None:
        self.job, self.script = job, script  # a MainJob; the training script's file name
        self.frozen: list[Any] = []  # nodes frozen here, thawed by close()
        self.throttled: list[Path] = []  # CPU cgroups given a quota here, lifted by close()
        self.narrowed: list[int] = []  # pids in pods whose link is slowed here (close())

    def kill(self, *names: str, sig: int = signal.SIGKILL) -> None:
        """The pods' containers get `sig` at once (a crash, an OOM kill): they end 128+sig."""
        for name in names:
            self.job.kill_container(name, sig)

    def blip_node(self, node: str, seconds: float = 1.0) -> None:
        """The node's Ready condition goes False for `seconds`, as its kubelet posts it for a
        PLEG hiccup or a container runtime restart, then True again: none of its pods was
        lost (the node controller taints it not-ready meanwhile, and untaints it after)."""
        core = self.job.core
        core.patch_node_status(node, {"status": {"conditions": [
            ready_condition("False", "KubeletNotReady")]}})
        time.sleep(seconds)
        core.patch_node_status(node, {"status": {"conditions": [ready_condition()]}})

    def force_delete(self, name: str) -> None:
        self.job.force_delete(name)

    def training(self, name: str) -> list[int]:
        """Host pids of the training processes in the pod (horovodrun's workers, not sshd)."""
        return self.job.processes(name, lambda argv: any(self.script in a for a in argv)
                                  and "python" in (argv[0] if argv else ""))

    def freeze_training(self, name: str) -> list[int]:
        """SIGSTOP the pod's training processes only: a hung process on a healthy node."""
        pids = self.training(name)
        if not pids:
            raise AssertionError(f"no training process in pod {name}")
        self.job.silence(name)
        freeze(pids)
        return pids

    def silence_node(self, node: str) -> None:
        """The node hangs whole (the v1 freezer: kubelet, containerd, pods): its Lease is no
        longer renewed, its pods stop; the kernel still answers TCP. Thawed by close()."""
        n = self.job.cluster.node(node)
        self.job.silence_node(n)
        n.freeze()
        self.frozen.append(n)

    def partition(self, name: str) -> contextlib.AbstractContextManager[str]:
        """While inside, no packet reaches or leaves the pod (its processes keep running)."""
        return self.job.partitioned(name)

    def throttle(self, name: str, percent: int) -> list[Path]:
        """Give the pod's training processes `percent` of one CPU (their cgroups' CFS quota,
        as a CPU limit or an overcommitted node does): a worker slow but alive. Its cgroups are
        given their quota back by close() (or go with the pod)."""
        pids = self.training(name)
        if not pids:
            raise AssertionError(f"no training process in pod {name}")
        self.job.silence(name)
        groups = sorted(cpu_cgroups(pids))
        for group in groups:
            period = int((group / "cpu.cfs_period_us").read_text())
            (group / "cpu.cfs_quota_us").write_text(str(period * percent // 100))
            self.throttled.append(group)
        return groups

    def slow_link(self, name: str, rate: str, *, queue_ms: int = LINK_QUEUE_MS) -> None:
        """Make the pod's network link slow: everything that leaves it (its data, and its
        acknowledgements of what it receives) goes through a token bucket of `rate` (tc's tbf
        on its eth0, in its network namespace), queued up to `queue_ms`: a degraded NIC, a
        congested link, a link shaped by a noisy neighbour. Slow but alive: the pod's
        processes run as before. (A fixed delay would be netem's; this machine's kernel has
        no netem.) Lifted by close(), or gone with the pod."""
        pids = self.training(name)
        if not pids:
            raise AssertionError(f"no training process in pod {name}")
        self.job.silence(name)
        subprocess.run(["nsenter", "-t", str(pids[0]), "-n", "tc", "qdisc", "replace", "dev",
                        "eth0", "root", "tbf", "rate", rate, "burst", "16kb", "latency",
                        f"{queue_ms}ms"], check=True, capture_output=True, timeout=30)
        self.narrowed.append(pids[0])

    def close(self) -> None:
        while self.narrowed:
            subprocess.run(["nsenter", "-t", str(self.narrowed.pop()), "-n", "tc", "qdisc",
                            "del", "dev", "eth0", "root"], check=False, capture_output=True,
                           timeout=30)
        while self.frozen:
            self.frozen.pop().thaw()
        while self.throttled:
            with contextlib.suppress(OSError):
                (self.throttled.pop() / "cpu.cfs_quota_us").write_text("-1")


def cpu_cgroups(pids: Iterable[int]) -> set[Path]:
    """The cgroup v1 CPU controller's directories of `pids` (/proc/PID/cgroup)."""
    out = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if "cpu" in controllers.split(","):
                    out.add(Path("/sys/fs/cgroup") / controllers / path.lstrip("/"))
    return out


def freeze(pids: Iterable[int]) -> None:
    """SIGSTOP the processes (a hung process, or with all of a pod's, a hung machine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)


def kill(pids: Iterable[int]) -> None:
    """SIGKILL the processes: frozen ones whose ssh session was killed belong to init, and no
    host's teardown finds them any more."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def thaw(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True, text=True)


def _rules(pids: Iterable[int], address: str, cgroup: str) -> list[list[str]]:
    """DROP rules for every socket of `pids`, the cgroup and the address."""
    rules = [["-s", address], ["-d", address], ["-m", "cgroup", "--path", cgroup]]
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet4")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if not c.laddr:
                continue
            proto = "tcp" if c.type == socket.SOCK_STREAM else "udp"
            lip, lport = c.laddr
            if c.raddr:
                rip, rport = c.raddr
                rules.append(["-p", proto, "-s", lip, "--sport", str(lport), "-d", rip,
                              "--dport", str(rport)])
                rules.append(["-p", proto, "-s", rip, "--sport", str(rport), "-d", lip,
                              "--dport", str(lport)])
            else:  # a listener or an unconnected UDP socket: everything to and from its port
                where = [] if lip == "0.0.0.0" else ["-d", lip]
                rules.append(["-p", proto, *where, "--dport", str(lport)])
                where = [] if lip == "0.0.0.0" else ["-s", lip]
                rules.append(["-p", proto, *where, "--sport", str(lport)])
    return rules


def _release(cgroup: Path, tries: int = 100) -> None:
    """Move every process out of `cgroup` and remove it. A process a member forks between the
    read and the rmdir, or one still exiting, makes the rmdir fail with EBUSY (make test,
    2026-12-02): moved out, or gone, at the next try (10 ms apart)."""
    for _ in range(tries):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP2 / "cgroup.procs").write_text(pid)
        try:
            cgroup.rmdir()
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
        time.sleep(0.01)
    cgroup.rmdir()


@contextlib.contextmanager
def partitioned(pids: Iterable[int], address: str) -> Iterator[int]:
    """Drop every packet of the processes `pids` and of `address` while inside; yields the
    number of rules. The processes keep running (unlike a freeze)."""
    pids = list(pids)
    tag = uuid.uuid4().hex[:8]
    chain, group = f"{PARTITION_PREFIX}{tag}", f"es-part-{tag}"
    cgroup = CGROUP2 / group
    cgroup.mkdir()
    try:
        for pid in pids:  # new sockets of these processes carry this cgroup
            with contextlib.suppress(ProcessLookupError, OSError):
                (cgroup / "cgroup.procs").write_text(str(pid))
        _iptables("-N", chain)
        try:
            rules = _rules(pids, address, group)
            for rule in rules:
                _iptables("-A", chain, *rule, "-j", "DROP")
            for hook in ("OUTPUT", "INPUT"):
                _iptables("-I", hook, "1", "-j", chain)
            yield len(rules)
        finally:
            for hook in ("OUTPUT", "INPUT"):
                with contextlib.suppress(subprocess.CalledProcessError):
                    _iptables("-D", hook, "-j", chain)
            _iptables("-F", chain)
            _iptables("-X", chain)
    finally:
        _release(cgroup)
    left = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True,
                          check=True).stdout
    assert chain not in left and not cgroup.exists(), f"partition {tag} left rules behind"
