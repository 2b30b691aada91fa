"""Real Kubernetes nodes on this machine: per node its own containerd and kubelet; one kube-proxy.

`Cluster` starts the control plane (kube-apiserver bound to an address pods can reach), then N
nodes, each a real kubelet v1.34 with its own containerd (root, state, socket, runc root), CNI
bridge and pod subnet, node IP, cgroup root in every v1 hierarchy, root and cert directories and
ports; and one kube-proxy (iptables mode) so that the `kubernetes` Service works from pods. Pods
are real containers (runc, overlayfs), each in its own network namespace with its own IP, routed
between nodes by this host. Images come from no registry: every node's containerd root is a
hard-linked copy of one store they were imported into (localcluster.nodestore).

Layout of the host network (all on devices this module creates and removes):
  bridge es-host: 10.252.0.1 (kube-apiserver) and 10.252.0.<10+i> (node i's IP)
  bridge es-cni<i>: 10.244.<i>.1, the gateway of node i's pods (10.244.<i>.0/24)
  Services: 10.0.0.0/24 (the `kubernetes` Service is 10.0.0.1:443)

Faults are real: `stop_kubelet` (the node controller marks the node NotReady after its grace, the
Lease is no longer renewed), `freeze` (the v1 freezer stops every process of the node: kubelet,
containerd, shims and pods; the kernel still answers TCP), `partition` (iptables drops the
node's or a pod's packets), and anything done to a container's processes.

Teardown leaves nothing behind (processes, mounts, bridges, iptables chains, netns, cgroups,
sysctls as they were: see localcluster.hoststate); a failed start keeps its directory and prints
it. One cluster with nodes per machine at a time (a lock file says whose it is).

Pools: with `pools` > 1 the nodes are split into that many pools of equal size (label
POOL_LABEL: a, b, ...), so that tests can run side by side on disjoint nodes of the one cluster
(tests/conftest.py). `Cluster.view(pool)` is a pool's nodes in the owner's process;
`Cluster.share(path)` writes what another process needs to `Cluster.attach(path, pool)`: the
kubeconfig, the binaries, and each node's directories, cgroup and kubelet. A view or an attached
cluster stops nothing: the owner's stop() does, for every node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubernetes import client, config

from localcluster import images, nodestore
from localcluster.controlplane import (
    ControlPlane,
    ControlPlaneError,
    Settings,
    _die_with_parent,
    free_ports,
)
from localcluster.hoststate import (
    HostSnapshot,
    cgroup_hierarchies,
    cgroup_pids,
    unmount_below,
)
from localcluster.nodestore import tool_env as _env
from localcluster.tarimage import toolbox_image

HOST_BRIDGE = "es-host"
NODE_NET = "10.252.0"
APISERVER_IP = f"{NODE_NET}.1"
POD_NET = "10.244"
SERVICE_CIDR = "10.0.0.0/24"
CNI_BIN = Path("/usr/lib/cni")
LOCK = Path("/run/elastic-supervisor-nodes.lock")
# What the running cluster must put back (HostSnapshot), its work directory and cgroup roots:
# kept while it runs, so that a cluster whose owner was killed is cleaned up by the next one.
RECORD = Path("/run/elastic-supervisor-nodes.json")
NODE_LABEL = "elastic-supervisor.io/local-node"
POOL_LABEL = "elastic-supervisor.io/pool"


def image_store(tarballs: Sequence[Path]) -> Path:
    """The containerd root every node's is a hard-linked copy of: the pause and toolbox images
    and `tarballs`, imported once and cached (localcluster.nodestore)."""
    return nodestore.seed((images.pause()[1], toolbox_image()[1], *tarballs),
                          images.Settings().cache, _log)


class ClusterError(RuntimeError):
    """A node component is missing, did not become ready, or died."""


@dataclass(frozen=True)
class ClusterSettings:
    """How the local cluster with real nodes is run. Durations in seconds."""

    nodes: int = 3
    # The node controller's grace before NotReady. The kubelet renews its Lease every 10 s
    # (a quarter of the 40 s lease), so this must be well above 10; production is 50.
    node_monitor_grace_period_s: int = 20
    # Images (docker-save tarballs) every node's containerd holds from its start, besides the
    # pause image and the toolbox image (localcluster.tarimage): imported once into a cached
    # store that each node's root hard-links (localcluster.nodestore).
    images: tuple[Path, ...] = ()
    pause_image: str = ""  # set at start: localcluster.images' pause image
    start_timeout_s: float = 120.0
    # The pod subnet's host-local range per node: small ranges make the CNI reuse IPs soon.
    pod_ip_range: tuple[int, int] = (2, 254)
    extra_apiserver_args: tuple[str, ...] = ()
    # The kubelet's syncFrequency (its default is 60: ConfigMap volumes refresh that slowly).
    kubelet_sync_frequency_s: int = 10
    # The nodes split into this many pools of equal size (POOL_LABEL a, b, ...).
    pools: int = 1

    def pool_of(self, index: int) -> str:
        """The pool of node `index` (1-based)."""
        if not 1 <= self.pools <= 8 or self.nodes % self.pools:
            raise ClusterError(f"{self.nodes} nodes do not split into {self.pools} pools")
        return "abcdefgh"[(index - 1) // (self.nodes // self.pools)]


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log: Path
    cgroup: str | None = None  # joins this cgroup (every hierarchy) before exec
    proc: subprocess.Popen[bytes] | None = None
    # Another process's child (an attached cluster's view of the owner's kubelet): by pid.
    pid: int | None = None
    # Started by a process that is not the cluster's owner: it must outlive that process (the
    # owner's stop() kills it with every process of the node's cgroup).
    detached: bool = False

    def start(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        cgroup, detached = self.cgroup, self.detached

        def prepare() -> None:
            if not detached:
                _die_with_parent()
            if cgroup is not None:
                _join_cgroup(cgroup, os.getpid())

        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, cwd=cwd,
                                         env=env, start_new_session=True,
                                         preexec_fn=prepare)  # noqa: PLW1509
        self.pid = None

    def alive(self) -> bool:
        if self.proc is None and self.pid is not None:
            return Path(f"/proc/{self.pid}").exists()
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            pid, self.pid = self.pid, None
            if pid is not None:  # not our child: its process group, SIGKILLed at once
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _join_cgroup(root: str, pid: int) -> None:
    for hierarchy in cgroup_hierarchies():
        procs = hierarchy / root.lstrip("/") / "cgroup.procs"
        if procs.exists():
            procs.write_text(str(pid))


def make_cgroup(root: str) -> None:
    """Create cgroup `root` in every v1 hierarchy; cpuset gets its parent's cpus and mems."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / root.lstrip("/")
        created = []
        for part in Path(root.lstrip("/")).parts:
            created.append(part)
            d = hierarchy.joinpath(*created)
            if not d.exists():
                d.mkdir()
                if (d / "cpuset.cpus").exists():
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
        assert path.exists()


