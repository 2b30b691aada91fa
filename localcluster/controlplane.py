"""A real Kubernetes control plane, for tests, benchmarks, the demo and the real nodes.

Owns the lifecycle of four real processes built by `localcluster/build-binaries.sh`: etcd,
kube-apiserver (TLS, client-certificate admin, Node,RBAC authorization, ServiceAccount token
signing), kube-controller-manager (all default controllers: garbage collection, ServiceAccounts,
node lifecycle with a short grace period) and kube-scheduler. Everything lives in one temporary
directory (certificates, etcd data, logs, kubeconfigs) that is removed on a clean stop and kept,
with its path printed, when something failed. Everything listens on 127.0.0.1, except that
kube-apiserver binds to `Settings.bind_address`: loopback for a plane without nodes, an address
pods can reach for the real nodes of localcluster.nodes (then the `kubernetes` Service gets that
endpoint, and kube-apiserver reaches kubelets for exec and logs with its own client certificate).

Children run in their own sessions and get SIGKILL if this process dies (PR_SET_PDEATHSIG), so no
component outlives its owner. There is no kubelet: nodes and pod status are written by tests or
by the node agent, or run by real kubelets (localcluster.nodes).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.pki import Pki, client_cert, make_pki

HERE = Path(__file__).resolve().parent
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """A component is missing, did not become healthy, or died."""


def read_versions() -> dict[str, str]:
    """Return the pinned versions from localcluster/versions.env."""
    out: dict[str, str] = {}
    for raw in (HERE / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def default_bin_dir() -> Path:
    """Return where build-binaries.sh caches the binaries (ES_K8S_BIN_DIR overrides it)."""
    if override := os.environ.get("ES_K8S_BIN_DIR"):
        return Path(override)
    v = read_versions()
    cache = Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor"))
    return cache / "k8s" / f"{v['KUBE_VERSION']}-etcd{v['ETCD_VERSION']}" / "bin"


@dataclass(frozen=True)
class Settings:
    """How the local control plane is run. Durations in seconds."""

    bin_dir: Path = field(default_factory=default_bin_dir)
    # node-lifecycle: a node whose Lease is not renewed for this long is marked Unknown + tainted.
    node_monitor_grace_period_s: int = 8
    # node-lifecycle: how often the controller checks node health.
    node_monitor_period_s: int = 1
    start_timeout_s: float = 90.0
    # kube-apiserver's address. Not loopback when pods must reach it (real nodes): then the
    # endpoint reconciler publishes it as the `kubernetes` Service's endpoint.
    bind_address: str = "127.0.0.1"
    # kube-apiserver drains open watches on SIGTERM for longer than tests want to wait.
    stop_grace_s: float = 5.0


def free_ports(n: int) -> list[int]:
    """Return n distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL it when the parent thread dies.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def wait_http_ok(proc: subprocess.Popen[bytes], url: str, timeout_s: float, name: str, *,
                 tail: Callable[[], str], ctx: ssl.SSLContext | None = None) -> None:
    """Poll `url` until it answers 200; raise ControlPlaneError if `proc` exits first or
    `timeout_s` passes (with the log `tail`)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"{name} exited with {proc.returncode} while starting; log tail:\n{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.1)
    raise ControlPlaneError(
        f"{name} not healthy at {url} after {timeout_s:.0f}s (last: {last}); log tail:\n"
        f"{tail()}")


@dataclass
class _Component:
    name: str
    argv: list[str]
    log: Path
    health_url: str | None
    proc: subprocess.Popen[bytes] | None = None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

    Use as a context manager, or call start() and stop(). `kubeconfig` is the admin kubeconfig.
    """

    def __init__(self, settings: Settings | None = None, workdir: Path | None = None) -> None:
        self.settings = settings or Settings()
        self._workdir = workdir
        # Set by start(): the work directory and the admin kubeconfig in it.
        self.workdir = Path()
        self.kubeconfig = Path()
        self.failed = False
        self._components: dict[str, _Component] = {}
        self._ports: dict[str, int] = {}
        self.pki: Pki | None = None
        self._kubelet_client: tuple[Path, Path] = (Path(), Path())

    # -- public -------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://{self.settings.bind_address}:{self._ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._ports['etcd']}"

    @property
    def ports(self) -> dict[str, int]:
        return dict(self._ports)

    def start(self) -> ControlPlane:
        """Start every component and wait until each is healthy; raise ControlPlaneError if not."""
        self._check_binaries()
        self.workdir = self._workdir or Path(tempfile.mkdtemp(prefix="es-cluster-"))
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        try:
            (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
            loopback = self.settings.bind_address == "127.0.0.1"
            self.pki = make_pki(self.workdir / "pki",
                                server_ips=() if loopback else (self.settings.bind_address,))
            self._kubelet_client = client_cert(self.workdir / "pki", "apiserver-kubelet-client",
                                               "kube-apiserver-kubelet-client", "system:masters")
            names = ["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"]
            self._ports = dict(zip(names, free_ports(len(names)), strict=True))
            self._write_kubeconfig(self.kubeconfig, user={
                "client-certificate": str(self.pki.admin_cert),
                "client-key": str(self.pki.admin_key),
            })
            for comp in self._define_components():
                self._components[comp.name] = comp
                self._launch(comp)
                self._wait_healthy(comp)
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def stop(self, keep_dir: bool | None = None, quiet: bool = False) -> None:
        """Stop all components (SIGTERM, grace, SIGKILL), then remove the workdir unless kept.

        The workdir is kept (and its path printed) when `keep_dir` is true, or when it is None and
        something failed.
        """
        for comp in reversed(list(self._components.values())):
            self._terminate(comp)
        busy = [p for p in self._ports.values() if not port_is_free(p)]
        if busy:
            self.failed = True
            print(f"localcluster: ports still in use after stop: {busy}", file=sys.stderr)
        keep = self.failed if keep_dir is None else keep_dir
        if keep and not quiet:
            print(f"localcluster: kept {self.workdir} (logs in logs/)", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart_apiserver(self, down_s: float = 0.0, crash: bool = False) -> None:
        """Stop kube-apiserver (SIGTERM, or SIGKILL with `crash`), stay down `down_s` seconds,
        start it again on the same port and wait until it is ready."""
        comp = self._components["apiserver"]
        if crash and comp.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(comp.proc.pid, signal.SIGKILL)
            comp.proc.wait()
        self._terminate(comp)
        time.sleep(down_s)
        self._launch(comp)
        self._wait_healthy(comp)

    def check_alive(self) -> None:
        """Raise ControlPlaneError if a component exited on its own."""
        for comp in self._components.values():
            if comp.proc is not None and comp.proc.poll() is not None:
                self.failed = True
                raise ControlPlaneError(
                    f"{comp.name} exited with {comp.proc.returncode}; log tail:\n{comp.tail()}"
                )

    def pids(self) -> dict[str, int]:
        return {c.name: c.proc.pid for c in self._components.values() if c.proc is not None}

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (makes older resourceVersions 410); return it."""
        head = self._etcd_post("/v3/kv/range", {"key": "AA=="})  # any key; we want the header
        rev = int(head["header"]["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev

    def write_cert_kubeconfig(self, path: Path, name: str, cn: str,
                              org: str | None = None) -> Path:
        """Issue a client certificate CN=`cn` (O=`org`) and write a kubeconfig using it."""
        assert self.pki is not None
        crt, key = client_cert(self.pki.ca_cert.parent, name, cn, org)
        self._write_kubeconfig(path, user={"client-certificate": str(crt),
                                           "client-key": str(key)})
        return path

    def write_token_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """Write a kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        self._write_kubeconfig(path, user={"token": token}, namespace=namespace)
        return path

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.failed = True
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def _check_binaries(self) -> None:
        missing = [
            b for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
            if not os.access(self.settings.bin_dir / b, os.X_OK)
        ]
        if missing:
            raise ControlPlaneError(
                f"control-plane binaries missing in {self.settings.bin_dir}: {', '.join(missing)}"
                " (run: make setup)"
            )

    def _write_kubeconfig(
        self, path: Path, user: dict[str, str], namespace: str = "default"
    ) -> None:
        assert self.pki is not None
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "local", "context": {
                "cluster": "local", "user": "user", "namespace": namespace}}],
            "current-context": "local",
        }
        # JSON is valid YAML; the kubeconfig loader reads either.
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)

    def _define_components(self) -> list[_Component]:
        assert self.pki is not None
        b, w, p, s = self.settings.bin_dir, self.workdir, self._ports, self.settings
        logs = w / "logs"
        kc = str(self.kubeconfig)
        etcd = _Component("etcd", [
            str(b / "etcd"), "--name=default", f"--data-dir={w / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=default=http://127.0.0.1:{p['etcd-peer']}",
            # Test cluster on a shared disk: durability is not what we test, latency is.
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], logs / "etcd.log", f"http://127.0.0.1:{p['etcd']}/health")
        apiserver = _Component("apiserver", [
            str(b / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            f"--bind-address={s.bind_address}", f"--advertise-address={s.bind_address}",
            f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={self.pki.server_cert}",
            f"--tls-private-key-file={self.pki.server_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            # As hardened clusters (OpenShift): blockOwnerDeletion needs the owner's finalizers.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--allow-privileged=true",
            # exec, logs and port-forward go to the kubelets with this identity.
            f"--kubelet-client-certificate={self._kubelet_client[0]}",
            f"--kubelet-client-key={self._kubelet_client[1]}",
            "--kubelet-preferred-address-types=InternalIP",
            # Without nodes there is no Service network: no kubernetes Endpoints on loopback.
            *(["--endpoint-reconciler-type=none"] if s.bind_address == "127.0.0.1" else []),
            "--profiling=false", "--v=1",
        ], logs / "apiserver.log", f"https://{s.bind_address}:{p['apiserver']}/readyz")

        def client_and_serving(port: int) -> list[str]:
            # The admin kubeconfig for API access and delegated authn/z; /healthz on loopback.
            return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                    f"--secure-port={port}", "--leader-elect=false", "--profiling=false",
                    "--v=1"]

        controller_manager = _Component("controller-manager", [
            str(b / "kube-controller-manager"),
            *client_and_serving(p["controller-manager"]),
            f"--cert-dir={w / 'controller-manager'}",
            "--controllers=*",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            f"--node-monitor-grace-period={s.node_monitor_grace_period_s}s",
            f"--node-monitor-period={s.node_monitor_period_s}s",
            # Its default, /usr/libexec/kubernetes/..., would be created on the host.
            f"--flex-volume-plugin-dir={w / 'flexvolume'}",
        ], logs / "controller-manager.log", f"https://127.0.0.1:{p['controller-manager']}/healthz")
        scheduler = _Component("scheduler", [
            str(b / "kube-scheduler"), *client_and_serving(p["scheduler"]),
        ], logs / "scheduler.log", f"https://127.0.0.1:{p['scheduler']}/healthz")
        return [etcd, apiserver, controller_manager, scheduler]

    def _launch(self, comp: _Component) -> None:
        with comp.log.open("ab") as log:
            comp.proc = subprocess.Popen(
                comp.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True,
                # Only prctl() between fork and exec; started from the owning thread.
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )

    def _ssl_context(self, comp: _Component) -> ssl.SSLContext:
        if comp.name == "apiserver":
            assert self.pki is not None
            return ssl.create_default_context(cafile=str(self.pki.ca_cert))
        # controller-manager and scheduler serve /healthz with a self-signed certificate.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _wait_healthy(self, comp: _Component) -> None:
        assert comp.proc is not None and comp.health_url is not None
        ctx = self._ssl_context(comp) if comp.health_url.startswith("https") else None
        wait_http_ok(comp.proc, comp.health_url, self.settings.start_timeout_s, comp.name,
                     tail=comp.tail, ctx=ctx)

    def _terminate(self, comp: _Component) -> None:
        proc = comp.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.settings.stop_grace_s)
            except subprocess.TimeoutExpired:
                print(f"localcluster: {comp.name} ignored SIGTERM, killing", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Anything the component forked into its session goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        comp.proc = None

    def _etcd_post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

