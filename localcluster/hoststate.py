"""What real nodes change on this machine, recorded before and put back after.

Real kubelets, containerd, CNI and kube-proxy touch host-wide state: sysctls (ip_forward, the
kubelet's kernel tunables, conntrack), iptables chains and rules, network namespaces in /run/netns,
shim sockets in /run/containerd, /var/lib/kubelet/device-plugins, /var/lib/cni, the symlinks in
/var/log/containers, and cgroups. `HostSnapshot.take()` records what exists before a cluster
starts; `restore()` removes what appeared since and sets every recorded sysctl back, so a
teardown leaves the machine as it found it. `leftovers()` lists what is still different (a test
checks it after teardown).

Only iptables rules and chains that did not exist before are removed, and never the partitions
of loopback hosts (chains PARTITION_PREFIX*, tests/faults.py) that tests running beside a
cluster hold meanwhile: a cluster's teardown in one test lane once removed another lane's live
partition (its test then failed to flush a chain that was gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Host-wide sysctls that the kubelet (protectKernelDefaults: false), CNI and kube-proxy may set.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/bridge/bridge-nf-call-iptables",
)
# Directories some component creates at a fixed path whatever its configuration.
FIXED_DIRS = (
    Path("/run/netns"),
    Path("/run/containerd"),
    Path("/var/lib/kubelet"),
    Path("/var/lib/cni"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/usr/libexec/kubernetes"),
    Path("/etc/cni"),
    Path("/opt/cni"),
)
IPTABLES = ("iptables", "ip6tables")
BUILTIN_CHAINS = frozenset({"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"})

# The chains of tests/faults.py's partitions of loopback hosts: not a cluster's, never removed
# by its teardown (a test in another lane holds them).
PARTITION_PREFIX = "ES-PART-"


def _read_sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", key).write_text(value + "\n")


def _iptables_save(cmd: str) -> dict[str, tuple[set[str], list[str]]]:
    """Return table -> (chain names, rule lines '-A ...') as `<cmd>-save` prints them."""
    try:
        out = subprocess.run([f"{cmd}-save"], capture_output=True, text=True, check=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    tables: dict[str, tuple[set[str], list[str]]] = {}
    table = ""
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = (set(), [])
        elif line.startswith(":") and table:
            tables[table][0].add(line[1:].split()[0])
        elif line.startswith("-A ") and table:
            tables[table][1].append(line)
    return tables


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=False).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _entries(d: Path) -> set[str]:
    try:
        return set(os.listdir(d))
    except OSError:
        return set()


def unmount_below(root: Path) -> int:
    """Unmount every mount point at or below `root`, deepest first (lazily if busy)."""
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(root) or point.startswith(str(root).rstrip("/") + "/"):
                mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return len(set(mounts))


@dataclass
class HostSnapshot:
    """The host state real nodes may change, as it was before they started."""

    sysctls: dict[str, str | None] = field(default_factory=dict)
    iptables: dict[str, dict[str, tuple[set[str], list[str]]]] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)
    dirs: dict[Path, bool] = field(default_factory=dict)
    netns: set[str] = field(default_factory=set)
    log_links: set[str] = field(default_factory=set)

    def to_json(self) -> str:
        return json.dumps({
            "sysctls": self.sysctls,
            "iptables": {cmd: {t: [sorted(c), r] for t, (c, r) in tables.items()}
                         for cmd, tables in self.iptables.items()},
            "links": sorted(self.links), "dirs": {str(d): e for d, e in self.dirs.items()},
            "netns": sorted(self.netns), "log_links": sorted(self.log_links)})

    @classmethod
    def from_json(cls, text: str) -> HostSnapshot:
        raw = json.loads(text)
        return cls(
            sysctls=raw["sysctls"],
            iptables={cmd: {t: (set(c), list(r)) for t, (c, r) in tables.items()}
                      for cmd, tables in raw["iptables"].items()},
            links=set(raw["links"]), dirs={Path(d): e for d, e in raw["dirs"].items()},
            netns=set(raw["netns"]), log_links=set(raw["log_links"]))

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(
            sysctls={k: _read_sysctl(k) for k in SYSCTLS},
            iptables={cmd: _iptables_save(cmd) for cmd in IPTABLES if shutil.which(cmd)},
            links=_links(),
            dirs={d: d.exists() for d in FIXED_DIRS},
            netns=_entries(Path("/run/netns")),
            log_links=_entries(Path("/var/log/containers")),
        )

    def restore(self, cgroup_roots: tuple[str, ...] = ()) -> list[str]:
        """Put the host back as it was; return what could not be put back (one line each)."""
        problems = []
        for name in sorted(_entries(Path("/run/netns")) - self.netns):
            path = Path("/run/netns", name)
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                path.unlink()
        for name in sorted(_entries(Path("/var/log/containers")) - self.log_links):
            with contextlib.suppress(OSError):
                Path("/var/log/containers", name).unlink()
        for link in sorted(_links() - self.links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        for cmd, before in self.iptables.items():
            self._restore_iptables(cmd, before)
        for root in cgroup_roots:
            problems += remove_cgroup(root)
        for d, existed in self.dirs.items():
            if not existed and d.exists():
                unmount_below(d)
                shutil.rmtree(d, ignore_errors=True)
        for key, value in self.sysctls.items():
            if value is not None and _read_sysctl(key) != value:
                _write_sysctl(key, value)
        return problems + self.leftovers(cgroup_roots)

    @staticmethod
    def _restore_iptables(cmd: str, before: dict[str, tuple[set[str], list[str]]]) -> None:
        now = _iptables_save(cmd)
        for table, (chains, rules) in now.items():
            old_chains, old_rules = before.get(table, (set(), []))
            old = set(old_rules)
            # Rules first (they may jump to new chains), newest first; then the new chains.
            for rule in reversed(rules):
                if rule in old or PARTITION_PREFIX in rule:
                    continue
                args = shlex.split(rule)
                subprocess.run([cmd, "-w", "-t", table, "-D", *args[1:]],
                               capture_output=True, check=False)
            new = sorted(c for c in chains - old_chains - BUILTIN_CHAINS
                         if not c.startswith(PARTITION_PREFIX))
            for chain in new:
                subprocess.run([cmd, "-w", "-t", table, "-F", chain], capture_output=True,
                               check=False)
            for chain in new:
                subprocess.run([cmd, "-w", "-t", table, "-X", chain], capture_output=True,
                               check=False)

    def leftovers(self, cgroup_roots: tuple[str, ...] = ()) -> list[str]:
        """What differs from the snapshot now (empty: the host is as it was)."""
        out = []
        for key, value in self.sysctls.items():
            if value is not None and _read_sysctl(key) != value:
                out.append(f"sysctl {key}={_read_sysctl(key)} (was {value})")
        for cmd, before in self.iptables.items():
            now = _iptables_save(cmd)
            for table, (chains, rules) in now.items():
                old_chains, old_rules = before.get(table, (set(), []))
                if extra := sorted(c for c in chains - old_chains - BUILTIN_CHAINS
                                   if not c.startswith(PARTITION_PREFIX)):
                    out.append(f"{cmd} -t {table}: chains {extra}")
                if extra_rules := [r for r in rules if r not in set(old_rules)
                                   and PARTITION_PREFIX not in r]:
                    out.append(f"{cmd} -t {table}: {len(extra_rules)} rules, e.g. "
                               f"{extra_rules[0]}")
        if extra_links := sorted(_links() - self.links):
            out.append(f"network links {extra_links}")
        if extra_ns := sorted(_entries(Path("/run/netns")) - self.netns):
            out.append(f"network namespaces {extra_ns}")
        for d, existed in self.dirs.items():
            if not existed and d.exists():
                out.append(f"directory {d}")
        for root in cgroup_roots:
            for hierarchy in cgroup_hierarchies():
                if (hierarchy / root.lstrip("/")).exists():
                    out.append(f"cgroup {hierarchy / root.lstrip('/')}")
        return out


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies: v1 (cpu, memory, pids, freezer, ...) and, on a hybrid
    host, the unified one (runc makes every container's cgroup there too)."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if parts[2] in ("cgroup", "cgroup2"):
                out.append(Path(parts[1]))
    return out


def cgroup_pids(root: str) -> set[int]:
    """Every process in cgroup `root` or below it, in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / root.lstrip("/")
        for procs in base.rglob("cgroup.procs") if base.exists() else ():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroup(root: str) -> list[str]:
    """Remove cgroup `root` and its children in every hierarchy (they must be empty)."""
    problems = []
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / root.lstrip("/")
        if not base.exists():
            continue
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        try:
            base.rmdir()
        except OSError as e:
            problems.append(f"cgroup {base}: {e.strerror}")
    return problems