@dataclass(frozen=True)
class NodeSpec:
    """What differs between the nodes of one machine."""

    index: int
    name: str
    ip: str
    pod_subnet: str
    gateway: str
    bridge: str
    cgroup_root: str
    kubelet_port: int
    pool: str = "a"

    @classmethod
    def of(cls, index: int, port: int, pool: str = "a") -> NodeSpec:
        return cls(index=index, name=f"es-node-{index}", ip=f"{NODE_NET}.{10 + index}",
                   pod_subnet=f"{POD_NET}.{index}.0/24", gateway=f"{POD_NET}.{index}.1",
                   bridge=f"es-cni{index}", cgroup_root=f"/es-node-{index}",
                   kubelet_port=port, pool=pool)


class Node:
    """One real node: its containerd and kubelet, their files under `workdir`."""

    def __init__(self, spec: NodeSpec, workdir: Path, cp: ControlPlane,
                 settings: ClusterSettings, bin_dir: Path, *, detached: bool = False) -> None:
        self.spec, self.dir, self.cp, self.settings = spec, workdir, cp, settings
        self.bin_dir = bin_dir
        self.socket = self.dir / "containerd.sock"
        self.containerd = _Proc("containerd", ["containerd", "--config",
                                               str(self.dir / "containerd.toml")],
                                self.dir / "containerd.log", f"{spec.cgroup_root}/system")
        self.kubelet = _Proc("kubelet", detached=detached, argv=[
            str(bin_dir / "kubelet"), f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.dir / 'kubelet'}", f"--cert-dir={self.dir / 'pki'}",
            f"--hostname-override={spec.name}", f"--node-ip={spec.ip}",
            f"--node-labels={NODE_LABEL}={spec.name},{POOL_LABEL}={spec.pool}", "--v=1",
        ], log=self.dir / "kubelet.log", cgroup=f"{spec.cgroup_root}/system")
        self.frozen = False

    @property
    def name(self) -> str:
        return self.spec.name

    # -- lifecycle ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Write configuration, make the cgroups and the kubelet's kubeconfig."""
        s, d = self.spec, self.dir
        for sub in ("containerd/root", "containerd/state", "containerd/opt", "cni/net.d",
                    "cni/ipam", "kubelet", "pki", "pod-logs", "volume-plugins"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        make_cgroup(f"{s.cgroup_root}/system")
        lo, hi = self.settings.pod_ip_range
        base = s.pod_subnet.rsplit(".", 1)[0]
        (d / "cni/net.d/10-es.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"es-pods-{s.index}",
            "plugins": [
                {"type": "bridge", "bridge": s.bridge, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(d / "cni/ipam"),
                          "ranges": [[{"subnet": s.pod_subnet, "gateway": s.gateway,
                                       "rangeStart": f"{base}.{lo}",
                                       "rangeEnd": f"{base}.{hi}"}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "loopback"},
            ]}, indent=2))
        (d / "containerd.toml").write_text(_containerd_config(d, self.socket, s,
                                                              self.settings.pause_image))
        self.cp.write_cert_kubeconfig(d / "kubelet.kubeconfig", f"kubelet-{s.index}",
                                      f"system:node:{s.name}", "system:nodes")
        assert self.cp.pki is not None
        (d / "kubelet.yaml").write_text(json.dumps(_kubelet_config(
            d, self.socket, s, self.cp.pki.ca_cert, self.settings.kubelet_sync_frequency_s),
            indent=2))

    def start_containerd(self) -> None:
        self.containerd.start(self.dir, env=_env())
        _wait(lambda: self.socket.exists() and self._ctr("version").returncode == 0,
              30, f"{self.name}: containerd", self.containerd)

    def start_kubelet(self) -> None:
        """Start the kubelet (again). In an attached cluster it outlives this process."""
        self.kubelet.start(self.dir, env=_env())

    def kubelet_up(self) -> None:
        """Check the kubelet is still running after its start; start it once more if it exited
        on the known flake of its pod-resources socket (a rename within one directory failing
        with EXDEV, "invalid cross-device link": seen once in make test; k3s-io/k3s#4042)."""
        try:
            _wait(self.kubelet.alive, 1, f"{self.name}: kubelet", self.kubelet)
        except ClusterError:
            with contextlib.suppress(OSError):
                log = self.kubelet.log.read_text(errors="replace")
                if "podResources endpoint" in log and "invalid cross-device link" in log:
                    print(f"localcluster: {self.name}: the kubelet exited on its pod-resources "
                          "socket flake (k3s-io/k3s#4042); starting it again", file=sys.stderr)
                    self.start_kubelet()
                    time.sleep(1)
                    _wait(self.kubelet.alive, 1, f"{self.name}: kubelet", self.kubelet)
                    return
            raise

    def stop_kubelet(self) -> None:
        """Stop the kubelet (SIGKILL, like a crash): pods keep running, the Lease goes stale."""
        if self.kubelet.proc is None:  # another process's: the one running now
            self.kubelet.pid = self.running_kubelet()
        if self.kubelet.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.kubelet.proc.pid, signal.SIGKILL)
        self.kubelet.stop(0)

    def running_kubelet(self) -> int | None:
        """The running kubelet's pid, whoever started it: found in the node's cgroup by its
        command line (one started again by an attached process is not the owner's child)."""
        for pid in cgroup_pids(f"{self.spec.cgroup_root}/system"):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[0].endswith(b"/kubelet") and \
                        f"--hostname-override={self.name}".encode() in argv:
                    return pid
        return None

    def freeze(self) -> None:
        """Freeze every process of the node (kubelet, containerd, shims, pods)."""
        self._freezer("FROZEN")
        self.frozen = True

    def thaw(self) -> None:
        self._freezer("THAWED")
        self.frozen = False

    def _freezer(self, state: str) -> None:
        path = Path("/sys/fs/cgroup/freezer") / self.spec.cgroup_root.lstrip("/")
        (path / "freezer.state").write_text(state)
        deadline = time.monotonic() + 10
        while (path / "freezer.state").read_text().strip() != state:
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name}: freezer did not reach {state}")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop everything of the node: kubelet, every process in its cgroups, containerd."""
        if self.frozen:
            with contextlib.suppress(OSError, ClusterError):
                self.thaw()
        self.kubelet.stop(2)
        for _ in range(10):
            pids = cgroup_pids(self.spec.cgroup_root)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        self.containerd.stop(2)
        unmount_below(self.dir)

    # -- helpers ------------------------------------------------------------------------------

    def _ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, text=True, check=False, timeout=timeout,
                              env=_env())

    def ctr(self, *args: str, timeout: float = 60) -> str:
        """Run `ctr` against this node's containerd (namespace k8s.io); return its output."""
        res = self._ctr(*args, timeout=timeout)
        if res.returncode != 0:
            raise ClusterError(f"{self.name}: ctr {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def pids(self) -> set[int]:
        """Every process of this node (kubelet, containerd, shims, containers)."""
        return cgroup_pids(self.spec.cgroup_root)

    def pod_pids(self, uid: str) -> set[int]:
        """The processes of pod `uid`'s containers (and its sandbox) on this node."""
        base = Path("/sys/fs/cgroup/pids") / self.spec.cgroup_root.lstrip("/") / "kubepods"
        pids: set[int] = set()
        for d in base.rglob(f"pod{uid}"):
            for procs in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(x) for x in procs.read_text().split())
        return pids


