"""The main job on the local cluster with real nodes: deploy it, follow it, hurt it.

`MainJob` renders `manifests/overlays/local` with kustomize (the very manifests of the kind
overlay: RBAC, PriorityClasses, the launcher Job, the worker template and policy ConfigMaps, the
ssh Secret), or `manifests/overlays/sidecar` (the same job in native-sidecar mode), moves it into
a namespace of its own, optionally changes the training command and the supervisor's
environment, and applies it with kubectl. The Job controller makes the launcher pod
(the launcher image: the supervisor with the manifests' ServiceAccount), the supervisor creates
the worker pods from its template (the worker image), and horovodrun trains on them over ssh.

What happened is read back from the launcher's log (`kubectl logs -f`, every launcher pod of the
Job in turn): the supervisor's JSON lines and rank 0's JSON lines (steps, resets), and from the
API (pods, Events). Faults are what happens in a cluster: a container's process killed, a pod
force-deleted or evicted, a node's kubelet stopped, a node frozen, a pod partitioned.
Shared by `make demo`, the end-to-end tests and the end-to-end benchmark.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.controlplane import default_bin_dir
from localcluster.nodes import POOL_LABEL, Cluster, Node

API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "manifests" / "overlays" / "local"
SIDECAR_OVERLAY = REPO / "manifests" / "overlays" / "sidecar"
STANDBY_OVERLAY = REPO / "manifests" / "overlays" / "standby"  # two launchers, one leads
# The launcher pod's containers whose logs MainJob follows: the baked mode's one (supervisor and
# horovodrun), the sidecar mode's two (the supervisor; es-run and horovodrun in `launcher`).
LAUNCHER_CONTAINERS = ("elastic-supervisor", "launcher")
JOB = "elastic-train"
BASE_NAMESPACE = "elastic-supervisor"
WORKER_SELECTOR = f"elastic-supervisor/job={JOB},elastic-supervisor/role=worker"
LAUNCHER_SELECTOR = "elastic-supervisor/role=launcher"
Record = dict[str, Any]


class JobError(RuntimeError):
    """The job could not be deployed, or did not do what a wait expected in time."""


def set_training(pod_spec: dict[str, Any], *, args: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
    """Give the launcher pod (`pod_spec`, changed in place) the training command `args` (the
    args of container `launcher`, in both modes) and extra (or changed) `env` for the
    supervisor (its container: the one that names SUPERVISOR_JOB_NAME, `launcher` in the baked
    mode, the sidecar `elastic-supervisor` in the sidecar mode)."""
    containers = [*pod_spec.get("initContainers", ()), *pod_spec["containers"]]
    if args is not None:
        launcher = next(c for c in pod_spec["containers"] if c["name"] == "launcher")
        launcher["args"] = list(args)
    if env:
        supervisor = next(c for c in containers
                          if any(e["name"] == "SUPERVISOR_JOB_NAME" for e in c.get("env", ())))
        current = {e["name"]: e for e in supervisor.get("env") or ()}
        for name, value in env.items():
            current[name] = {"name": name, "value": value}
        supervisor["env"] = list(current.values())


def render(namespace: str, *, args: Sequence[str] | None = None,
           env: Mapping[str, str] | None = None,
           overlay: Path = OVERLAY) -> list[dict[str, Any]]:
    """The overlay's objects (the local one by default), moved into `namespace`, with the
    training command `args` and extra (or changed) supervisor `env` if given."""
    cluster_kubectl = _kubectl_path()
    out = subprocess.run([str(cluster_kubectl), "kustomize", str(overlay)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise JobError(f"kubectl kustomize {overlay}: {out.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    suffix = f".{BASE_NAMESPACE}"  # cluster-wide objects are named <name>.<namespace>
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "Namespace":
            meta["name"] = namespace
        if meta.get("namespace") == BASE_NAMESPACE:
            meta["namespace"] = namespace
        if meta["name"].endswith(suffix):
            meta["name"] = meta["name"][:-len(suffix)] + f".{namespace}"
        ref = doc.get("roleRef") or {}
        if ref.get("name", "").endswith(suffix):
            ref["name"] = ref["name"][:-len(suffix)] + f".{namespace}"
        for subject in doc.get("subjects") or ():
            if subject.get("namespace") == BASE_NAMESPACE:
                subject["namespace"] = namespace
        if kind == "ValidatingAdmissionPolicyBinding":  # the admission policy, bound here
            spec = doc["spec"]
            if spec["policyName"].endswith(suffix):
                spec["policyName"] = spec["policyName"][:-len(suffix)] + f".{namespace}"
            for expr in spec["matchResources"]["namespaceSelector"]["matchExpressions"]:
                expr["values"] = [namespace if v == BASE_NAMESPACE else v
                                  for v in expr["values"]]
        if kind == "Job":
            set_training(doc["spec"]["template"]["spec"], args=args, env=env)
    return docs


def edit_worker_template(docs: list[dict[str, Any]],
                         change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the worker template (the pod the supervisor creates each worker from)
    in the rendered objects `docs`."""
    for doc in docs:
        if doc["kind"] == "ConfigMap" and "worker-template.yaml" in (doc.get("data") or {}):
            template = yaml.safe_load(doc["data"]["worker-template.yaml"])
            change(template)
            doc["data"]["worker-template.yaml"] = yaml.safe_dump(template)


