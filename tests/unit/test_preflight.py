"""The pure parts of localcluster/preflight.py: which cgroup v1 controllers a mountinfo shows, and
which Debian packages a set of binaries points to. (The kernel probes run in `make setup`.)"""

from __future__ import annotations

import pytest

from localcluster.preflight import TOOLS, missing_tools, mounted_cgroup_v1_controllers

# This machine's /proc/self/mountinfo (cgroup v1, the unified hierarchy holding nothing useful).
V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# A cgroup v2-only machine (systemd's default since Debian 11).
V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
# Controllers co-mounted in one hierarchy (some distributions' cpu,cpuacct).
COMOUNTED = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"


@pytest.mark.parametrize(("mountinfo", "expected"), [
    (V1, {"rw", "cpu", "cpuacct", "memory", "freezer", "pids", "name=systemd"}),
    (V2, set()),
    (COMOUNTED, {"rw", "cpu", "cpuacct"}),
    ("", set()),
], ids=["this machine: v1", "v2 only: nothing", "co-mounted controllers", "unreadable"])
def test_cgroup_v1_controllers_from_mountinfo(mountinfo: str, expected: set[str]) -> None:
    assert mounted_cgroup_v1_controllers(mountinfo) == expected


def test_nothing_missing_when_every_tool_is_there() -> None:
    assert missing_tools({tool: f"/usr/bin/{tool}" for tool in TOOLS}) == []


def test_missing_tools_name_their_package_once() -> None:
    which: dict[str, str | None] = {tool: f"/usr/bin/{tool}" for tool in TOOLS}
    which.update(containerd=None, ctr=None, debootstrap=None)
    assert missing_tools(which) == ["no containerd, ctr (Debian containerd)",
                                    "no debootstrap (Debian debootstrap)"]
