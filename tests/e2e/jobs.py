"""End-to-end jobs on real nodes: the main job of the manifests, in a namespace per test.

Nothing here is a stand-in: localcluster.job.MainJob applies `manifests/overlays/local` (the
launcher image runs the supervisor with the manifests' ServiceAccount; the supervisor creates the
worker pods from the worker image; horovodrun trains worker_image/train.py on them over ssh), on
the session's cluster with real nodes (kubelet + containerd each). Faults are injected on the
nodes (a container's process killed, a node frozen, a kubelet stopped, iptables) and through the
API (force delete, eviction).

`check_training` asserts what every scenario promises: the target step reached, no committed step
lost, at most COMMIT_EVERY steps computed again after a rollback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from localcluster.job import JOB, OVERLAY, MainJob, Record, edit_worker_template, log_time
from localcluster.nodes import Cluster
from supervisor import kube
from supervisor.config import Config
from supervisor.hook.elastic_supervisor_hook import worker

COMMIT_EVERY = 5
CHECKPOINT_MOUNT = "/checkpoint"  # where every worker mounts the job's checkpoint directory
STOP_FILE = "stop"  # in it: the step to end training at (--stop-file of both scripts)
HANG_FILE = "hang"  # in it: the host whose rank deadlocks (--hang-file of the stock script)
TRAIN = "/workspace/train.py"  # in the worker image
Transform = Callable[[list[dict[str, Any]]], None]
# The stock scripts' extra seconds per batch in the tours, on real nodes and on loopback. A
# Horovod rank spends CPU while it waits in a collective (torch's WaitAndClear polls with
# sched_yield) and in its background loop: two ranks of stock_train.py on loopback took 0.78
# cores at --sleep 0.05 and 0.40 at 0.2, the TensorFlow script 1.35 and 0.82 (2026-11-29); a
# step adds at most this much to a measured resume. (At 0.2 the auto stuck threshold once
# reached 30.5 s: it counted the new world's first intervals, which wait for a joiner still
# tracing, as step times; beats.WARMUP_GAPS leaves them out now.)
TOUR_SLEEP = "0.2"
# worker_image/train.py computes flat out (two ranks took both cores on loopback at its default
# width): its workers in the tours get this CPU limit, so that the supervisor, the kubelets and
# the control plane on the same two cores (and tours beside it, NODES_BESIDE) still get theirs.
TRAIN_CPU_LIMIT = "500m"
# A tour ends this far ahead of rank 0's last printed step: every rank must read the stop file
# before it passes that step (it reads it at every batch; rank 0's lines reach the launcher's
# log within a second). 100 steps were 25-40 s of a tour's end at --sleep 0.2.
STOP_AHEAD_S = 6.0


def train_args(steps: int, *extra: str) -> list[str]:
    return ["python", TRAIN, "--steps", str(steps), "--commit-every", str(COMMIT_EVERY), *extra]


def steps_of(records: list[Record]) -> list[Record]:
    return [r for r in records if "loss" in r]


def step_after_reset(records: list[Record], t0: float, size: int | None = None) -> Record | None:
    """Rank 0's first step after the first reset (to world size `size`, if given) that came
    after wall time `t0`; None if there is none yet."""
    for i, r in enumerate(records):
        if r.get("event") == "reset" and r["time"] > t0 and size in (None, r["size"]):
            later = steps_of(records[i:])
            return later[0] if later else None
    return None


STOCK = Path(__file__).resolve().with_name("stock_train.py")
STOCK_TF = STOCK.with_name("stock_tf_train.py")  # the seeds' TensorFlow 2 shape
STOCK_KERAS = STOCK.with_name("stock_keras_train.py")  # Keras model.fit, elastic callbacks
STOCK_DIR = "/opt/stock"  # where the worker pods find it (a ConfigMap volume)
TRAINER = "elastic-supervisor-trainer:0.1.0"  # the sidecar overlay's YOUR IMAGE
TRAINER_TF = "elastic-supervisor-trainer-tf:0.1.0"  # TensorFlow's (trainer_tf_image/)


def mount_in_workers(docs: list[dict[str, Any]], volume: dict[str, Any],
                     mount: dict[str, Any]) -> None:
    """Every worker gets `volume`, mounted in its training container as `mount`."""
    def change(template: dict[str, Any]) -> None:
        spec = template["spec"]
        spec.setdefault("volumes", []).append(volume)
        spec["containers"][0].setdefault("volumeMounts", []).append(mount)
    edit_worker_template(docs, change)


def stock_script_of(script: Path) -> Transform:
    """A transform that gives every worker `script` at STOCK_DIR, from a ConfigMap: a user's
    own, unmodified script next to the image's."""
    def transform(docs: list[dict[str, Any]]) -> None:
        namespace = next(d["metadata"]["namespace"] for d in docs if d["kind"] == "Job")
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "stock-train", "namespace": namespace},
                     "data": {script.name: script.read_text()}})
        mount_in_workers(docs, {"name": "stock", "configMap": {"name": "stock-train"}},
                         {"name": "stock", "mountPath": STOCK_DIR, "readOnly": True})
    return transform