def on_pool(docs: list[dict[str, Any]], pool: str) -> None:
    """Keep the launcher and every worker on the nodes of `pool` (a node selector on the Job's
    pod and on the worker template): a job of tests that run beside others (Cluster.view)."""
    def select(spec: dict[str, Any]) -> None:
        spec.setdefault("nodeSelector", {})[POOL_LABEL] = pool
    for doc in docs:
        if doc["kind"] == "Job":
            select(doc["spec"]["template"]["spec"])
    edit_worker_template(docs, lambda template: select(template["spec"]))


def _kubectl_path() -> Path:
    return default_bin_dir() / "kubectl"


def ensure_ssh_key() -> None:
    """The job's ssh key pair (manifests/base/ssh/, gitignored), made once."""
    subprocess.run(["bash", str(REPO / "manifests" / "ssh-keygen.sh")], check=True,
                   stdout=subprocess.DEVNULL)


def horovod_records(text: str) -> list[Record]:
    """Rank 0's JSON lines in horovodrun's output (`[0]<stdout>:{...}`), in order."""
    out = []
    for line in text.splitlines():
        _, sep, rest = line.partition("]<stdout>:")
        if sep and rest.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(rest))
    return out


def supervisor_records(text: str) -> list[Record]:
    """The supervisor's own JSON log lines, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith("{") and '"event"' in line:
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if "level" in rec or "timestamp" in rec:
                    out.append(rec)
    return out


def log_time(rec: Record) -> float:
    """The wall time of a supervisor log record (0 if it has none)."""
    try:
        return dt.datetime.fromisoformat(
            str(rec.get("timestamp", "")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _cri_lines(data: bytes) -> tuple[bytes, bytes]:
    """The text of CRI log lines (`<time> <stream> <P|F> <text>`): partial (P) lines joined
    to the full line that follows; returns (complete text, the pending partial text)."""
    out, pending = bytearray(), b""
    for line in data.splitlines():
        parts = line.split(b" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else b""
        if parts[2] == b"P":
            pending += text
        else:
            out += pending + text + b"\n"
            pending = b""
    return bytes(out), pending


def namespace_pid(pid: int) -> int | None:
    """The process's pid inside its own PID namespace (NSpid's last field)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except OSError:
        return None
    return None


# The decisions that destroy capacity: a worker declared Hung or stuck, a node quarantined.
VERDICTS = ("worker.hung", "worker.stuck", "node.quarantined", "worker.slow")


