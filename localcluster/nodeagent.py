"""A kubelet for fake nodes on this machine: real process trees for pods, kubelet-style status.

`NodeAgent(control_plane, AgentSettings(...))` registers nodes (Ready, with capacity, Leases
renewed by kubelet.Heartbeats), watches the pods bound to them and runs each pod as a process
tree under its own podinit (localcluster/podinit.py), whose exit code is the container's.

Worker pods (label elastic-supervisor/role=worker): an sshd on the pod's own loopback address
127.<block>.y.z (the podIP; an agent never hands one out twice, Horovod blacklists host names for
good) and the container port named `ssh` (else AgentSettings.ssh_port). It accepts the public
key found in a Secret volume the container mounts, under the key `authorized_keys` or
`ssh-publickey` (mpi-operator's layout), else AgentSettings.authorized_key. The container's own
command is not run: the worker image's job is to be an sshd. Other pods (the launcher) run their
container's command and args with the env of the spec plus POD_NAME, POD_NAMESPACE, HOSTNAME,
KUBECONFIG (a token of the pod's ServiceAccount, so RBAC applies as in a cluster) and
ES_VOLUME_ROOT (volumes, see podspec); output goes to `log_path(pod)`.

Deletion as a kubelet does it: graceful: SIGTERM to every process of the pod, SIGKILL after the
grace period, the final status, then delete with grace 0; gone from the API (force delete):
SIGKILL at once. A silenced node's kubelet is dead: nothing of its pods is written or stopped.
Threads: heartbeats, one watch per namespace scope, one sync loop that owns all pod state, one
reader per pod process. No global state; close() kills every process it started (each carries
LOCALCLUSTER_POD=<agent id>/<pod uid>, sshd sessions too) and deletes its nodes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import logging
import math
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from localcluster import podspec, sshd
from localcluster.controlplane import ControlPlane
from localcluster.kubelet import Heartbeats
from localcluster.podinit import START_ERROR
from localcluster.podspec import ConfigError, Observed, Rejected, State

log = logging.getLogger(__name__)

ROLE_LABEL = "elastic-supervisor/role"
AGENT_LABEL = "localcluster/agent"
POD_MARKER = "LOCALCLUSTER_POD"
PODINIT = Path(__file__).resolve().with_name("podinit.py")
KEY_FILES = ("authorized_keys", "ssh-publickey")
Item = tuple[Any, ...]  # what the sync loop consumes: ("relist"|"event"|"proc", ...)


@dataclass(frozen=True)
class AgentSettings:
    """How the node agent runs pods. Durations in seconds."""

    # Names of the nodes to register; empty: two nodes named localnode-<agent id>-<i>.
    nodes: tuple[str, ...] = ()
    # Namespaces whose pods it runs; empty: all namespaces.
    namespaces: tuple[str, ...] = ()
    # sshd port of worker pods whose container declares no port named "ssh".
    ssh_port: int = 2222
    # Public key file worker sshds accept when the pod mounts no Secret with a key.
    authorized_key: Path | None = None
    # Pod IPs are 127.<ip_block>.y.z; None: a random block in 16..254 (agents rarely collide).
    ip_block: int | None = None
    # Where pod directories go; None: a temporary directory that close() removes.
    workdir: Path | None = None
    heartbeat_period_s: float = 1.0
    # The sync loop's period without events (grace deadlines, retries).
    tick_s: float = 0.2
    # Client timeout of each API request (read; connect is at most 5 s).
    request_timeout_s: float = 10.0
    # Lifetime of the ServiceAccount tokens given to pods.
    token_expiration_s: int = 3600
    # A pod whose volumes or env failed for a reason that may pass is retried after this long.
    config_retry_s: float = 1.0
    # How often a pod's status in the API is compared with the agent's and rewritten if it
    # drifted (e.g. the node-lifecycle controller marked it not Ready), like the kubelet's
    # status manager.
    status_resync_s: float = 10.0
    # The sshd host key of every worker pod; None: one kept in the cache directory
    # ($ES_CACHE or ~/.cache/elastic-supervisor), so a pod IP seen again by ssh clients
    # (another agent's, same block) never shows a changed host key.
    host_key: Path | None = None
    # The "image" environment of non-worker pods (e.g. PYTHONPATH), under the spec's env.
    image_env: Mapping[str, str] = field(default_factory=dict)


class NodeAgentError(RuntimeError):
    """A fault-injection call named a pod or node this agent does not run."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sweep(prefix: str) -> list[int]:
    """SIGKILL every process whose POD_MARKER starts with `prefix`; return their pids."""
    killed = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get(POD_MARKER, "").startswith(prefix):
                p.kill()
                killed.append(p.pid)
    return killed