def _log(line: str) -> None:
    print(f"localcluster: {line}", file=sys.stderr)


def _containerd_config(d: Path, socket: Path, s: NodeSpec, pause: str) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d / 'containerd/root'}"
state = "{d / 'containerd/state'}"
oom_score = 0
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{d / 'containerd.ttrpc.sock'}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'containerd/opt'}"
[{cri}]
  sandbox_image = "{pause}"
  # The sandbox lacks CAP_SYS_RESOURCE: without this every container start fails in runc
  # ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  Root = "{d / 'containerd/runc'}"
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{d / 'cni/net.d'}"
  max_conf_num = 1
[{cri}.registry]
  config_path = ""
"""


def _kubelet_config(d: Path, socket: Path, s: NodeSpec, ca: Path,
                    sync_s: int) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": s.ip, "port": s.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
        "authentication": {"x509": {"clientCAFile": str(ca)}, "webhook": {"enabled": True},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": s.cgroup_root, "cgroupsPerQOS": True,
        "failSwapOn": False, "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "imageServiceEndpoint": f"unix://{socket}",
        "podLogsDir": str(d / "pod-logs"), "volumePluginDir": str(d / "volume-plugins"),
        # Tests and the demo read container logs from here: no rotation within a run.
        "containerLogMaxSize": "1Gi",
        # Absolute, low thresholds: the disk and memory are shared with the other nodes and
        # the rest of the machine (1% of a 252 GB shared disk is 2.5 GB that others may take:
        # the kubelet then evicts for DiskPressure in the middle of a test).
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "100Mi",
                         "imagefs.available": "100Mi", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "syncFrequency": f"{sync_s}s", "nodeStatusUpdateFrequency": "5s",
        "nodeLeaseDurationSeconds": 40,
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE to lower it
        "serializeImagePulls": False, "maxPods": 110,
        "resolvConf": "/etc/resolv.conf",
        "makeIPTablesUtilChains": False,
        "shutdownGracePeriod": "0s",
        "registerNode": True,
    }


# The kubelet's device-plugin registration socket: the same path for every kubelet on the host.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def _device_plugin_socket() -> tuple[int, int] | None:
    """The socket file's inode and creation time (None: there is none): a kubelet that binds
    it makes a new one."""
    try:
        st = DEVICE_PLUGIN_SOCKET.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


def _wait(predicate: Callable[[], bool], timeout: float, what: str,
          proc: _Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
            raise ClusterError(f"{what}: exited with {proc.proc.returncode}; log tail:\n"
                               f"{proc.tail()}")
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(0.1)
    raise ClusterError(f"{what}: not ready after {timeout:.0f}s"
                       + (f"; log tail:\n{proc.tail()}" if proc is not None else ""))


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0 and "File exists" not in res.stderr:
        raise ClusterError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def _iptables(*args: str, check: bool = True) -> None:
    res = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise ClusterError(f"iptables {' '.join(args)}: {res.stderr.strip()}")


@dataclass
class Cluster:
    """A control plane and real nodes. Use as a context manager, or start() and stop()."""

    settings: ClusterSettings = field(default_factory=ClusterSettings)
    workdir: Path = field(default_factory=Path)
    cp: ControlPlane | None = None
    nodes: list[Node] = field(default_factory=list)
    failed: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # A view of one pool (`view`, `attach`): its nodes only; it stops nothing.
    pool: str | None = None
    owner: bool = True

    def __post_init__(self) -> None:
        self._snapshot: HostSnapshot | None = None
        self._proxy: _Proc | None = None
        self._lock_fd: int | None = None
        self._pause = Path()

    @property
    def kubeconfig(self) -> Path:
        assert self.cp is not None
        return self.cp.kubeconfig

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def start(self) -> Cluster:
        t0 = time.monotonic()
        self._lock()
        if leftovers := recover():
            print("localcluster: cleaned up after a cluster whose owner died:\n  "
                  + "\n  ".join(leftovers), file=sys.stderr)
        name, self._pause = images.pause()
        self.settings = replace(self.settings, pause_image=name)
        store = image_store(self.settings.images)
        self.timings["image_store_s"] = time.monotonic() - t0
        self._snapshot = HostSnapshot.take()
        self.workdir = Path(tempfile.mkdtemp(prefix="es-nodes-"))
        roots = [NodeSpec.of(i, 0).cgroup_root for i in range(1, self.settings.nodes + 1)]
        RECORD.write_text(json.dumps({"snapshot": self._snapshot.to_json(),
                                      "workdir": str(self.workdir), "cgroups": roots}))
        try:
            self._host_network()
            t_cp = time.monotonic()
            self.cp = ControlPlane(Settings(
                node_monitor_grace_period_s=self.settings.node_monitor_grace_period_s,
                bind_address=APISERVER_IP), workdir=self.workdir / "control-plane").start()
            self.timings["control_plane_s"] = time.monotonic() - t_cp
            bin_dir = self.cp.settings.bin_dir
            t1 = time.monotonic()
            ports = free_ports(self.settings.nodes)
            for i in range(1, self.settings.nodes + 1):
                spec = NodeSpec.of(i, ports[i - 1], self.settings.pool_of(i))
                node = Node(spec, self.workdir / spec.name, self.cp, self.settings, bin_dir)
                self.nodes.append(node)
                node.prepare()
                nodestore.populate(store, node.dir / "containerd" / "root")
                node.start_containerd()
            self.timings["images_s"] = time.monotonic() - t1
            # Every kubelet binds the same device-plugin registration socket (its path is
            # fixed, DEVICE_PLUGIN_SOCKET, whatever --root-dir says) after cleaning its
            # directory: two kubelets started at once can both clean, then both bind, and one
            # exits ("bind: address already in use": a cluster start on 2026-12-02, right
            # after `make images`). So one at a time, each once the one before has bound it.
            for node in self.nodes:
                before = _device_plugin_socket()
                node.start_kubelet()
                _wait(lambda was=before: _device_plugin_socket() not in (None, was), 60,
                      f"{node.name}: the kubelet's device-plugin socket", node.kubelet)
            self._start_proxy(bin_dir)
            self._wait_ready()
            self.timings["total_s"] = time.monotonic() - t0
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def view(self, pool: str) -> Cluster:
        """Pool `pool`'s nodes of this (started) cluster, for this process's tests."""
        nodes = [n for n in self.nodes if n.spec.pool == pool]
        if not nodes:
            raise ClusterError(f"no node in pool {pool!r}")
        return Cluster(settings=self.settings, workdir=self.workdir, cp=self.cp, nodes=nodes,
                       pool=pool, owner=False)

    def share(self, path: Path) -> Path:
        """Write what `attach` needs to `path` (JSON); return it."""
        assert self.cp is not None
        path.write_text(json.dumps({
            "kubeconfig": str(self.cp.kubeconfig), "workdir": str(self.workdir),
            "control_plane": str(self.cp.workdir), "bin_dir": str(self.cp.settings.bin_dir),
            "settings": {"nodes": self.settings.nodes, "pools": self.settings.pools,
                         "images": [str(p) for p in self.settings.images],
                         "pause_image": self.settings.pause_image,
                         "node_monitor_grace_period_s":
                             self.settings.node_monitor_grace_period_s},
            "nodes": [{**dataclasses.asdict(n.spec), "dir": str(n.dir)} for n in self.nodes],
        }, indent=2))
        return path

    @classmethod
    def attach(cls, path: Path, pool: str) -> Cluster:
        """Pool `pool` of the cluster another process started and `share`d to `path`."""
        record = json.loads(path.read_text())
        st = record["settings"]
        settings = ClusterSettings(
            nodes=st["nodes"], pools=st["pools"], images=tuple(Path(p) for p in st["images"]),
            pause_image=st["pause_image"],
            node_monitor_grace_period_s=st["node_monitor_grace_period_s"])
        cp = ControlPlane(Settings(bin_dir=Path(record["bin_dir"]), bind_address=APISERVER_IP,
                                   node_monitor_grace_period_s=st["node_monitor_grace_period_s"]))
        cp.kubeconfig, cp.workdir = Path(record["kubeconfig"]), Path(record["control_plane"])
        nodes = []
        for n in record["nodes"]:
            d = dict(n)
            node = Node(NodeSpec(**{k: v for k, v in d.items() if k != "dir"}), Path(d["dir"]),
                        cp, settings, cp.settings.bin_dir, detached=True)
            if node.spec.pool == pool:
                node.kubelet.pid = node.running_kubelet()
                nodes.append(node)
        if not nodes:
            raise ClusterError(f"no node in pool {pool!r} in {path}")
        return cls(settings=settings, workdir=Path(record["workdir"]), cp=cp, nodes=nodes,
                   pool=pool, owner=False)

    def _lock(self) -> None:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 100).decode(errors="replace").strip()
            os.close(fd)
            raise ClusterError(f"another local cluster with real nodes is running ({owner}); "
                               "one per machine") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._lock_fd = fd

    def _host_network(self) -> None:
        _ip("link", "add", HOST_BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{APISERVER_IP}/32", "dev", HOST_BRIDGE)
        for i in range(1, self.settings.nodes + 1):
            _ip("addr", "add", f"{NODE_NET}.{10 + i}/32", "dev", HOST_BRIDGE)
        _ip("link", "set", HOST_BRIDGE, "up")
        # Pods on one node reach pods on another (and the apiserver) through this host.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")

    def _start_proxy(self, bin_dir: Path) -> None:
        assert self.cp is not None
        d = self.workdir / "kube-proxy"
        d.mkdir()
        kc = self.cp.write_cert_kubeconfig(d / "kubeconfig", "kube-proxy", "system:kube-proxy")
        metrics, healthz = free_ports(2)
        (d / "config.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kc)}, "mode": "iptables",
            "clusterCIDR": f"{POD_NET}.0.0/16", "hostnameOverride": self.nodes[0].name,
            "bindAddress": "127.0.0.1",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            # Leave the host's conntrack sysctls and route_localnet alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
        }, indent=2))
        self._proxy = _Proc("kube-proxy", [str(bin_dir / "kube-proxy"),
                                           f"--config={d / 'config.yaml'}", "--v=1"],
                            d / "kube-proxy.log")
        self._proxy.start(d, env=_env())
        self._proxy_healthz = f"http://127.0.0.1:{healthz}/healthz"

    def _wait_ready(self) -> None:
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        core = client.CoreV1Api(api)
        try:
            def nodes_ready() -> bool:
                ready = 0
                for n in core.list_node().items:
                    for c in n.status.conditions or ():
                        if c.type == "Ready" and c.status == "True":
                            ready += 1
                return ready == len(self.nodes)

            for node in self.nodes:
                node.kubelet_up()
            _wait(nodes_ready, self.settings.start_timeout_s,
                  f"{len(self.nodes)} nodes Ready", self.nodes[0].kubelet)

            def proxy_ok() -> bool:
                with urllib.request.urlopen(self._proxy_healthz, timeout=2) as r:
                    return r.status == 200

            _wait(proxy_ok, 60, "kube-proxy healthz", self._proxy)
        finally:
            api.close()

    @contextlib.contextmanager
    def partition(self, *ips: str) -> Iterator[None]:
        """Drop every packet to and from `ips` (pods or nodes) while inside; then undo it."""
        rules = [(chain, flag, ip) for ip in ips
                 for chain, flag in (("FORWARD", "-s"), ("FORWARD", "-d"), ("INPUT", "-s"),
                                     ("OUTPUT", "-d"))]
        try:
            for chain, flag, ip in rules:
                _iptables("-I", chain, flag, ip, "-m", "comment", "--comment",
                          "elastic-supervisor partition", "-j", "DROP")
            yield
        finally:
            for chain, flag, ip in rules:
                _iptables("-D", chain, flag, ip, "-m", "comment", "--comment",
                          "elastic-supervisor partition", "-j", "DROP", check=False)

    @contextlib.contextmanager
    def cut_from_api(self, ip: str) -> Iterator[None]:
        """Drop every packet between `ip` (a pod) and the API server while inside (its other
        traffic flows): a launcher partitioned from the control plane only."""
        rules = [("INPUT", "-s", ip, "-d", APISERVER_IP), ("OUTPUT", "-s", APISERVER_IP, "-d", ip)]
        try:
            for chain, *match in rules:
                _iptables("-I", chain, *match, "-m", "comment", "--comment",
                          "elastic-supervisor cut from the API", "-j", "DROP")
            yield
        finally:
            for chain, *match in rules:
                _iptables("-D", chain, *match, "-m", "comment", "--comment",
                          "elastic-supervisor cut from the API", "-j", "DROP", check=False)

    def check_alive(self) -> None:
        """Raise ClusterError if a component exited on its own."""
        assert self.cp is not None
        try:
            self.cp.check_alive()
        except ControlPlaneError as e:
            self.failed = True
            raise ClusterError(str(e)) from e
        procs = [p for n in self.nodes for p in (n.containerd,)] + (
            [self._proxy] if self._proxy else [])
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                self.failed = True
                raise ClusterError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")

    def stop(self, keep_dir: bool | None = None) -> list[str]:
        """Stop everything and put the host back; return what could not be put back. A view
        stops nothing."""
        if not self.owner:
            return []
        if self._proxy is not None:
            self._proxy.stop(3)
        for node in reversed(self.nodes):
            node.stop()
        problems: list[str] = []
        if self.cp is not None:
            # Its directory is inside ours: removed (or kept) with it below.
            self.cp.stop(keep_dir=True, quiet=True)
        if self._snapshot is not None:
            problems = self._snapshot.restore(tuple(n.spec.cgroup_root for n in self.nodes))
            RECORD.unlink(missing_ok=True)
        if problems:
            self.failed = True
            print("localcluster: host state not restored:\n  " + "\n  ".join(problems),
                  file=sys.stderr)
        keep = self.failed if keep_dir is None else keep_dir
        if self.workdir != Path():
            unmount_below(self.workdir)
            if keep:
                # Logs and configuration stay; the image stores (gigabytes each) do not.
                for node in self.nodes:
                    shutil.rmtree(node.dir / "containerd" / "root", ignore_errors=True)
                print(f"localcluster: kept {self.workdir} (logs: */*.log)", file=sys.stderr)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        return problems

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.failed = True
        self.stop()


def recover() -> list[str]:
    """Clean up after a cluster whose owner died (the lock must be held): kill every process of
    its nodes, put the host back from its record, remove its work directory; then free the image
    stores of work directories no record names. Return what was done (empty: nothing to do)."""
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return prune_orphans()
    done = []
    roots = tuple(record.get("cgroups") or ())
    for _ in range(10):
        pids = set().union(*(cgroup_pids(r) for r in roots)) if roots else set()
        if not pids:
            break
        for root in roots:  # frozen processes die only once thawed
            freezer = Path("/sys/fs/cgroup/freezer") / root.lstrip("/") / "freezer.state"
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        done.append(f"killed {len(pids)} processes")
        time.sleep(0.3)
    workdir = Path(record.get("workdir") or "/nonexistent")
    unmount_below(workdir)
    problems = HostSnapshot.from_json(record["snapshot"]).restore(roots)
    done.append(f"host state restored ({len(problems)} problems left)" + (
        ": " + "; ".join(problems) if problems else ""))
    if workdir.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        done.append(f"removed {workdir}")
    RECORD.unlink(missing_ok=True)
    return done + prune_orphans()


def prune_orphans(tmp: Path | None = None) -> list[str]:
    """Free the containerd roots (gigabytes each) of work directories that no live cluster owns
    (the lock must be held): a machine restarted under a cluster loses the record in /run, not
    the directory in /tmp. Their logs stay for the post-mortem, as `Cluster.stop` keeps them."""
    done = []
    for workdir in sorted(Path(tmp or tempfile.gettempdir()).glob("es-nodes-*")):
        roots = [r for r in workdir.glob("*/containerd/root") if r.is_dir()]
        if not roots:
            continue
        unmount_below(workdir)
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
        done.append(f"freed the image stores of {workdir} (no live cluster owns it)")
    return done


def recover_stale() -> list[str]:
    """`recover` under the lock, for callers that are about to look at the host before they
    start a cluster: a dead owner's leftovers are not the host's state. Raises ClusterError if a
    live cluster holds the lock."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError("another local cluster with real nodes is running") from None
        return recover()
    finally:
        os.close(fd)


@contextlib.contextmanager
def cluster(settings: ClusterSettings | None = None) -> Iterator[Cluster]:
    c = Cluster(settings or ClusterSettings())
    with c:
        yield c
