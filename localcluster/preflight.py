"""Can this machine run real nodes (containerd + runc + CNI + kubelet) and build their images?

`problems()` returns what is missing, one short phrase each, and `python -m localcluster.preflight`
prints them on ONE line and exits 1 (`make setup` runs it after installing the Debian packages;
the local cluster calls `problems()` before it starts nodes). Each kernel feature is tried for
real, not read from a config file: an overlay mount inside a private mount namespace, a bridge,
a veth pair and an iptables NAT rule inside a network namespace of its own. Those namespaces die
with the probe, so the probe leaves nothing behind on the host.

Standard library only: setup runs this with the system python3 before the virtualenv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# cgroup v1 hierarchies the kubelet (cgroupfs driver), runc and the node faults (freezer) use.
CGROUP_V1_CONTROLLERS = ("cpu", "memory", "pids", "freezer")
# Binaries of the Debian packages `make setup` installs, by package.
TOOLS = {
    "containerd": "containerd", "ctr": "containerd", "runc": "runc", "iptables": "iptables",
    "conntrack": "conntrack", "dockerd": "docker.io", "docker": "docker.io",
    "debootstrap": "debootstrap", "ip": "iproute2", "unshare": "util-linux", "mount": "mount",
    "busybox": "busybox-static",
}
CNI_PLUGINS = Path("/usr/lib/cni")  # containernetworking-plugins
PROBE_TIMEOUT_S = 20

# Shell probes, each in namespaces of its own (nothing they create survives them).
OVERLAY_PROBE = (
    "set -e; d=$(mktemp -d); trap 'rmdir \"$d\"' EXIT; mount -t tmpfs tmpfs \"$d\"; "
    "mkdir \"$d/l\" \"$d/u\" \"$d/w\" \"$d/m\"; "
    "mount -t overlay overlay -o \"lowerdir=$d/l,upperdir=$d/u,workdir=$d/w\" \"$d/m\"; "
    "umount \"$d/m\" \"$d\""
)
NETWORK_PROBES = {
    "network namespaces": "true",
    "bridges (ip link add type bridge)": "ip link add es-probe0 type bridge",
    "veth pairs": "ip link add es-probe1 type veth peer name es-probe2",
    "iptables nat (MASQUERADE)": "iptables -w 5 -t nat -A POSTROUTING -j MASQUERADE",
}


def mounted_cgroup_v1_controllers(mountinfo: str) -> set[str]:
    """Return the cgroup v1 controllers mounted, from the text of /proc/self/mountinfo."""
    found: set[str] = set()
    for line in mountinfo.splitlines():
        _, sep, after = line.partition(" - ")
        fields = after.split()
        if sep and len(fields) >= 3 and fields[0] == "cgroup":
            found.update(fields[2].split(","))
    return found


def missing_tools(which: dict[str, str | None]) -> list[str]:
    """Return one phrase per Debian package whose binaries `which` (name -> path) lacks."""
    packages: dict[str, list[str]] = {}
    for tool, package in TOOLS.items():
        if which.get(tool) is None:
            packages.setdefault(package, []).append(tool)
    return [f"no {', '.join(tools)} (Debian {package})" for package, tools in packages.items()]


def _probe(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def problems() -> list[str]:
    """Return what keeps this machine from running real nodes; empty when nothing does."""
    if os.geteuid() != 0:
        # Without root none of the probes below can pass: name the cause, not its symptoms.
        return ["not root (containerd, runc, kubelets and network namespaces need root)"]
    found = missing_tools({tool: shutil.which(tool) for tool in TOOLS})
    if not (CNI_PLUGINS / "bridge").exists() or not (CNI_PLUGINS / "host-local").exists():
        found.append(f"no CNI bridge/host-local plugins in {CNI_PLUGINS} "
                     "(Debian containernetworking-plugins)")
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    mounted = mounted_cgroup_v1_controllers(mountinfo)
    absent = [c for c in CGROUP_V1_CONTROLLERS if c not in mounted]
    if absent:
        found.append(f"no cgroup v1 hierarchy for {', '.join(absent)}")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return found  # the kernel probes need them; already named above
    if not _probe(["unshare", "--mount", "--propagation", "private", "sh", "-c", OVERLAY_PROBE]):
        found.append("overlayfs (an overlay mount failed)")
    for feature, command in NETWORK_PROBES.items():
        if shutil.which(command.split()[0]) is None and command != "true":
            continue  # a missing ip/iptables is already named
        if not _probe(["unshare", "--net", "sh", "-c", command]):
            found.append(feature)
            if command == "true":
                break  # no network namespace: the other network probes cannot run
    return found


def main() -> int:
    """Print the problems on one line and return 1, or return 0 when there are none."""
    found = problems()
    if found:
        print(f"preflight: this machine cannot run real nodes: {'; '.join(found)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