def false_verdicts(logs: list[Record], silenced: Mapping[str, float]) -> list[Record]:
    """The Hung, stuck and slow verdicts and the quarantines among the supervisor's `logs` that
    name a pod or a node not made silent, stuck or slow before (`silenced`: name -> wall time,
    by the test or the demo): each one destroyed (or, slow, would move) a healthy worker's or
    node's capacity."""
    wrong = []
    for e in logs:
        if e.get("event") not in VERDICTS:
            continue
        name = e.get("node") if e["event"] == "node.quarantined" else e.get("pod")
        since = silenced.get(str(name))
        if since is None or since > log_time(e):
            wrong.append(e)
    return wrong


@dataclass
class MainJob:
    """The main job in `namespace` of `cluster`; its launchers' logs go to `out`."""

    cluster: Cluster
    api: client.ApiClient
    namespace: str
    out: Path
    args: Sequence[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Changes the rendered objects in place before they are applied (e.g. a shared volume).
    transform: Callable[[list[dict[str, Any]]], None] | None = None
    overlay: Path = OVERLAY  # SIDECAR_OVERLAY: the native-sidecar mode

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = self.out / f"launcher-{self.namespace}.log"
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self.applied_at = 0.0
        # The log parsed so far: the follower appends whole lines only, so what was read stays
        # parsed and only what came since is parsed again (a tour's log grows to 10,000s of
        # lines, read every 0.25 s by its waits).
        self._parsed = 0
        self._horovod: list[Record] = []
        self._supervisor: list[Record] = []
        # What the test itself made silent or stuck (pods and nodes), from when: the only
        # places a Hung or stuck verdict, or a quarantine, may land (tests/e2e/jobs.py
        # false_verdicts). Written by the faults that silence (not by kills: an exit is no hang).
        self.silenced: dict[str, float] = {}

    # -- deploy ---------------------------------------------------------------------------------

    def apply(self) -> MainJob:
        ensure_ssh_key()
        docs = render(self.namespace, args=self.args, env=self.env, overlay=self.overlay)
        if self.transform is not None:
            self.transform(docs)
        if self.cluster.pool is not None:
            on_pool(docs, self.cluster.pool)
        manifest = self.out / f"manifests-{self.namespace}.yaml"
        manifest.write_text(yaml.safe_dump_all(docs))
        # A new job, a new log: an earlier job's in the same place (a second `make demo` writes
        # to bench/out again) would be read as this one's, its last step and all.
        self.log.unlink(missing_ok=True)
        self._parsed, self._horovod, self._supervisor = 0, [], []
        self.kubectl("apply", "-f", str(manifest), namespaced=False)
        self.applied_at = time.time()
        self._follower = threading.Thread(target=self._follow, name="launcher-logs",
                                          daemon=True)
        self._follower.start()
        return self

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                namespaced: bool = True) -> subprocess.CompletedProcess[str]:
        ns = ["-n", self.namespace] if namespaced else []
        res = subprocess.run([str(_kubectl_path()), "--kubeconfig", str(self.cluster.kubeconfig),
                              *ns, *args], capture_output=True, text=True,
                             check=False, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise JobError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
        return res

    def _follow(self) -> None:
        """Copy every launcher pod's container log into self.log as it grows, read from the
        node's log directory on this machine (a stopped or frozen kubelet cannot cut it off,
        as it would `kubectl logs -f`)."""
        offsets: dict[Path, int] = {}
        partials: dict[Path, bytes] = {}
        pods: list[dict[str, Any]] = []
        while not self._stop.wait(0.25):
            # Through an API outage (a test restarts kube-apiserver) the pods known last are
            # followed: their log files are on this machine.
            with contextlib.suppress(*API_ERRORS):
                pods = self.launchers()
            with contextlib.suppress(OSError, ValueError, StopIteration):
                out = bytearray()
                for pod in pods:
                    for path in self._log_files(pod):
                        with path.open("rb") as f:
                            f.seek(offsets.get(path, 0))
                            chunk = f.read()
                        end = chunk.rfind(b"\n") + 1
                        if not end:
                            continue
                        if path not in offsets:
                            out += f"# ---- launcher pod {pod['metadata']['name']}\n".encode()
                        offsets[path] = offsets.get(path, 0) + end
                        text, partials[path] = _cri_lines(partials.get(path, b"") + chunk[:end])
                        out += text
                if out:
                    with self.log.open("ab") as f:
                        f.write(out)

    def _log_files(self, pod: dict[str, Any]) -> list[Path]:
        """The log files of a launcher pod's containers on its node (LAUNCHER_CONTAINERS),
        oldest first in each."""
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            return []
        meta = pod["metadata"]
        pod_dir = (self.cluster.node(node).dir / "pod-logs"
                   / f"{meta['namespace']}_{meta['name']}_{meta['uid']}")
        return [path for name in LAUNCHER_CONTAINERS
                for path in sorted((pod_dir / name).glob("*.log"),
                                   key=lambda p: int(p.stem) if p.stem.isdigit() else 0)]

    def close(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join(5)

    def delete(self, timeout: float = 90) -> None:
        """Delete the job's pods (at once: the next job must find the nodes' resources free),
        its namespace and its cluster-wide objects."""
        self.close()
        with contextlib.suppress(ApiException):  # else its controller makes a new launcher
            client.BatchV1Api(self.api).delete_namespaced_job(
                JOB, self.namespace, propagation_policy="Orphan")
        with contextlib.suppress(ApiException):
            self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiException):
                if not self.core.list_namespaced_pod(self.namespace).items:
                    break
            time.sleep(0.5)
        with contextlib.suppress(ApiException):
            self.core.delete_namespace(self.namespace)
        rbac = client.RbacAuthorizationV1Api(self.api)
        mine = f".{self.namespace}"
        for crb in rbac.list_cluster_role_binding().items:
            if crb.metadata.name.endswith(mine):
                with contextlib.suppress(ApiException):
                    rbac.delete_cluster_role_binding(crb.metadata.name)
        for cr in rbac.list_cluster_role().items:
            if cr.metadata.name.endswith(mine):
                with contextlib.suppress(ApiException):
                    rbac.delete_cluster_role(cr.metadata.name)
        for rb in rbac.list_role_binding_for_all_namespaces().items:
            if rb.metadata.name.endswith(mine):
                with contextlib.suppress(ApiException):
                    rbac.delete_namespaced_role_binding(rb.metadata.name, rb.metadata.namespace)

    # -- what happened --------------------------------------------------------------------------

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _parse(self) -> None:
        try:
            with self.log.open("rb") as f:
                f.seek(self._parsed)
                new = f.read()
        except FileNotFoundError:
            return
        end = new.rfind(b"\n") + 1
        if end:
            text = new[:end].decode(errors="replace")
            self._horovod += horovod_records(text)
            self._supervisor += supervisor_records(text)
            self._parsed += end

    def records(self) -> list[Record]:
        self._parse()
        return list(self._horovod)

    def steps(self) -> list[Record]:
        return [r for r in self.records() if "loss" in r]

    def logs(self, event: str | None = None) -> list[Record]:
        self._parse()
        recs = self._supervisor
        return list(recs) if event is None else [r for r in recs if r.get("event") == event]

    def last_step(self) -> Record | None:
        self._parse()
        return next((r for r in reversed(self._horovod) if "loss" in r), None)

    def pods(self, selector: str) -> dict[str, dict[str, Any]]:
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                             _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(resp.data)["items"]}

    def workers(self) -> dict[str, dict[str, Any]]:
        return self.pods(WORKER_SELECTOR)

    def live_workers(self) -> dict[str, dict[str, Any]]:
        return {n: p for n, p in self.workers().items()
                if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")}

    def launchers(self) -> list[dict[str, Any]]:
        return sorted(self.pods(LAUNCHER_SELECTOR).values(),
                      key=lambda p: p["metadata"]["creationTimestamp"])

    def launcher(self) -> dict[str, Any] | None:
        """The newest launcher pod."""
        pods = self.launchers()
        return pods[-1] if pods else None

    def launcher_env(self) -> list[dict[str, Any]]:
        """The supervisor container's env as the newest launcher pod has it (the sidecar's in
        the sidecar mode)."""
        spec = (self.launcher() or {}).get("spec", {})
        for c in [*spec.get("initContainers", ()), *spec.get("containers", ())]:
            if any(e.get("name") == "SUPERVISOR_JOB_NAME" for e in c.get("env") or ()):
                return list(c["env"])
        return []

    def exit_code(self) -> int | None:
        """The newest launcher container's exit code, once it terminated (None also while the
        API cannot say)."""
        try:
            pod = self.launcher()
        except API_ERRORS:
            return None
        for cs in (pod or {}).get("status", {}).get("containerStatuses") or ():
            term = (cs.get("state") or {}).get("terminated")
            if term is not None:
                return int(term["exitCode"])
        return None

    def events(self) -> list[dict[str, Any]]:
        """The supervisor's Events (events.k8s.io/v1), oldest first."""
        resp = client.EventsV1Api(self.api).list_namespaced_event(self.namespace,
                                                                  _preload_content=False)
        items = [e for e in json.loads(resp.data)["items"]
                 if e.get("reportingController", "").startswith("elastic-supervisor")]
        return sorted(items, key=lambda e: e.get("eventTime") or "")

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events()]

    # -- waits ------------------------------------------------------------------------------------

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float,
             interval: float = 0.25, *, after_exit: bool = False) -> Any:
        """Wait for `predicate`; raise JobError with the log's tail, at once if the launcher
        ended meanwhile, unless waiting for that exit or what follows it (`after_exit`: the exit
        itself, the Job failing, the Job controller's next launcher pod)."""
        deadline = time.monotonic() + timeout
        while True:
            got = predicate()
            if got:
                return got
            code = None if after_exit else self.exit_code()
            if code is not None:
                raise JobError(f"the launcher exited {code} while waiting for {what}:\n"
                               f"{self.tail()}")
            if time.monotonic() > deadline:
                raise JobError(f"timed out after {timeout:.0f}s waiting for {what} (stacks of "
                               f"its Python processes: {self.stacks()}):\n{self.tail()}")
            time.sleep(interval)

    def wait_training(self, past: int, size: int, timeout: float = 300) -> Record:
        def check() -> Record | None:
            last = self.last_step()
            return last if last and last["step"] > past and last["size"] == size else None
        return self.wait(f"a step past {past} at world size {size}", check, timeout)

    def wait_exit(self, timeout: float) -> int:
        """Wait until the newest launcher container terminated; return its exit code."""
        self.wait("the launcher's exit", lambda: self.exit_code() is not None, timeout,
                  after_exit=True)
        code = self.exit_code()
        assert code is not None
        return code

    def exit_code_within(self, timeout: float) -> int | None:
        """The newest launcher's exit code once it terminated, None if not within `timeout`."""
        deadline = time.monotonic() + timeout
        while (code := self.exit_code()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        return code

    def stacks(self) -> Path | str:
        """Dump the stacks of the job's Python processes (the launcher's supervisor and
        horovodrun, the workers' training processes) with py-spy, without stopping them (a
        frozen one is read as it is), into a file for the post-mortem of a wait that timed out;
        return its path, or why there is none."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            return "none: py-spy is not installed"
        chunks = []
        try:
            pods = [*self.launchers()[-1:], *self.workers().values()]
        except API_ERRORS as e:
            return f"none: the API did not list the pods: {e}"
        for pod in pods:
            node, uid = pod["spec"].get("nodeName"), pod["metadata"]["uid"]
            if not node:
                continue
            for pid in sorted(self.cluster.node(node).pod_pids(uid)):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                cmd = " ".join(a.decode(errors="replace") for a in argv if a)
                if "python" not in cmd.split(" ")[0]:
                    continue
                try:
                    res = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)],
                                         check=False, capture_output=True, text=True,
                                         timeout=30)
                    dump = res.stdout + res.stderr
                except subprocess.TimeoutExpired:
                    dump = "py-spy timed out\n"
                chunks.append(f"==== {pod['metadata']['name']} pid {pid}: {cmd[:300]}\n{dump}")
        path = self.out / f"stacks-{self.namespace}-{int(time.time())}.txt"
        path.write_text("\n".join(chunks) or "no Python process found\n")
        return path

    def tail(self, lines: int = 40) -> str:
        """What a failure's message shows: the last `lines` lines of the launcher's log that
        are not a rank's (the supervisor's decisions, horovodrun's own), the ranks' last ten,
        and the worker pods as the API shows them now (a pod that never starts says why only
        there: seen in CI, a replacement waiting for a Secret volume for 240 s, while the log's
        tail held only rank 0's step lines)."""
        text = self.text().splitlines()
        ranks = [line for line in text if line.startswith("[")]
        own = [line for line in text if not line.startswith("[")]
        return "\n".join(["-- the launcher's log, its last lines that are not a rank's:",
                          *own[-lines:], "-- the ranks' last lines:", *ranks[-10:],
                          "-- the worker pods now:", *self.pod_lines()])

    def pod_lines(self) -> list[str]:
        """One line per worker pod: its node, phase, and why it waits (the scheduler's or the
        kubelet's reason and message), or why the API did not answer."""
        try:
            pods = self.workers()
            resp = self.core.list_namespaced_event(self.namespace, field_selector="type=Warning",
                                                   _preload_content=False)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            return [f"(the API did not answer: {type(e).__name__}: {e})"]
        last: dict[str, str] = {}  # a pod's last Warning Event (FailedMount says only there)
        events = json.loads(resp.data)["items"]
        for e in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
            last[(e.get("involvedObject") or {}).get("name", "")] = (
                f"{e.get('reason')}: {(e.get('message') or '')[:200]}")
        return [pod_line(name, pods[name]) + (f"; last Warning {last[name]}" if name in last
                                              else "") for name in sorted(pods)]

    # -- faults -------------------------------------------------------------------------------

    def silence(self, *names: str) -> None:
        """Record that the test is about to make these pods or nodes silent, stuck or slow."""
        now = time.time()
        for name in names:
            self.silenced.setdefault(name, now)

    def false_verdicts(self) -> list[Record]:
        return false_verdicts(self.logs(), self.silenced)

    def verdicts(self) -> dict[str, Any]:
        """What `false_verdicts` found, counted (bench.suite and the demo record it)."""
        wrong = self.false_verdicts()
        return {"verdicts": {v: len(self.logs(v)) for v in VERDICTS},
                "false_hung": sum(1 for e in wrong if e["event"] in ("worker.hung",
                                                                      "worker.stuck")),
                "false_quarantine": sum(1 for e in wrong if e["event"] == "node.quarantined"),
                "false_slow": sum(1 for e in wrong if e["event"] == "worker.slow"),
                "false": [{k: e.get(k) for k in ("event", "pod", "node", "detail")}
                          for e in wrong]}

    def silence_node(self, node: Node) -> None:
        """Record a whole node about to go silent: the node and the job's pods on it."""
        self.silence(node.name, *(name for name, pod in self.workers().items()
                                  if pod["spec"].get("nodeName") == node.name))

    def node_of(self, pod: str) -> Node:
        obj = self.workers().get(pod) or self.pods(f"job-name={JOB}").get(pod)
        if obj is None:
            obj = json.loads(self.core.read_namespaced_pod(pod, self.namespace,
                                                           _preload_content=False).data)
        return self.cluster.node(obj["spec"]["nodeName"])

    def uid(self, pod: str) -> str:
        obj = json.loads(self.core.read_namespaced_pod(pod, self.namespace,
                                                       _preload_content=False).data)
        return str(obj["metadata"]["uid"])

    def processes(self, pod: str, match: Callable[[list[str]], bool]) -> list[int]:
        """Host pids of the pod's processes whose command line `match`es."""
        out = []
        for pid in self.node_of(pod).pod_pids(self.uid(pod)):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if match([a.decode(errors="replace") for a in argv if a]):
                    out.append(pid)
        return out

    def supervisors(self, pod: str) -> list[int]:
        """Host pids of the pod's supervisor processes (`elastic-supervisor run`), never the
        keeper above one in sidecar mode (`python -m supervisor.keeper -- elastic-supervisor
        run`): the keeper's child is the supervisor, exec'd or a fork of the keeper with its
        command line (supervisor/keeper.py's warm restarts)."""
        ours: dict[int, tuple[list[str], int]] = {}
        for pid in self.node_of(pod).pod_pids(self.uid(pod)):
            with contextlib.suppress(OSError):
                argv = [a.decode(errors="replace")
                        for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
                ours[pid] = (argv, parent_pid(pid))
        return supervisor_processes(ours)

    def kill_container(self, pod: str, sig: int = signal.SIGKILL) -> int:
        """Signal the pod's container's main process (PID 1 in the container's PID namespace,
        not the sandbox's pause): the container ends with 128+sig; with restartPolicy Never the
        pod fails."""
        pids = self.processes(pod, lambda argv: bool(argv) and argv[0] != "/pause")
        main = [pid for pid in pids if namespace_pid(pid) == 1]
        if not main:
            raise JobError(f"{pod}: no container main process found among {pids}")
        for pid in main:
            os.kill(pid, sig)
        return len(main)

    def kill_training(self, pod: str, sig: int = signal.SIGKILL) -> int:
        """Signal the training processes in the pod (python ... train.py), not the container."""
        pids = self.processes(pod, lambda argv: any(a.endswith(".py") for a in argv)
                              and any("python" in a for a in argv[:1]))
        for pid in pids:
            os.kill(pid, sig)
        return len(pids)

    def force_delete(self, pod: str) -> None:
        self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)

    def evict(self, pod: str) -> None:
        """Evict through the Eviction API (what `kubectl drain` does)."""
        self.core.create_namespaced_pod_eviction(pod, self.namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": self.namespace}})

    @contextlib.contextmanager
    def partitioned(self, pod: str) -> Iterator[str]:
        ip = self.workers()[pod]["status"]["podIP"]
        self.silence(pod)
        with self.cluster.partition(ip):
            yield ip


def parent_pid(pid: int) -> int:
    """The parent's pid of a host process (/proc/PID/stat: what follows the command's ")")."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def supervisor_processes(procs: Mapping[int, tuple[Sequence[str], int]]) -> list[int]:
    """PURE: of processes (pid -> (command line, parent's pid)), the supervisors: an exec'd
    `elastic-supervisor run`, or a keeper's child (exec'd, or forked with the keeper's own
    command line), never the keeper."""
    def ours(argv: Sequence[str]) -> bool:
        return "run" in argv and any("elastic-supervisor" in a for a in argv[:6])
    keepers = {pid for pid, (argv, _) in procs.items()
               if ours(argv) and "supervisor.keeper" in argv}
    return sorted(pid for pid, (argv, parent) in procs.items() if ours(argv) and (
        parent in keepers or (pid not in keepers
                              and any("elastic-supervisor" in a for a in argv[:2]))))


def pod_line(name: str, pod: Mapping[str, Any]) -> str:
    """`name` on its node, its phase, `deleting` while it is, and why it waits: the scheduler's
    condition (PodScheduled False) and each container's waiting reason, messages cut at 200."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    why = [f"{c.get('reason')}: {(c.get('message') or '')[:200]}"
           for c in status.get("conditions") or ()
           if c.get("type") == "PodScheduled" and c.get("status") == "False"]
    for c in (*(status.get("initContainerStatuses") or ()),
              *(status.get("containerStatuses") or ())):
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            why.append(f"{c.get('name')} {waiting.get('reason')}: "
                       f"{(waiting.get('message') or '')[:200]}")
    node = (pod.get("spec") or {}).get("nodeName") or "(no node)"
    deleting = " deleting" if meta.get("deletionTimestamp") else ""
    return f"{name} on {node}: {status.get('phase')}{deleting}" + "".join(
        f"; {w}" for w in why)