def cached_host_key() -> Path:
    """Return the machine's agent host key in the cache directory, made once (atomically)."""
    cache = Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor"))
    key = cache / "nodeagent" / "ssh_host_ed25519_key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=key.parent) as tmp:
            made = sshd.host_key(Path(tmp) / key.name)
            # Public half first: whoever sees the private key may read both.
            os.replace(made.with_suffix(".pub"), key.with_suffix(".pub"))
            os.replace(made, key)
    return key


class Addresses:
    """Hands out loopback addresses 127.<block>.y.z in order, each at most once."""

    def __init__(self, block: int) -> None:
        if not 1 <= block <= 254:
            raise ValueError(f"ip_block {block}: expected 1..254")
        self.block = block
        self._hosts = (n for n in range(256, 65536) if n % 256 not in (0, 255))

    def allocate(self, port: int | None, attempts: int = 100) -> str:
        """Return the next address whose `port` is free (any address when port is None)."""
        for _ in range(attempts):
            n = next(self._hosts, None)
            if n is None:
                break
            address = f"127.{self.block}.{n // 256}.{n % 256}"
            if port is None:
                return address
            with socket.socket() as s:
                try:
                    s.bind((address, port))
                except OSError:
                    continue  # taken (another agent, or a listener on 0.0.0.0): skip it for good
                return address
        raise NodeAgentError(f"no free address in 127.{self.block}.0.0/16 for port {port}")


