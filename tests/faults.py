"""Fault injection for the hang tests, in one place: what to port when workers are real pods.

`PodFaults` is the one interface the end-to-end lanes use on the job's worker pods (kill, force
delete, freeze the training process, silence a node, partition a pod); below it, the primitives
for processes and addresses.

On this machine a worker is a set of processes (an sshd's sessions: horovodrun's training
processes) on a loopback address of its own. All of them share one network namespace, and Gloo
and Horovod's notification services talk over 127.0.0.1, not over the worker's own address; so
"partitioning a worker" means dropping every packet of its processes' sockets (by their exact
endpoints, and, for sockets they open later, by a cgroup v2 path they are moved to) and every
packet to or from its address (its sshd). With per-pod network namespaces (real nodes),
`partitioned` becomes two rules on the pod IP.

Every iptables rule lives in a chain of its own, jumped to from OUTPUT and INPUT; the chain and
the cgroup are removed in a finally, and `partitioned` checks that they are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

CGROUP2 = Path("/sys/fs/cgroup/unified")


class PodFaults:
    """Faults on the worker pods of one job, as they happen in a cluster (today: pods of the
    node agent, `tests.pods.AgentPods`; on real nodes: kubelet pods, same calls)."""

    def __init__(self, pods: Any, script: str) -> None:
        self.pods, self.script = pods, script  # AgentPods; the training script's file name

    def kill(self, *names: str, sig: int = signal.SIGKILL) -> None:
        """Every process of the pods gets `sig` at once (a crash, an OOM kill)."""
        for name in names:
            self.pods.agent.kill(self.pods.ref(name), sig)

    def force_delete(self, name: str) -> None:
        self.pods.core.delete_namespaced_pod(name, self.pods.namespace, grace_period_seconds=0)

    def training(self, name: str) -> list[psutil.Process]:
        """The training processes in the pod (horovodrun's workers, not the sshd)."""
        out = []
        for p in self.pods.processes(name):
            with contextlib.suppress(psutil.NoSuchProcess):
                if self.script in " ".join(p.cmdline()) and p.name().startswith("python"):
                    out.append(p)
        return out

    def freeze_training(self, name: str) -> list[int]:
        """SIGSTOP the pod's training processes only: a hung process on a healthy node."""
        pids = [p.pid for p in self.training(name)]
        if not pids:
            raise AssertionError(f"no training process in pod {name}")
        freeze(pids)
        return pids

    def silence_node(self, node: str) -> None:
        """The node's kubelet dies and the node hangs: Lease not renewed, pods frozen."""
        self.pods.agent.silence(node, freeze=True)

    def partition(self, name: str) -> contextlib.AbstractContextManager[int]:
        """While inside, no packet reaches or leaves the pod (its processes keep running)."""
        pod = self.pods.read(name)
        assert pod is not None
        return partitioned([p.pid for p in self.pods.processes(name)], pod["status"]["podIP"])


def freeze(pids: Iterable[int]) -> None:
    """SIGSTOP the processes (a hung process, or with all of a pod's, a hung machine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)


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


@contextlib.contextmanager
def partitioned(pids: Iterable[int], address: str) -> Iterator[int]:
    """Drop every packet of the processes `pids` and of `address` while inside; yields the
    number of rules. The processes keep running (unlike a freeze)."""
    pids = list(pids)
    tag = uuid.uuid4().hex[:8]
    chain, group = f"ES-PART-{tag}", f"es-part-{tag}"
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
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP2 / "cgroup.procs").write_text(pid)
        cgroup.rmdir()
    left = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True,
                          check=True).stdout
    assert chain not in left and not cgroup.exists(), f"partition {tag} left rules behind"
