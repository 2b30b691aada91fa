"""A cluster's teardown puts back the iptables it found, and leaves alone the partitions of
loopback hosts that a test in another lane holds meanwhile (tests/faults.py): removing one
made that test fail to flush its own chain."""

from __future__ import annotations

import subprocess
import uuid

from localcluster.hoststate import PARTITION_PREFIX, HostSnapshot


def iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True, text=True)


def chains() -> str:
    return subprocess.run(["iptables", "-w", "-S"], check=True, capture_output=True,
                          text=True).stdout


def test_a_restore_removes_what_came_after_but_not_a_live_partition() -> None:
    tag = uuid.uuid4().hex[:8]
    ours, theirs = f"ES-HOSTSTATE-{tag}", f"{PARTITION_PREFIX}{tag}"
    before = HostSnapshot.take()
    try:
        for chain in (ours, theirs):
            iptables("-N", chain)
            iptables("-A", chain, "-s", "127.0.0.99", "-j", "DROP")
            iptables("-I", "INPUT", "1", "-j", chain)
        assert before.leftovers() != [], "the cluster's chain is a leftover"
        before.restore()
        now = chains()
        assert ours not in now, "what came after the snapshot is removed"
        assert f"-N {theirs}" in now and f"-A INPUT -j {theirs}" in now, now
        assert before.leftovers() == [], "a live partition is no cluster's leftover"
    finally:
        for chain in (ours, theirs):
            subprocess.run(["iptables", "-w", "-D", "INPUT", "-j", chain], capture_output=True,
                           check=False)
            subprocess.run(["iptables", "-w", "-F", chain], capture_output=True, check=False)
            subprocess.run(["iptables", "-w", "-X", chain], capture_output=True, check=False)