stock_script = stock_script_of(STOCK)


def your_image(image: str) -> Transform:
    """A transform that does what the sidecar overlay tells its user to do with their own
    training image, and nothing else: the two `image:` lines marked YOUR IMAGE (the launcher
    pod's training container, the worker template's container) name `image`."""
    def transform(docs: list[dict[str, Any]]) -> None:
        changed = 0
        for doc in docs:
            if doc["kind"] == "Job":
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    if c["name"] == "launcher" and c["image"] == TRAINER:
                        c["image"], changed = image, changed + 1
            elif doc["kind"] == "ConfigMap" and "worker-template.yaml" in (doc.get("data")
                                                                           or {}):
                text = doc["data"]["worker-template.yaml"]
                changed += text.count(f"image: {TRAINER}")
                doc["data"]["worker-template.yaml"] = text.replace(f"image: {TRAINER}",
                                                                   f"image: {image}")
            elif doc["kind"] == "ValidatingAdmissionPolicy":
                # what the overlay's replacements do with the Job's training image (rendered
                # before this transform): the workers' images the admission policy admits
                for v in doc["spec"].get("variables") or ():
                    if v["name"] == "workerImages":
                        v["expression"] = v["expression"].replace(f"'{TRAINER}'", f"'{image}'")
        assert changed == 2, f"the overlay's YOUR IMAGE lines: {changed} found, not 2"
    return transform


def process_env(pid: int) -> dict[str, str]:
    """The environment of host process `pid` (a container's process seen from the node)."""
    return dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes()
                .decode(errors="replace").split("\0") if "=" in item)


def udp_ports(pid: int) -> list[int]:
    """The local ports of the UDP sockets host process `pid` holds, read in its own network
    namespace by the hook's reader (/proc/PID/net: the pod's; psutil reads this machine's,
    where a pod's sockets are not, and sees none)."""
    return [c.laddr[1] for c in worker.proc_tcp_connections(f"/proc/{pid}", ("udp", "udp6"))
            if c.laddr]