class PodProcess:
    """One pod's podinit, in its own session: commands in on stdin, events out to `sink`."""

    def __init__(self, uid: str, argv: list[str], *, env: Mapping[str, str], cwd: Path,
                 log_path: Path, ready: str | None, sink: Callable[[Item], None]) -> None:
        self.uid, self.sink = uid, sink
        self._lock = threading.Lock()
        init_log = log_path.with_name("podinit.log")
        cmd = [sys.executable, "-I", str(PODINIT), "--log", str(log_path),
               *(["--ready-tcp", ready] if ready else []), "--", *argv]
        with init_log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=dict(env), cwd=cwd,
                                         start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"podinit-{uid[:8]}",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.sink(("proc", self.uid, json.loads(line)))
            except ValueError:
                log.warning("podinit.garbage uid=%s line=%r", self.uid, line[:200])
        rc = self.proc.wait()
        self.sink(("proc", self.uid, {"event": "closed", "at": now_rfc3339(),
                                      "code": 128 - rc if rc < 0 else rc}))

    def send(self, command: str) -> bool:
        """Send one command line to podinit; return False if it is gone."""
        with self._lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(f"{command}\n".encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                return False
        return True

    def members(self) -> list[psutil.Process]:
        """Return the live processes of the container (podinit's descendants)."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Close podinit's stdin (it kills the container and exits); SIGKILL it if it hangs."""
        with self._lock, contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


@dataclass
class Runtime:
    """The agent's record of one pod (by uid): what runs, what was reported, what is pending."""

    uid: str
    namespace: str
    name: str
    node: str
    worker: bool
    dir: Path
    seen: Observed  # the container's local state, which the reported status is made from
    port: int | None = None
    proc: PodProcess | None = None
    retry_at: float = math.inf  # when a WAITING pod is tried again
    terminating: bool = False  # SIGTERM sent (graceful delete)
    killed: bool = False  # SIGKILL sent
    kill_at: float = math.inf  # when a pod being deleted gets SIGKILL (monotonic)
    written: dict[str, Any] | None = None  # the last status written
    checked_at: float = 0.0  # when the API's copy of the status was last compared with ours
    write_at: float = 0.0
    write_delay: float = 0.2
    confirmed: bool = False  # the deletion was confirmed (delete with grace 0)
    gone: bool = False  # the pod object is gone and nothing runs: kept only for logs

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> State:
        return self.seen.state

    @property
    def alive(self) -> bool:
        return self.seen.state in (State.CREATING, State.RUNNING)

    @property
    def log_path(self) -> Path:
        return self.dir / "container.log"

    def update(self, **changes: Any) -> None:
        self.seen = replace(self.seen, **changes)


class ApiSources:
    """podspec.Sources through the API (the agent's admin client)."""

    def __init__(self, core: client.CoreV1Api, timeout_s: float) -> None:
        self.core, self.timeout = core, (5.0, timeout_s)

    def _read(self, fn: Callable[..., Any], namespace: str, name: str) -> Any:
        try:
            return fn(name, namespace, _request_timeout=self.timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ConfigError(f"reading {name}: {e.status} {e.reason}", retry=True) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ConfigError(f"reading {name}: {e}", retry=True) from e

    def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._read(self.core.read_namespaced_config_map, namespace, name)
        return None if obj is None else podspec.decode_config_map(
            {"data": obj.data, "binaryData": obj.binary_data})

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._read(self.core.read_namespaced_secret, namespace, name)
        return None if obj is None else podspec.decode_secret(obj.data)

    def token(self, pod: Mapping[str, Any], audience: str | None, expiration_s: int) -> str:
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {"spec": {"audiences": [audience] if audience else [],
                         "expirationSeconds": max(600, expiration_s),
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                            "name": meta["name"], "uid": meta["uid"]}}}
        try:
            return self.core.create_namespaced_service_account_token(
                sa, meta["namespace"], body, _request_timeout=self.timeout).status.token
        except ApiException as e:
            raise ConfigError(f"token for ServiceAccount {sa}: {e.status} {e.reason}",
                              retry=True) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ConfigError(f"token for ServiceAccount {sa}: {e}", retry=True) from e


class PodWatch:
    """Lists and watches the pods bound to `nodes` (one namespace, or all) in a thread.

    Puts ("relist", namespace, {uid: pod}) after each (re)list and ("event", type, pod) per
    change on `sink`; reconnects from the last resourceVersion with backoff, relists on 410.
    """

    def __init__(self, core: client.CoreV1Api, namespace: str | None, nodes: frozenset[str],
                 sink: Callable[[Item], None], request_timeout_s: float) -> None:
        self.core, self.namespace, self.nodes, self.sink = core, namespace, nodes, sink
        self.timeout = (5.0, max(request_timeout_s, 90.0))  # > the ~60 s bookmark gap
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"podwatch-{namespace or 'all'}",
                                        daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # urllib3 >= 2.3: interrupts the blocking read
        self._thread.join(10)

    def _list(self, **kw: Any) -> Any:
        if self.namespace:
            return self.core.list_namespaced_pod(self.namespace, _preload_content=False, **kw)
        return self.core.list_pod_for_all_namespaces(_preload_content=False, **kw)

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("nodeName") in self.nodes

    def _run(self) -> None:
        rv: str | None = None
        delay = 0.2
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                rv = self._watch(rv)
                delay = 0.2
                continue
            except ApiException as e:
                if e.status == 410:
                    rv = None
                    continue
                problem = f"{e.status} {e.reason}"
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
                problem = repr(e)
            if not self._stop.is_set():
                log.info("watch.broken namespace=%s error=%s retry_in=%.1fs",
                         self.namespace or "*", problem, delay)
            self._stop.wait(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, 5.0)

    def _relist(self) -> str:
        pods: dict[str, Any] = {}
        token = None
        while True:
            resp = self._list(limit=500, _continue=token, _request_timeout=self.timeout)
            body = json.loads(resp.data)
            pods |= {p["metadata"]["uid"]: p for p in body["items"] if self._ours(p)}
            token = body["metadata"].get("continue")
            if not token:
                break
        self.sink(("relist", self.namespace, pods))
        return body["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str | None:
        """Follow one watch connection; return the last resourceVersion (None after 410)."""
        resp = self._list(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                          timeout_seconds=300, _request_timeout=self.timeout)
        self._resp = resp
        try:
            pending = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                if self._stop.is_set():
                    return rv
                *lines, pending = (pending + chunk).split(b"\n")
                for line in filter(None, (x.strip() for x in lines)):
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return None
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    rv = obj["metadata"].get("resourceVersion") or rv
                    if kind != "BOOKMARK" and self._ours(obj):
                        self.sink(("event", kind, obj))
            return rv
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()


class NodeAgent:
    """Plays the kubelet for its nodes. Use as a context manager, or start() and close()."""

    def __init__(self, control_plane: ControlPlane, settings: AgentSettings | None = None) -> None:
        self.cp = control_plane
        self.settings = s = settings or AgentSettings()
        self.id = f"{random.getrandbits(24):06x}"
        self.nodes = list(s.nodes) or [f"localnode-{self.id}-{i}" for i in (1, 2)]
        self._addresses = Addresses(s.ip_block or random.randint(16, 254))
        self._own_workdir = s.workdir is None
        self.workdir = s.workdir or Path(tempfile.mkdtemp(prefix=f"es-agent-{self.id}-"))
        self._api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        self._core = client.CoreV1Api(self._api)
        self._sources = ApiSources(self._core, s.request_timeout_s)
        self._heartbeats: Heartbeats | None = None
        self._watches: list[PodWatch] = []
        self._items: queue.Queue[Item] = queue.Queue()
        self._objects: dict[str, dict[str, Any]] = {}  # uid -> pod, for pods on our nodes
        self._runtimes: dict[str, Runtime] = {}  # uid -> runtime; owned by the sync thread
        self._lock = threading.Lock()  # guards _runtimes against the public methods' lookups
        self._silenced: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"nodeagent-{self.id}",
                                        daemon=True)
        self._host_key: Path | None = None
        # Unexpected exceptions of the sync loop (bugs): tests assert there are none.
        self.errors: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        """Register the nodes (Ready), start watching and running their pods."""
        try:
            self._host_key = self.settings.host_key or cached_host_key()
            self._heartbeats = Heartbeats(self._api, self.settings.heartbeat_period_s)
            for name in self.nodes:
                self._heartbeats.register(name, labels={AGENT_LABEL: self.id})
            scopes: list[str | None] = list(self.settings.namespaces) or [None]
            self._watches = [PodWatch(self._core, ns, frozenset(self.nodes), self._items.put,
                                      self.settings.request_timeout_s).start() for ns in scopes]
            self._thread.start()
        except BaseException:
            self.close()
            raise
        log.info("agent.started id=%s nodes=%s block=127.%d", self.id, self.nodes,
                 self._addresses.block)
        return self

    def close(self) -> None:
        """Stop everything: kill every process of every pod, delete the nodes, remove the
        temporary workdir. Pod objects are left to the API (their nodes are gone)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        try:
            for w in self._watches:
                w.stop()
            with self._lock:
                runtimes = list(self._runtimes.values())
            for rt in runtimes:
                if rt.proc is not None:
                    rt.proc.close()
            sweep(f"{self.id}/")  # anything that escaped its podinit
            if self._heartbeats is not None:
                try:
                    self._heartbeats.close(delete=True)
                except (urllib3.exceptions.HTTPError, OSError) as e:  # the API is down
                    log.warning("agent.nodes_left nodes=%s error=%r", self.nodes, e)
        finally:
            self._api.close()
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- what tests read ---------------------------------------------------------------------

    @property
    def node_selector(self) -> dict[str, str]:
        """A nodeSelector matching only this agent's nodes."""
        return {AGENT_LABEL: self.id}

    def runtime(self, pod: str) -> Runtime:
        """Return the newest runtime of pod "namespace/name" (NodeAgentError if none)."""
        with self._lock:
            found = [rt for rt in self._runtimes.values() if rt.key == pod]
        if not found:
            raise NodeAgentError(f"pod {pod} has never run on this agent")
        return found[-1]

    def address(self, pod: str) -> tuple[str | None, int | None]:
        """Return the pod's (IP, ssh port); the port is None for non-worker pods."""
        rt = self.runtime(pod)
        return rt.seen.ip, rt.port

    def processes(self, pod: str) -> list[psutil.Process]:
        """Return the live processes of the pod's container (sshd sessions included)."""
        rt = self.runtime(pod)
        return rt.proc.members() if rt.proc is not None else []

    def log_path(self, pod: str) -> Path:
        return self.runtime(pod).log_path

    def log(self, pod: str) -> str:
        """Return the container's output so far ("" if none)."""
        try:
            return self.log_path(pod).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- fault injection ---------------------------------------------------------------------

    def kill(self, pod: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to every process of the pod (its status then shows the real exit code)."""
        self._command(pod, f"signal {int(sig)}")

    def exit(self, pod: str, code: int) -> None:
        """Make the pod's container exit with `code` (its processes are killed first)."""
        if not 0 <= code <= 255:
            raise ValueError(f"exit code {code}: expected 0..255")
        self._command(pod, f"exit {code}")

    def freeze(self, pod: str, timeout: float = 5.0) -> None:
        """SIGSTOP every process of the pod; return once all are stopped."""
        self._command(pod, f"signal {int(signal.SIGSTOP)}")
        self._wait_states(pod, lambda s: s == psutil.STATUS_STOPPED, timeout, "stopped")

    def thaw(self, pod: str, timeout: float = 5.0) -> None:
        """SIGCONT every process of the pod; return once none is stopped."""
        self._command(pod, f"signal {int(signal.SIGCONT)}")
        self._wait_states(pod, lambda s: s != psutil.STATUS_STOPPED, timeout, "running")

    def silence(self, node: str, freeze: bool = False) -> None:
        """The node's kubelet dies: its Lease is no longer renewed (the controller-manager marks
        the node NotReady) and nothing of its pods is written or stopped; with `freeze`, its
        pods' processes are stopped too (a hung machine), else they keep running."""
        self._check_node(node)
        assert self._heartbeats is not None
        self._heartbeats.silence(node)
        with self._lock:
            self._silenced.add(node)
            pods = [rt.key for rt in self._runtimes.values() if rt.node == node and rt.alive]
        if freeze:
            for pod in pods:
                self.freeze(pod)

    def resume(self, node: str, thaw: bool = True) -> None:
        """The node's kubelet is back: Lease renewed, Ready, its pods synced (and thawed)."""
        self._check_node(node)
        assert self._heartbeats is not None
        self._heartbeats.resume(node)
        with self._lock:
            self._silenced.discard(node)
            runtimes = [rt for rt in self._runtimes.values() if rt.node == node]
            pods = [rt.key for rt in runtimes if rt.alive]
        for rt in runtimes:
            rt.checked_at = 0.0  # like a kubelet's first sync: check every status at once
        if thaw:
            for pod in pods:
                self.thaw(pod)
        self._items.put(("tick",))

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            raise NodeAgentError(f"node {node} is not one of this agent's {self.nodes}")

    def _command(self, pod: str, command: str) -> None:
        rt = self.runtime(pod)
        if not rt.alive or rt.proc is None or not rt.proc.send(command):
            raise NodeAgentError(f"pod {pod} is not running here ({rt.state})")

    def _wait_states(self, pod: str, ok: Callable[[str], bool], timeout: float,
                     what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for p in self.processes(pod):
                with contextlib.suppress(psutil.NoSuchProcess):
                    states.append(p.status())
            if all(ok(s) for s in states):
                return
            if time.monotonic() > deadline:
                raise NodeAgentError(f"pod {pod}: processes not {what} after {timeout}s: "
                                     f"{states}")
            time.sleep(0.02)

    # -- the sync loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            items = []
            with contextlib.suppress(queue.Empty):
                items.append(self._items.get(timeout=self.settings.tick_s))
                while True:
                    items.append(self._items.get_nowait())
            for item in items:
                self._apply(item)
            now = time.monotonic()
            with self._lock:
                uids = list(dict.fromkeys(itertools.chain(self._runtimes, self._objects)))
            for uid in uids:
                try:
                    self._sync(uid, now)
                except Exception as e:  # a bug: keep the other pods going, let tests see it
                    log.exception("agent.sync_failed uid=%s", uid)
                    self.errors.append(f"sync {uid}: {e!r}")

    def _apply(self, item: Item) -> None:
        if item[0] == "relist":
            _, namespace, pods = item
            for uid, pod in list(self._objects.items()):
                if namespace in (None, pod["metadata"]["namespace"]) and uid not in pods:
                    del self._objects[uid]  # deleted while we were not watching
            self._objects.update(pods)
        elif item[0] == "event":
            _, kind, pod = item
            uid = pod["metadata"]["uid"]
            if kind == "DELETED":
                self._objects.pop(uid, None)
            else:
                self._objects[uid] = pod
        elif item[0] == "proc":
            _, uid, event = item
            rt = self._runtimes.get(uid)
            if rt is not None:
                self._on_process_event(rt, event)

    def _on_process_event(self, rt: Runtime, event: Mapping[str, Any]) -> None:
        kind, at = event["event"], event["at"]
        if kind == "started":
            rt.update(state=State.RUNNING, started_at=at, container_id=f"local://{event['pid']}",
                      ready_at=None if rt.worker else at)
        elif kind == "ready":
            rt.update(ready_at=at)
        elif kind == "failed":
            rt.update(state=State.EXITED, exit_code=START_ERROR, start_error=True,
                      message=event["error"], finished_at=at)
        elif kind == "exited" or (kind == "closed" and rt.state is not State.EXITED):
            # "closed" alone: podinit itself died without a word (killed from outside).
            rt.update(state=State.EXITED, exit_code=event["code"], finished_at=at)
        if kind in ("exited", "closed", "failed"):
            sweep(f"{self.id}/{rt.uid}")
        log.info("pod.%s %s %s", kind, rt.key,
                 " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "at")))

    def _sync(self, uid: str, now: float) -> None:
        """Bring one pod's processes and reported status in line with its object."""
        pod, rt = self._objects.get(uid), self._runtimes.get(uid)
        node = rt.node if rt is not None else (pod or {}).get("spec", {}).get("nodeName")
        if node in self._silenced or (rt is not None and rt.gone):
            return
        deleting = pod is not None and pod["metadata"].get("deletionTimestamp") is not None
        if rt is None:
            assert pod is not None
            if deleting:
                self._confirm_delete(pod["metadata"])
            elif pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                self._admit(pod)
            return
        if pod is None:  # gone from the API (force delete): kill at once, write nothing
            if rt.alive and not rt.killed and rt.proc is not None:
                rt.killed = rt.proc.send(f"signal {signal.SIGKILL}")
            rt.gone = not rt.alive
            return
        if rt.state is State.WAITING and now >= rt.retry_at:
            self._start(rt, pod)
        if deleting and rt.alive:
            self._terminate(rt, pod["metadata"], now)
        current = self._write_status(rt, pod, now)
        if deleting and not rt.alive and current and not rt.confirmed:
            rt.confirmed = self._confirm_delete(pod["metadata"])

    def _terminate(self, rt: Runtime, meta: Mapping[str, Any], now: float) -> None:
        """SIGTERM every process of a pod being deleted, SIGKILL once its grace has passed."""
        assert rt.proc is not None
        grace = meta.get("deletionGracePeriodSeconds") or 0
        if not rt.terminating and grace > 0:
            log.info("pod.terminating %s grace=%ss", rt.key, grace)
            rt.proc.send(f"signal {signal.SIGTERM}")
        rt.terminating = True
        # Counted from when this agent saw the deletion, like a kubelet; a second delete may
        # shorten it.
        rt.kill_at = min(rt.kill_at, now + grace)
        if not rt.killed and now >= rt.kill_at:
            rt.killed = rt.proc.send(f"signal {signal.SIGKILL}")

    def _admit(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        worker = (meta.get("labels") or {}).get(ROLE_LABEL) == "worker"
        directory = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        directory.mkdir(parents=True, exist_ok=True)
        rt = Runtime(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
                     node=pod["spec"]["nodeName"], worker=worker, dir=directory,
                     seen=Observed(State.WAITING, container="", image="",
                                   start_time=now_rfc3339()))
        with self._lock:
            self._runtimes[rt.uid] = rt
        try:
            container = podspec.admit(pod)
        except Rejected as e:
            rt.update(state=State.REJECTED, message=str(e))
            log.warning("pod.rejected %s: %s", rt.key, e)
            return
        rt.update(container=container["name"], image=container.get("image", ""))
        if worker:
            rt.port = next((p["containerPort"] for p in container.get("ports") or ()
                            if p.get("name") == "ssh"), self.settings.ssh_port)
        rt.update(ip=self._addresses.allocate(rt.port))
        self._start(rt, pod)

    def _start(self, rt: Runtime, pod: Mapping[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        try:
            argv, env, ready, cwd = self._prepare(rt, pod, container)
        except ConfigError as e:
            rt.update(state=State.WAITING, message=str(e))
            rt.retry_at = time.monotonic() + self.settings.config_retry_s if e.retry else math.inf
            log.warning("pod.config_error %s: %s%s", rt.key, e, " (retrying)" if e.retry else "")
            return
        rt.proc = PodProcess(rt.uid, argv, env=env, cwd=cwd, log_path=rt.log_path, ready=ready,
                             sink=self._items.put)
        rt.update(state=State.CREATING, message="")
        log.info("pod.starting %s node=%s ip=%s port=%s pid=%d", rt.key, rt.node, rt.seen.ip,
                 rt.port, rt.proc.pid)

    def _prepare(self, rt: Runtime, pod: Mapping[str, Any], container: Mapping[str, Any],
                 ) -> tuple[list[str], dict[str, str], str | None, Path]:
        """Return (argv, env, readiness address, cwd) for the pod's podinit."""
        root = rt.dir / "volumes"
        ip = rt.seen.ip
        volumes = podspec.write_volumes(pod, container, root, self._sources, ip)
        marker = {POD_MARKER: f"{self.id}/{rt.uid}"}
        if rt.worker:
            assert self._host_key is not None and ip is not None and rt.port is not None
            keys = rt.dir / "authorized_keys"
            keys.write_text(self._authorized_keys(pod, volumes))
            cfg = sshd.write_sshd_config(rt.dir, ip, rt.port, self._host_key, keys,
                                         set_env=marker)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **marker}
            return sshd.sshd_argv(cfg), env, f"{ip}:{rt.port}", rt.dir
        meta = pod["metadata"]
        base = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
            "HOSTNAME": meta["name"], "POD_NAME": meta["name"],
            "POD_NAMESPACE": meta["namespace"], podspec.VOLUME_ROOT_ENV: str(root),
            **self.settings.image_env,
        }
        if pod["spec"].get("automountServiceAccountToken", True):
            token = self._sources.token(pod, None, self.settings.token_expiration_s)
            base["KUBECONFIG"] = str(self.cp.write_token_kubeconfig(
                rt.dir / "kubeconfig", token, meta["namespace"]))
        env = podspec.container_env(pod, container, ip, base) | marker
        # No image file system here: a workingDir this machine does not have is the pod's dir.
        workdir = Path(container.get("workingDir") or rt.dir)
        cwd = workdir if workdir.is_dir() else rt.dir
        return podspec.container_command(container, env), env, None, cwd

    def _authorized_keys(self, pod: Mapping[str, Any], volumes: Mapping[str, Path]) -> str:
        secrets = {v["name"] for v in pod["spec"].get("volumes") or () if "secret" in v}
        keys = [(volumes[name] / f).read_text() for name in sorted(secrets & volumes.keys())
                for f in KEY_FILES if (volumes[name] / f).is_file()]
        if not keys and self.settings.authorized_key is not None:
            keys.append(self.settings.authorized_key.read_text())
        if not keys:
            raise ConfigError("worker pod: no ssh public key to accept: mount a Secret with the "
                              "key authorized_keys or ssh-publickey, or give the node agent an "
                              "authorized_key")
        return "".join(k if k.endswith("\n") else k + "\n" for k in keys)

    def _write_status(self, rt: Runtime, pod: Mapping[str, Any], now: float) -> bool:
        """Write the pod's status if it changed here or drifted in the API; return whether the
        API has the current one."""
        desired = podspec.pod_status(rt.seen)
        if desired == rt.written:
            if now - rt.checked_at < self.settings.status_resync_s:
                return True
            rt.checked_at = now
            if podspec.status_digest(pod.get("status") or {}) == podspec.status_digest(desired):
                return True
            log.info("pod.status_drifted %s: rewriting it", rt.key)
        if now < rt.write_at:
            return False
        try:
            self._core.patch_namespaced_pod_status(
                rt.name, rt.namespace, {"status": desired},
                _request_timeout=(5.0, self.settings.request_timeout_s))
        except ApiException as e:
            if e.status != 404:  # 404: the pod is gone, nobody reads its status any more
                self._retry_later(rt, now, f"{e.status} {e.reason}")
                return False
        except (urllib3.exceptions.HTTPError, OSError) as e:
            self._retry_later(rt, now, repr(e))
            return False
        rt.written, rt.write_delay, rt.checked_at = desired, 0.2, now
        log.debug("pod.status %s phase=%s", rt.key, desired["phase"])
        return True

    def _retry_later(self, rt: Runtime, now: float, problem: str) -> None:
        log.info("pod.status_failed %s error=%s retry_in=%.1fs", rt.key, problem, rt.write_delay)
        rt.write_at = now + rt.write_delay
        rt.write_delay = min(rt.write_delay * 2, 5.0)

    def _confirm_delete(self, meta: Mapping[str, Any]) -> bool:
        """Delete the pod object with grace 0 (the kubelet's confirmation); return success."""
        try:
            self._core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                _request_timeout=(5.0, self.settings.request_timeout_s))
        except ApiException as e:
            if e.status not in (404, 409):  # gone already, or a new pod of the same name
                log.info("pod.delete_failed %s/%s error=%s %s", meta["namespace"], meta["name"],
                         e.status, e.reason)
                return False
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log.info("pod.delete_failed %s/%s error=%r", meta["namespace"], meta["name"], e)
            return False
        log.info("pod.deleted %s/%s", meta["namespace"], meta["name"])
        return True