def shared_write(path: Path, text: str) -> None:
    """Replace `path` (on the volume every worker mounts) atomically, readable by them."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)


class Job(MainJob):
    """A MainJob with the waits and picks the scenarios share."""

    # On the host: the file the training script reads its last step from (--stop-file), in the
    # checkpoint directory every worker mounts; None for a job without one.
    stop_file: Path | None = None

    def stop_at(self, ahead_s: float = STOP_AHEAD_S) -> int:
        """End training about `ahead_s` seconds of steps (at least 10) past rank 0's last
        reported one, at its recent step rate (every rank reads the same number, so all stop
        at that step); return that step."""
        assert self.stop_file is not None, "the job was started without a checkpoint directory"
        recent = self.steps()[-20:]
        assert recent, "rank 0 reported no step yet"
        first, last = recent[0], recent[-1]
        took = float(last["time"]) - float(first["time"])
        rate = max(0.0, (int(last["step"]) - int(first["step"])) / took) if took > 0 else 0.0
        target = int(last["step"]) + max(10, math.ceil(rate * ahead_s))
        shared_write(self.stop_file, str(target))
        return target

    def hang(self, host: str) -> None:
        """Make the rank on `host` deadlock its main thread at its next batch (the stock
        script's --hang-file, next to the stop file); "" for nobody."""
        assert self.stop_file is not None, "the job was started without a checkpoint directory"
        self.silence(*(name for name, pod in self.workers().items()
                       if host and pod["status"].get("podIP") == host))
        shared_write(self.stop_file.with_name(HANG_FILE), host)

    def supervisor_pid(self) -> int:
        """The host pid of the supervisor (`elastic-supervisor run`) in the launcher pod (not
        the keeper above it in sidecar mode: Job.supervisors)."""
        launcher = self.launcher()
        assert launcher is not None
        pids = self.supervisors(launcher["metadata"]["name"])
        assert len(pids) == 1, pids
        return pids[0]

    def drain(self, node: str) -> subprocess.CompletedProcess[str]:
        """`kubectl drain` of the job's workers on `node`, as an operator runs it: cordon, then
        the Eviction API, waiting until they are gone. --force: workers name the launcher Job
        as owner but not as their controller (docs/failures-and-policies.md, "Planned
        disruptions"), which kubectl drain asks for."""
        return self.kubectl("drain", node, "--pod-selector", "elastic-supervisor/role=worker",
                            "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                            "--timeout=120s", namespaced=False, timeout=150)

    def nodes_ready(self) -> bool:
        """Every node of the job's cluster (of its pool, beside other tests) is Ready and
        schedulable."""
        mine = {n.name for n in self.cluster.nodes}
        return all(any(c.type == "Ready" and c.status == "True"
                       for c in n.status.conditions or ())
                   and not n.spec.unschedulable for n in self.core.list_node().items
                   if n.metadata.name in mine)

    def settled(self, size: int, timeout: float = 240) -> Record:
        """Wait until every node is Ready and the job trains at world size `size` with that
        many live workers: what a fault that is not meant to strike a recovery starts from."""
        self.wait("every node Ready", self.nodes_ready, timeout)
        past = (self.last_step() or {"step": 0})["step"]
        self.wait(f"{size} live workers", lambda: len(self.live_workers()) == size, timeout)
        return self.wait_training(past=past, size=size, timeout=timeout)

    @staticmethod
    def successor(pod: str) -> str:
        """The name of the pod that replaces `pod` in its slot (<job>-w<slot>-<incarnation>)."""
        slot, incarnation = pod.rsplit("-", 1)
        return f"{slot}-{int(incarnation) + 1}"

    def rank0_host(self) -> str:
        last = self.last_step()
        assert last is not None, "rank 0 reported no step yet"
        return str(last["host"])

    def victim(self) -> tuple[str, dict[str, Any]]:
        """A live worker pod that does not host rank 0 (so that rank 0's output stays whole;
        workers never share the launcher's node here: see workers_avoid_the_launcher)."""
        last = self.last_step()
        rank0 = str(last["host"]) if last else ""
        live = sorted(self.live_workers().items())
        for name, pod in live:
            if pod["status"].get("podIP") != rank0:
                return name, pod
        raise AssertionError(f"no live worker besides rank 0's {rank0}: {live}")

    def reset_after(self, t0: float, size: int) -> Callable[[], Record | None]:
        """A predicate: training reset to world size `size` after wall time `t0`, and stepped."""
        return lambda: step_after_reset(self.records(), t0, size)

    def back_to(self, size: int, t0: float, timeout: float = 240) -> Record:
        return self.wait(f"training reset to world size {size} after the fault",
                         self.reset_after(t0, size), timeout)

    def decision(self, pod: str) -> Record:
        found = [e for e in self.logs("worker.failed") if e.get("pod") == pod]
        assert len(found) == 1, f"expected one decision about {pod}: {found}"
        return found[0]

    def ssh_killed(self, pod: str) -> list[int]:
        """The pids of horovodrun's ssh clients to `pod`'s host that the supervisor killed."""
        return [pid for e in self.logs("worker.ssh_clients_killed") if e.get("pod") == pod
                for pid in e["pids"]]

    def logs_since(self, event: str, t0: float) -> list[Record]:
        """The supervisor's log lines `event` logged at or after wall time `t0` (a tour's
        fault looks only at what came after it)."""
        return [e for e in self.logs(event) if log_time(e) >= t0]

    def notes(self, reason: str) -> list[str]:
        return [e.get("note", "") for e in self.events() if e["reason"] == reason]

    def cli(self, command: str, *args: str) -> str:
        """`elastic-supervisor COMMAND --job ... ARGS` as a user runs it; its stdout."""
        return subprocess.run([sys.executable, "-m", "supervisor", command, "--job", JOB,
                               "--namespace", self.namespace, *args], check=True,
                              env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
                              capture_output=True, text=True).stdout

    def scale(self, workers: int) -> None:
        self.cli("scale", "--workers", str(workers))

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.cli("status", "--output", "json")))

    def status_as_printed(self) -> dict[str, Any]:
        """`status` once the progress was saved after now, its step checked against the one
        rank 0's script printed by then (within 2 %: the hook counts optimizer steps)."""
        asked = time.time()
        self.wait("the progress saved after now", lambda: (
            (self.status().get("progress") or {}).get("at") or 0) > asked + 1, 40)
        s = self.status()
        p = s["progress"]
        # rank 0's lines reach the launcher's log through ssh and horovodrun, up to a second
        # behind the hook's heartbeats (15 steps of the stock script): read them once they are
        # past the saved progress
        self.wait("rank 0's lines past the saved progress",
                  lambda: any(r["time"] > p["at"] for r in self.steps()), 30)
        printed = max(int(r["step"]) for r in self.steps() if r["time"] <= p["at"])
        assert abs(p["step"] - printed) <= max(10, printed // 50), (p["step"], printed)
        return s

    def state(self) -> dict[str, Any]:
        """The supervisor's stored state, read as it reads it (plain or compressed)."""
        state, _ = kube.StateStore(self.core.api_client, self.namespace,
                                   f"{JOB}-supervisor-state", None).load()
        assert state is not None, "no state saved yet"
        return state


def shared_checkpoint(docs: list[dict[str, Any]], host_dir: Path) -> None:
    """Give every worker the host directory `host_dir` at /checkpoint (the nodes share this
    machine's disk, as a cluster's workers would share a network volume): a PersistentVolume
    on it, bound to a claim the workers mount (a hostPath in the pod itself is what the
    manifests' admission policy refuses the supervisor)."""
    ns = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
    pv = f"checkpoint-{ns}"
    docs.append({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": str(host_dir), "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": "checkpoint"}}})
    docs.append({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "checkpoint", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    mount_in_workers(
        docs, {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "checkpoint"}},
        {"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT})


def cpu_limited(limit: str) -> Transform:
    """Every worker's training container gets a CPU limit of `limit` (a CFS quota), and asks
    for as much (a request may not exceed its limit)."""
    def change(template: dict[str, Any]) -> None:
        resources = template["spec"]["containers"][0].setdefault("resources", {})
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})["cpu"] = limit
    return lambda docs: edit_worker_template(docs, change)


def compose(*transforms: Transform) -> Transform:
    """One transform that applies `transforms` in order."""
    def transform(docs: list[dict[str, Any]]) -> None:
        for t in transforms:
            t(docs)
    return transform


def checkpointed(host_dir: Path) -> tuple[list[str], Transform]:
    """Make `host_dir` the checkpoint directory every worker mounts at /checkpoint (writable by
    the workers, who run as uid 1000); return the training arguments that keep the checkpoint
    there and the transform that mounts it."""
    host_dir.mkdir(parents=True, exist_ok=True)
    host_dir.chmod(0o777)
    return (["--checkpoint", f"{CHECKPOINT_MOUNT}/state.pt"],
            lambda docs: shared_checkpoint(docs, host_dir))


def tour_budgets(policy: dict[str, Any]) -> None:
    """The budgets of a tour's job: its faults come seconds apart, mostly on the one slot that
    does not host rank 0, so the shipped backoff (5 s doubling to 120 s), restart rate (5 per
    600 s) and limits (5 per slot, 20 in all) would hold back or refuse its later replacements.
    What the budgets do is proven by the restart-limit job and tests/unit/test_policy.py, not by
    the tours."""
    policy["backoff"] = {"initialSeconds": 1, "maxSeconds": 1}
    policy["restartRate"] = {"limit": 100, "windowSeconds": 600}
    policy["restartLimit"] = 100
    policy["restartLimitPerSlot"] = 100


def no_restart_since(job: Job, t0: float) -> None:
    """Assert that horovodrun was not restarted since the fault at `t0`: a restart starts a
    script without a checkpoint over from its first step (the tours' jobs keep one, which would
    otherwise hide it)."""
    restarts = job.logs_since("horovodrun.restarting", t0)
    assert restarts == [], f"horovodrun restarted: {[r.get('reason') for r in restarts]}"


def one_live_pod_per_slot(job: Job) -> None:
    """Assert that no slot has two live worker pods (a replacement beside the pod it
    replaces)."""
    slots: dict[str, list[str]] = {}
    for name in job.live_workers():
        slots.setdefault(name.rsplit("-", 1)[0], []).append(name)
    assert all(len(pods) == 1 for pods in slots.values()), f"two live pods in a slot: {slots}"


def alone_on_its_node(job: Job, pod: dict[str, Any]) -> None:
    """Assert that no other live worker shares `pod`'s node: a node fault must leave a
    survivor (each node fault leaves both workers on the node that stayed up, and a later
    replacement spreads them again: the tours order their faults for that)."""
    node = pod["spec"]["nodeName"]
    nodes = [p["spec"]["nodeName"] for p in job.live_workers().values()]
    assert nodes.count(node) == 1, f"the survivor is on another node: {nodes}"


def with_policy(change: Callable[[dict[str, Any]], None]) -> Transform:
    """A transform that changes the job's policy file (the ConfigMap's policy.yaml)."""
    def transform(docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            if doc["kind"] == "ConfigMap" and "policy.yaml" in (doc.get("data") or {}):
                policy = yaml.safe_load(doc["data"]["policy.yaml"])
                change(policy)
                doc["data"]["policy.yaml"] = yaml.safe_dump(policy)
    return transform


def workers_avoid_the_launcher(docs: list[dict[str, Any]]) -> None:
    """Keep workers off the launcher's node, so that a node fault never takes the supervisor
    with it (a test arrangement: in production they may share nodes)."""
    def change(template: dict[str, Any]) -> None:
        anti = template["spec"].setdefault("affinity", {}).setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append({
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"elastic-supervisor/role": "launcher"}}})
    edit_worker_template(docs, change)


@contextlib.contextmanager
def main_job(cluster: Cluster, api: client.ApiClient, out: Path, *, steps: int,
             extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
             checkpoint: Path | None = None, transform: Transform | None = None,
             command: list[str] | None = None, overlay: Path = OVERLAY,
             keeps_checkpoint: bool = True) -> Iterator[Job]:
    """The main job in a fresh namespace (applied), deleted afterwards. `checkpoint`: a host
    directory every worker mounts, where rank 0 keeps the committed state (`--checkpoint` is
    added to the command, unless not `keeps_checkpoint`: a script that keeps none, for which
    the directory holds only the stop and hang files); `command`: the training command instead
    of worker_image/train.py's (`steps` and `extra_args` are then not used)."""
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    args = list(command) if command is not None else train_args(steps, *extra_args)
    changes = [workers_avoid_the_launcher, *([cpu_limited(TRAIN_CPU_LIMIT)] if command is None
                                             else []),
               *([transform] if transform is not None else [])]
    if checkpoint is not None:
        more_args, mount = checkpointed(checkpoint)
        args += [*(more_args if keeps_checkpoint else ()),
                 "--stop-file", f"{CHECKPOINT_MOUNT}/{STOP_FILE}"]
        changes.append(mount)

    # The scenarios look at the workers after the end (the cleanup has its own tests), and a
    # launcher started again after a SIGKILL waits out the killed one's lease. horovodrun's
    # driver logs its registry and discovery (--verbose) into the launcher's log: what a failed
    # scenario's post-mortem needs. The main tour throws two node faults at each of its two
    # worker nodes, the node evidence a quarantine rightly acts on; it would leave the workers
    # one node, and the node faults after it no survivor: no quarantine unless a job asks for
    # the shipped one (SHIPPED_QUARANTINE: the stock and sidecar tours, the sidecar main job).
    env = {"SUPERVISOR_CLEAN_POD_POLICY": "None", "SUPERVISOR_LEADER_LEASE_SECONDS": "10",
           "SUPERVISOR_HOROVODRUN_EXTRA_ARGS": "--verbose", "SUPERVISOR_QUARANTINE_FAILURES": "0",
           **(env or {})}
    job = Job(cluster, api, namespace, out, args=args, env=env, transform=compose(*changes),
              overlay=overlay)
    if checkpoint is not None:
        job.stop_file = checkpoint / STOP_FILE
    try:
        job.apply()
        yield job
        # Every job on real nodes, whatever its faults: no capacity destroyed without cause.
        record_verdicts(job)
        wrong = job.false_verdicts()
        assert wrong == [], f"verdicts on workers or nodes the test never silenced: {wrong}"
    finally:
        job.delete()


# The shipped quarantine, for the jobs that run with it (main_job switches it off otherwise).
SHIPPED_QUARANTINE = {"SUPERVISOR_QUARANTINE_FAILURES": str(
    next(f.default for f in dataclasses.fields(Config) if f.name == "quarantine_failures"))}

# Where each job's verdicts are appended (one JSON line per job) when set: bench.suite sums them.
VERDICTS_FILE = "ES_VERDICTS_FILE"


def record_verdicts(job: Job) -> None:
    if not (path := os.environ.get(VERDICTS_FILE)):
        return
    line = {"namespace": job.namespace, "silenced": sorted(job.silenced), **job.verdicts()}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def check_training(records: list[Record], target: int, *, final_size: int,
                   resumed_from: int = 0) -> None:
    """Assert that training reached `target` without losing a committed step (at most
    COMMIT_EVERY steps computed again after a rollback), ending at world size `final_size`."""
    steps = steps_of(records)
    assert steps, "rank 0 reported no step"
    assert records[-1].get("event") == "done", f"no done event; last: {records[-1]}"
    assert records[-1]["step"] == target
    assert steps[-1]["step"] == target and steps[-1]["size"] == final_size, steps[-1]
    check_steps(records, resumed_from=resumed_from)


def check_steps(records: list[Record], *, resumed_from: int = 0) -> None:
    """Assert that every step up to rank 0's last one was computed and no committed step was
    lost (at most COMMIT_EVERY steps computed again after a rollback): what a job promises at
    any moment, checked by each fault of a tour on what happened so far."""
    steps = steps_of(records)
    assert steps, "rank 0 reported no step"
    committed, rerun, prev = resumed_from, 0, resumed_from
    checkpointed, host = resumed_from, None
    unseen: set[int] = set()
    for r in records:
        if r.get("event") == "resumed":  # a new run, from the checkpoint of the last commit
            committed = checkpointed = max(checkpointed, r["step"])
            continue
        if r.get("event") == "reset":
            # A regroup: every process goes on from the state synced at `step`, which is saved
            # (after a failure it is the last commit; at a host change the hook saves it
            # first): a later rollback comes back to it, not further (seen when two workers
            # died together right after a scale-out's regroup).
            committed = max(committed, r["step"])
            continue
        if "loss" not in r:
            continue
        moved, host = host is not None and r.get("host") != host, r.get("host")
        if moved and prev + 1 < r["step"] <= prev + 1 + COMMIT_EVERY:
            # Rank 0's worker died: the steps it computed and committed after its last line
            # that reached the launcher went with its ssh connection. The survivors resumed
            # from that commit, so the steps between were computed.
            unseen.update(range(prev + 1, r["step"]))
            committed = r["step"] - 1
        elif r["step"] != prev + 1:
            # A rollback: back to the step after the last commit, never further.
            assert r["step"] == committed + 1, (
                f"step {r['step']} after {prev}: expected {committed + 1} (the last commit + 1)")
            rerun = max(rerun, prev - committed)
        if r["committed"]:
            committed = r["step"]
        prev = r["step"]
    assert rerun <= COMMIT_EVERY, f"{rerun} steps computed again, more than {COMMIT_EVERY}"
    # A step's line can be lost with a killed launcher after its commit was checkpointed: the
    # checkpoint a later run resumed from proves the steps up to it were computed.
    seen = {r["step"] for r in steps} | set(range(resumed_from + 1, checkpointed + 1)) | unseen
    last = max(r["step"] for r in steps)
    missing = sorted(set(range(resumed_from + 1, last + 1)) - seen)
    assert not missing, f"steps never computed: {missing[:10]}"


def left_gracefully(job: Job, victims: list[str], t0: float, *why: str) -> None:
    """What every graceful leave promises (issue 24), for each of `victims` (announced together:
    the last of Horovod's world among them leaves once another joined): no failure decided,
    WorkerLeaving then WorkerLeft, the pod gone, back at full size, not one step computed again
    since the fault, horovodrun never restarted."""
    for victim in victims:
        job.wait(f"{victim} gone", lambda v=victim: v not in job.workers(), 90)
    job.back_to(2, t0)
    job.wait("the replacements at full size",
             lambda: all(job.successor(v) in job.live_workers() for v in victims)
             and len(job.live_workers()) == 2, 60)
    for victim in victims:
        assert [d for d in job.logs("worker.failed") if d.get("pod") == victim] == []
        leaving = [e for e in job.logs_since("worker.leaving", t0) if e["pod"] == victim]
        assert len(leaving) == 1 and leaving[0]["why"] in why, leaving
        left = [e for e in job.logs_since("worker.left", t0) if e["pod"] == victim]
        assert [e["how"] for e in left] == ["horovodrun let it go"], left
        assert any(victim in n for n in job.notes("WorkerLeaving"))
        assert any(victim in n and "horovodrun let it go" in n for n in job.notes("WorkerLeft"))
        assert job.live_workers()[job.successor(victim)]["status"]["phase"] == "Running"
    assert recomputed_since(job.records(), t0) == 0
    sizes = [r["size"] for r in job.records() if r.get("event") == "reset" and r["time"] >= t0]
    assert sizes and min(sizes) >= 1, f"training went below size - 1: resets to {sizes}"
    no_restart_since(job, t0)
    one_live_pod_per_slot(job)
    check_steps(job.records())


def evicted_leaves_gracefully(job: Job) -> None:
    """A worker (not rank 0's) evicted through the Eviction API once the job is settled at 2:
    it leaves gracefully (left_gracefully), not one step computed again."""
    job.settled(2)
    victim, _ = job.victim()
    t0 = time.time()
    job.evict(victim)
    left_gracefully(job, [victim], t0, "Evicted")


def recomputed_since(records: list[dict[str, Any]], t0: float) -> int:
    """Steps rank 0 computed again after wall time `t0` (a rollback to the last commit)."""
    steps = [r for r in records if "loss" in r]
    before = [r["step"] for r in steps if r["time"] < t0]
    prev, worst = (before[-1] if before else 0), 0
    for r in steps:
        if r["time"] >= t0:
            worst = max(worst, prev + 1 - r["step"])
            prev = r["step"]
    return worst
