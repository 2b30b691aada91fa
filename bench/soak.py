"""A seeded, bounded fault soak on real nodes (`python -m bench --only soak`): what a user
brings, with the shipped defaults.

The job: the native-sidecar overlay (manifests/overlays/sidecar: the trainer image as "your own
image", the supervisor beside it), 2 workers (max 3), training tests/e2e/stock_train.py, a stock
elastic Horovod script that imports nothing of ours and keeps NO checkpoint: a horovodrun
restart throws its progress away. The supervisor's settings are the manifests', the quarantine
included; only the budgets are widened for the plan (20 faults in a few minutes would exhaust
the shipped ones: budget exhaustion has its own e2e tests) with the backoff capped at 10 s.

FAULTS faults are drawn by a seeded random generator from the whole set, each once the job
trained at its desired size for a random number of steps: a worker's container killed, its
training process killed, a force delete, an eviction, a `kubectl drain` of its node, its node
frozen, its node's kubelet stopped, the pod partitioned, a scale-out or scale-in,
kube-apiserver stopped for OUTAGE_S, the sidecar supervisor SIGKILLed (the kubelet starts it
again and it adopts the run), the launcher's horovodrun killed so the launcher exits and its
Job runs the next one, and two faults in the middle of a recovery: a replacement killed while
it joins, and the supervisor SIGKILLed while a killed worker's replacement joins. A frozen node,
a stopped kubelet, a partition and a drain are undone once the job recovered without them.
Meanwhile, every second, the invariants are checked against the API and the launcher's discovery
file (read on the node's disk, from the launcher pod's emptyDir):
- never more live workers than the job's max, never two live pods for one slot;
- the file lists only usable hosts: a listed host's pod exists, runs, is Ready and not being
  deleted, on a node not NotReady (the file and the API are read one after the other, so a
  host counts only if it is unusable in two samples in a row). Hosts the supervisor keeps by
  design are usable: on a node NotReady for less than its node grace, or on nodes that went
  down together (the disruption brake, as kube-controller-manager's zones: after an API outage
  the node controller marks every node NotReady), until a node grace after the brake let go, or
  on a node down within a minute of the supervisor's view coming back from an API outage whose
  workers all heartbeat (the settling hold: supervisor.decide.nodes.settling_nodes; a worker
  the plan froze or partitioned does not), or, on a Ready node, marked not Ready by the node
  controller while its worker heartbeats (the supervisor keeps it until its kubelet marks it
  again: hostlist.kept_while_heartbeating). The node grace and that minute count from when the
  supervisor's node watch came back (its log says when), which after a restart of the only API
  server trails it by up to a minute: pods reach the API through the `kubernetes` Service;
- the budgets (the ledger in the state ConfigMap) never go backwards;
- no hang: no interval without a step longer than GAP_S (from rank 0's step times; the
  harness gives up after HANG_S), less the Job controller's backoff before it creates the next
  launcher (10 s, then 20 s, 40 s: Kubernetes', recorded per launcher exit as job_backoff_s);
and per fault: no horovodrun restart, at most one commit interval (COMMIT_EVERY steps) computed
again (the launcher exit excepted: a new horovodrun starts the script over, which is what it
measures), no restart budget charged by the supervisor's own outage, restart or retry or by
an announced disruption (FREE);
at the end no Hung or stuck verdict on a worker and no quarantine of a node the plan never
silenced (MainJob.false_verdicts), and the launcher exits 0 or one of its documented codes.
An API outage and a launcher exit retried by the Job must charge no restart budget, and during
the outage training goes on with no decision taken (issue 27). A killed supervisor's return is
timed: adopted_s, from the kill to its successor's horovodrun.adopted (the keeper's restart,
warm or not, and the start).
A failing seed becomes a regression test (its plan is `plan(seed)`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench import store
from localcluster import demo
from localcluster.job import (
    API_ERRORS,
    JOB,
    SIDECAR_OVERLAY,
    MainJob,
    log_time,
    supervisor_records,
)
from supervisor import kube
from supervisor.decide.classify import held_nodes
from supervisor.decide.nodes import OUTAGE_MIN_S, OUTAGE_SETTLE_S
from supervisor.observe import marked_not_ready
from tests.e2e.jobs import (
    CHECKPOINT_MOUNT,
    COMMIT_EVERY,
    STOCK,
    STOCK_DIR,
    STOP_FILE,
    Job,
    checkpointed,
    compose,
    recomputed_since,
    shared_write,
    stock_script_of,
    with_policy,
)

FAULTS = ("kill", "kill-training", "force-delete", "evict", "drain", "freeze", "kubelet",
          "partition", "scale", "api-outage", "supervisor-kill", "launcher-exit", "kill-joining",
          "kill-then-supervisor")
# Faults that must cost no restart budget: the supervisor's own outage, restart and retry (issue
# 27), and what an operator or the cluster announces (a drain, an eviction, a scale).
FREE = ("api-outage", "supervisor-kill", "launcher-exit", "drain", "evict", "scale")
# A new horovodrun: the script, without a checkpoint, starts over (measured, not bounded).
STARTS_OVER = ("launcher-exit",)
OUTAGE_S = 180.0  # a managed control-plane upgrade
# The supervisor's node grace (SUPERVISOR_NODE_GRACE_SECONDS, 10 s) and the sampling's slack.
NODE_KEPT_S = 15.0
BRAKE_THRESHOLD = 0.55  # SUPERVISOR_NODE_DISRUPTION_THRESHOLD, as the manifests leave it
COUNT = 20
STEPS = 1_000_000  # outlasts any plan: training is ended through the stop file after it
HANG_S = 180.0  # the harness gives up: no step for this long
GAP_S = 30.0  # a longer interval without a step breaks the invariant (issue 14's target)
DOCUMENTED_EXITS = (0, 5, 6, 9)  # success, FailJob, restart limit, horovodrun restart limit
SLOT_LABEL = "elastic-supervisor/slot"
# The discovery file in the launcher pod's emptyDir (the sidecar overlay's: its shared directory).
HOSTFILE = Path("elastic-supervisor") / "hosts"


@dataclass(frozen=True)
class Step:
    fault: str
    after_steps: int  # trained at the desired size before it


def plan(seed: int, count: int = COUNT) -> list[Step]:
    """The faults of a seed, in order."""
    rng = random.Random(seed)
    return [Step(rng.choice(FAULTS), rng.randint(5, 80)) for _ in range(count)]


@dataclass(frozen=True)
class Sample:
    """What one look at the job saw: its worker pods and nodes (API objects as dicts), the
    hosts in the discovery file, the ledger."""

    pods: Sequence[Mapping[str, Any]]
    nodes: Mapping[str, float | None]  # node name -> seconds it has been NotReady (None: Ready)
    hosts: frozenset[str]
    ledger: Mapping[str, Any]
    held: frozenset[str] = frozenset()  # nodes braked now or within NODE_KEPT_S (Watch)
    recent: frozenset[str] = frozenset()  # nodes NotReady now or within NODE_KEPT_S (Watch)
    settling: frozenset[str] = frozenset()  # nodes the settling hold keeps (settling)
    marked: frozenset[str] = frozenset()  # pods marked not Ready from outside, not quiet


def braked(pods: Sequence[Mapping[str, Any]],
           nodes: Mapping[str, float | None]) -> frozenset[str]:
    """The down nodes whose workers the supervisor's disruption brake holds: the rule as
    docs/failures-and-policies.md states it (supervisor.decide.classify.held_nodes) over the
    nodes of the job's workers and of the cluster."""
    job_nodes = {n for p in pods if (n := p.get("spec", {}).get("nodeName"))
                 and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")}
    down = {n for n, s in nodes.items() if s is not None}
    return held_nodes(frozenset(job_nodes), frozenset(nodes), frozenset(down), BRAKE_THRESHOLD)


def settling(pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, float | None], now: float,
             api_back: float | None, quiet: frozenset[str]) -> frozenset[str]:
    """The down nodes the supervisor's settling hold keeps: the rule of
    supervisor.decide.nodes.settling_nodes, seen from outside. Within OUTAGE_SETTLE_S of the
    supervisor's view coming back after an API outage (`api_back`: view_back's; plus NODE_KEPT_S
    for the file to follow) a down node stays while every live worker on it heartbeats: here,
    while none is `quiet` (a pod the plan froze or partitioned, which sends no heartbeat)."""
    if api_back is None or now - api_back > OUTAGE_SETTLE_S + NODE_KEPT_S:
        return frozenset()
    on: dict[str, list[str]] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if nodes.get(node or "") is not None and _live(pod):
            on.setdefault(node, []).append(pod["metadata"]["name"])
    return frozenset(n for n, names in on.items() if not quiet.intersection(names))


def view_back(records: Sequence[Mapping[str, Any]]) -> float | None:
    """When the supervisor's node watch last came back from an outage (a `watch.connected` line
    after OUTAGE_MIN_S or more broken; wall time), or None. Its settling hold and its node grace
    count from there, not from the API server's return: a pod reaches the API through the
    `kubernetes` Service, and after a restart of the only API server kube-proxy routes to it
    again only once its own watch is back (50 s after the API server, in seed 2 on 2026-11-29)."""
    back = [log_time(r) for r in records if r.get("event") == "watch.connected"
            and r.get("kind") == "node" and float(r.get("broken_s") or 0) >= OUTAGE_MIN_S]
    return max(back, default=None)


def as_seen(nodes: Mapping[str, float | None], now: float,
            back: float | None) -> dict[str, float | None]:
    """How long each node has been NotReady as the supervisor could see it: not longer than
    its view has been back (`back`, view_back's)."""
    if back is None:
        return dict(nodes)
    return {n: None if s is None else min(s, max(0.0, now - back)) for n, s in nodes.items()}


def not_ready_for(node: Any, now: float) -> float | None:
    """Seconds the node (a V1Node) has been NotReady or Unknown; None while it is Ready."""
    cond = next((c for c in node.status.conditions or () if c.type == "Ready"), None)
    if cond is not None and cond.status == "True":
        return None
    since = cond.last_transition_time.timestamp() if cond and cond.last_transition_time else 0
    return max(0.0, now - since)


def _live(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, and no container ended: the kubelet posts a container's end
    (exit 137, Ready False) a moment before it turns the phase to Failed, and the supervisor
    rightly replaces the pod in that moment."""
    status = pod.get("status", {})
    ended = any("terminated" in (cs.get("state") or {})
                for cs in status.get("containerStatuses") or ())
    return (status.get("phase") == "Running" and not ended
            and not pod["metadata"].get("deletionTimestamp"))


def unusable_hosts(s: Sample) -> set[str]:
    """Hosts in the file that no live, Ready pod on a node not NotReady has as its IP."""
    usable = set()
    for pod in s.pods:
        status = pod.get("status", {})
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or ())
        down_s = s.nodes.get(pod.get("spec", {}).get("nodeName", ""), float("inf"))
        # A node NotReady for less than the supervisor's node grace keeps its heartbeating
        # hosts listed (issue 27, item 12: a blip, or the node controller catching up after an
        # API outage); the node controller marks its pods not Ready meanwhile.
        # Back Ready, the node's pods stay not Ready (the node controller's mark) until their
        # kubelet posts them again, and the supervisor keeps their heartbeating hosts meanwhile
        # (13 s after the node came back, in the soak of seed 1 on 2026-11-29).
        node = pod.get("spec", {}).get("nodeName", "")
        # On a Ready node, a pod the node controller marked not Ready (observe.marked_not_ready)
        # and whose worker heartbeats is kept until its kubelet marks it again
        # (hostlist.kept_while_heartbeating): 49 s after its node was back, in the soak of seed
        # 1 on 2026-11-30 (the kubelet's own watch coming back after the API outage).
        kept = (down_s is not None and (down_s < NODE_KEPT_S or node in s.held
                                        or node in s.settling)) or (
            down_s is None and (node in s.recent or pod["metadata"]["name"] in s.marked))
        if _live(pod) and ((down_s is None and ready) or kept) and status.get("podIP"):
            usable.add(status["podIP"])
    return set(s.hosts) - usable


def violations(s: Sample, before: Sample | None, max_workers: int) -> list[str]:
    """The invariants one sample breaks, given the one before it (None: the first)."""
    out = []
    live = [p for p in s.pods if _live(p)]
    if len(live) > max_workers:
        out.append(f"{len(live)} live workers, max {max_workers}")
    slots: dict[str, list[str]] = {}
    for p in live:
        slots.setdefault(p["metadata"].get("labels", {}).get(SLOT_LABEL, "?"), []).append(
            p["metadata"]["name"])
    out += [f"slot {slot} has {len(names)} live pods: {sorted(names)}"
            for slot, names in sorted(slots.items()) if len(names) > 1]
    if before is not None:
        still = unusable_hosts(s) & unusable_hosts(before)
        if still:
            out.append(f"the file lists unusable hosts {sorted(still)}")
        old, new = before.ledger, s.ledger
        if new.get("total", 0) < old.get("total", 0):
            out.append(f"ledger total went back: {old.get('total')} -> {new.get('total')}")
        for slot, n in (old.get("perSlot") or {}).items():
            if (new.get("perSlot") or {}).get(slot, 0) < n:
                out.append(f"ledger of slot {slot} went back: {n} -> "
                           f"{(new.get('perSlot') or {}).get(slot, 0)}")
    return out


def gaps(steps: Sequence[Mapping[str, Any]], over: float = GAP_S,
         backoffs: Sequence[tuple[float, float]] = ()) -> list[dict[str, Any]]:
    """The intervals without a step longer than `over` seconds, from rank 0's step lines (their
    wall-clock `time`), each with the step it followed. `backoffs` are the Job controller's
    waits (when the launcher ended, seconds until it created the next one): its exponential
    backoff (10 s, 20 s, 40 s, ... by the Job's failed pods) is Kubernetes' and no process of
    the job runs during it, so an interval is held to `over` without the part of each wait
    inside it (the API's times are whole seconds: a launcher that ended in the second of the
    interval's first step reads as ended just before it)."""
    out = []
    for a, b in itertools.pairwise(steps):
        waited = sum(max(0.0, min(b["time"], t + s) - max(a["time"], t)) for t, s in backoffs)
        if b["time"] - a["time"] - waited > over:
            out.append({"gap_s": round(b["time"] - a["time"], 1), "after_step": a["step"],
                        **({"job_backoff_s": round(waited, 1)} if waited else {})})
    return out


def job_backoff(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[float, float]:
    """When the launcher pod `old` ended (its containers' latest finishedAt) and the seconds
    until the Job controller created `new`, its successor (API times: whole seconds)."""
    ended = max((parse_time(cs["state"]["terminated"]["finishedAt"])
                 for cs in (old.get("status") or {}).get("containerStatuses") or ()
                 if (cs.get("state") or {}).get("terminated", {}).get("finishedAt")),
                default=None)
    created = parse_time(new["metadata"]["creationTimestamp"])
    if ended is None:
        raise ValueError(f"launcher pod {old['metadata']['name']} has no finished container")
    return ended, max(0.0, created - ended)


def parse_time(stamp: Any) -> float:
    """An API timestamp (RFC 3339 text, or the client's datetime) as epoch seconds."""
    if isinstance(stamp, str):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return float(stamp.timestamp())


def longest_gap(steps: Sequence[Mapping[str, Any]]) -> float:
    return round(max((b["time"] - a["time"] for a, b in itertools.pairwise(steps)),
                     default=0.0), 2)


def _generous(policy: dict[str, Any]) -> None:
    # Backoff capped at 10 s (the manifests': 60 s): a slot hit again and again would otherwise
    # wait a minute per fault and the plan would not fit the training (backoff has unit tests).
    policy.update(restartLimit=10 * COUNT, restartLimitPerSlot=10 * COUNT,
                  restartRate={"limit": 10 * COUNT, "windowSeconds": 600},
                  backoff={"initialSeconds": 1, "maxSeconds": 10})


generous_budget = with_policy(_generous)  # the manifests' policy with room for the whole plan


def job_retries(docs: list[dict[str, Any]]) -> None:
    """The launcher Job retries as often as the plan may make its launcher exit."""
    for doc in docs:
        if doc["kind"] == "Job":
            doc["spec"]["backoffLimit"] = COUNT


@dataclass
class Watch:
    """The invariant checker's thread and what it found."""

    job: MainJob
    max_workers: int
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    braked_at: dict[str, float] = field(default_factory=dict)  # node -> last seen braked
    down_at: dict[str, float] = field(default_factory=dict)  # node -> last seen NotReady
    back: float | None = None  # when the supervisor's view came back (view_back)
    log_at: int = 0  # how far the launcher's log has been read for it
    # pods the plan froze or partitioned now (rebound, never changed in place: the checker's
    # thread reads it)
    quiet: frozenset[str] = frozenset()

    def state(self) -> dict[str, Any]:
        """The supervisor's stored state, read as it reads it (plain or compressed)."""
        state, _ = kube.StateStore(self.job.core.api_client, self.job.namespace,
                                   f"{JOB}-supervisor-state", None).load()
        return state or {}

    def ledger_total(self) -> int:
        """The restart budget charged so far (retried through an API outage)."""
        for _ in range(60):
            with contextlib.suppress(client.ApiException, kube.KubeError, KeyError, ValueError,
                                     *API_ERRORS):
                return int((self.state().get("ledger") or {}).get("total", 0))
            time.sleep(1)
        raise SystemExit("soak: the state ConfigMap could not be read for 60 s")

    def sample(self) -> Sample:
        pods = list(self.job.workers().values())
        now = time.time()
        nodes = {n.metadata.name: not_ready_for(n, now) for n in self.job.core.list_node().items}
        hosts: frozenset[str] = frozenset()
        launcher = self.job.launcher()
        if launcher and launcher["spec"].get("nodeName"):
            path = (self.job.cluster.node(launcher["spec"]["nodeName"]).dir / "kubelet" / "pods"
                    / launcher["metadata"]["uid"] / "volumes" / "kubernetes.io~empty-dir"
                    / HOSTFILE)
            with contextlib.suppress(OSError):
                hosts = frozenset(line.split(":")[0] for line in path.read_text().split()
                                  if line)
        ledger: dict[str, Any] = {}
        with contextlib.suppress(kube.KubeError, KeyError, ValueError):
            ledger = self.state().get("ledger") or {}
        self.braked_at.update(dict.fromkeys(braked(pods, nodes), now))
        held = frozenset(n for n, t in self.braked_at.items() if now - t < NODE_KEPT_S)
        self.down_at.update({n: now for n, down in nodes.items() if down is not None})
        recent = frozenset(n for n, t in self.down_at.items() if now - t < NODE_KEPT_S)
        self.back = max(filter(None, (self.back, view_back(self.new_records()))), default=None)
        seen = as_seen(nodes, now, self.back)
        marked = frozenset(p["metadata"]["name"] for p in pods if marked_not_ready(p)) - \
            self.quiet
        return Sample(pods, seen, hosts, ledger, held, recent,
                      settling(pods, seen, now, self.back, self.quiet), marked)

    def new_records(self) -> list[dict[str, Any]]:
        """The supervisor's log lines the launcher's log got since the last call (this thread's
        own reading: the job's parser belongs to the main thread)."""
        try:
            with self.job.log.open("rb") as f:
                f.seek(self.log_at)
                new = f.read()
        except FileNotFoundError:
            return []
        end = new.rfind(b"\n") + 1
        self.log_at += end
        return supervisor_records(new[:end].decode(errors="replace"))

    def run(self) -> None:
        before: Sample | None = None
        while not self.stop.wait(1.0):
            try:
                s = self.sample()
            except API_ERRORS as e:  # an API hiccup is not a violation
                print(f"\nsoak: sample failed: {e}")
                continue
            if self.stop.is_set():
                break  # training ended meanwhile: what follows is the cleanup, not the job
            self.samples += 1
            for v in violations(s, before, self.max_workers):
                self.violations.append(f"{time.strftime('%H:%M:%S')} {v}")
                print(f"\nsoak: VIOLATION {v}")
            before = s


def started_over(run: demo.Run, job: Job, n: int, since: float) -> Callable[[], bool]:
    """A horovodrun started after `since` (by the Job's next launcher) took a step at world
    size n, with n worker pods (demo.at_size, for a run that begins instead of resetting)."""
    def check() -> bool:
        started = [log_time(r) for r in job.logs_since("horovodrun.started", since)]
        stepped = bool(started) and any(s["time"] >= started[-1] and s["size"] == n
                                        for s in run.steps[-50:])
        return stepped and len(demo.worker_pods(job.core, job.namespace)) == n
    return check


def post_mortem(job: Job) -> Path:
    """Leave what the diagnosis of a hang needs in the run's log directory, before the cluster
    goes: the supervisor's `status` (its view of each training process's progress), the pods,
    and the Python processes' stacks (py-spy); return where. (Seed 12 at 57025c3 hung for
    good after a partition and left only the launcher's log.)"""
    out = job.out / f"hang-{int(time.time())}"
    out.mkdir(exist_ok=True)
    for name, get in (("status.json", lambda: job.cli("status", "--output", "json")),
                      ("pods.txt", lambda: "\n".join(job.pod_lines()) + "\n"),
                      ("stacks.txt", lambda: f"{job.stacks()}\n")):
        try:
            (out / name).write_text(get())
        except Exception as e:  # the post-mortem must not hide the hang it reports
            (out / name).write_text(f"none: {type(e).__name__}: {e}\n")
    return out


def drive(job: Job, steps: list[Step], watch: Watch, stop_file: Path) -> dict[str, Any]:
    core = job.core
    run = demo.Run(job.log)
    desired, undo = 2, []
    done: list[dict[str, Any]] = []
    exits: list[int] = []  # of the launchers the plan made exit
    backoffs: list[tuple[float, float]] = []  # the Job controller's waits before its retries
    last_progress = [time.monotonic(), 0]

    def progress() -> None:
        if run.step != last_progress[1]:
            last_progress[:] = [time.monotonic(), run.step]
        elif time.monotonic() - last_progress[0] > HANG_S and not run.done:
            raise SystemExit(f"soak: no step for {HANG_S:.0f}s (hang) at step {run.step}; "
                             f"post-mortem in {post_mortem(job)}")
        print(f"\rsoak: step {run.step:>5}/{STEPS} size {run.size} faults {len(done)}/"
              f"{len(steps)} violations {len(watch.violations)}", end="", flush=True)

    def victim() -> str:
        pods = demo.worker_pods(core, job.namespace)
        launcher = job.launcher()
        node = launcher["spec"].get("nodeName") if launcher else None
        others = [p for p in pods if p.spec.node_name != node] or pods
        return str(random.Random(len(done)).choice(others).metadata.name)

    def hold(cm: contextlib.AbstractContextManager[Any]) -> None:
        cm.__enter__()
        undo.append(lambda: cm.__exit__(None, None, None))

    def quiet(*pods: str) -> None:
        """Pods that send no heartbeat until the fault is undone (the settling hold's rule)."""
        watch.quiet = watch.quiet | set(pods)
        undo.append(lambda: setattr(watch, "quiet", watch.quiet - set(pods)))

    def kill_then(pod: str, then: Callable[[], None]) -> None:
        """Kill `pod`'s container, then do `then` while its replacement joins (a recovery under
        way: the faults that strike one)."""
        job.kill_container(pod)
        then()

    def when_its_replacement_runs(pod: str) -> None:
        successor = job.successor(pod)
        demo.wait(f"{successor} running", lambda: job.workers().get(successor, {}).get(
            "status", {}).get("phase") == "Running", run, 120, progress)
        job.kill_container(successor)

    def act(fault: str) -> int:
        if fault == "scale":
            target = 3 if desired == 2 else 2
            demo.scale(job, target)
            return target
        if fault == "supervisor-kill":
            os.kill(job.supervisor_pid(), signal.SIGKILL)  # its keeper starts it again
            return desired
        pod = victim()
        node = job.node_of(pod)
        if fault == "kill":
            job.kill_container(pod)
        elif fault == "kill-training":
            job.kill_training(pod)
        elif fault == "kill-joining":
            kill_then(pod, lambda: when_its_replacement_runs(pod))
        elif fault == "kill-then-supervisor":
            kill_then(pod, lambda: os.kill(job.supervisor_pid(), signal.SIGKILL))
        elif fault == "force-delete":
            job.force_delete(pod)
        elif fault == "evict":
            job.evict(pod)
        elif fault == "drain":
            undo.append(lambda n=node.name: job.kubectl("uncordon", n, namespaced=False))
            job.drain(node.name)
        elif fault == "freeze":
            job.silence_node(node)
            quiet(*(name for name, p in job.workers().items()
                    if p["spec"].get("nodeName") == node.name))
            node.freeze()
            undo.append(node.thaw)
        elif fault == "kubelet":
            job.silence_node(node)
            node.stop_kubelet()
            undo.append(node.start_kubelet)
        elif fault == "partition":
            quiet(pod)
            hold(job.partitioned(pod))
        elif fault == "api-outage":
            # On this (main) thread: the control plane's children die with the thread that
            # started them. Training must go on meanwhile, nothing decided.
            assert job.cluster.cp is not None
            job.cluster.cp.restart_apiserver(down_s=OUTAGE_S)
        elif fault == "launcher-exit":
            launcher = job.launcher()
            assert launcher is not None
            pids = job.processes(launcher["metadata"]["name"],
                                 lambda argv: any("horovodrun" in a for a in argv[:3]))
            for pid in pids:
                os.kill(pid, signal.SIGKILL)  # the launcher ends: the Job retries it
            deadline = time.monotonic() + 120
            while run.ended is None:
                if time.monotonic() > deadline:
                    raise SystemExit("soak: the launcher did not exit after its horovodrun "
                                     "was killed")
                run.poll()
                time.sleep(0.2)
            exits.append(run.ended)
            run.ended = None  # the Job's next launcher carries the job on
        return desired

    demo.wait("training to start", lambda: run.step > 0, run, 600, progress)
    for step in steps:
        start = run.step
        demo.wait(f"{step.after_steps} steps", lambda s=step, b=start: run.step >= b + s.after_steps
                  or run.done, run, 300, progress)
        if run.done:
            break
        t0 = time.time()
        charged_before = watch.ledger_total()
        desired = act(step.fault)
        acted = time.time()
        if step.fault == "api-outage":
            run.poll()
            during = [s["time"] for s in run.steps if t0 + 5 <= s["time"] <= acted - 5]
            outage = {"steps_during": len(during), "decisions_during": sum(
                t0 <= log_time(d) <= acted for d in run.decisions)}
        elif step.fault == "supervisor-kill":
            # Nothing to regroup: the new supervisor adopts the run, and training goes on.
            adopted = job.wait("the horovodrun adopted",
                               lambda t=t0: job.logs_since("horovodrun.adopted", t), 120)
            outage = {"adopted_s": round(log_time(adopted[0]) - t0, 2)}
            demo.wait("10 steps after the adoption", lambda b=run.step: run.step >= b + 10, run,
                      120, progress)
        elif step.fault in STARTS_OVER:
            # The Job's next launcher starts a new horovodrun: the script starts over (from its
            # first step, without a checkpoint), with no elastic reset to wait for.
            outage = {}
            demo.wait(f"recovery from {step.fault}", started_over(run, job, desired, t0), run,
                      300, progress)
            launchers = job.launchers()
            ended, waited = job_backoff(launchers[-2], launchers[-1])
            backoffs.append((ended, waited))
            outage = {"job_backoff_s": round(waited, 1)}
        else:
            outage = {}
            demo.wait(f"recovery from {step.fault}", demo.at_size(run, job, desired, t0), run,
                      300, progress)
        while undo:
            undo.pop()()
        run.poll()
        if step.fault == "kill-then-supervisor" and (
                adopted := job.logs_since("horovodrun.adopted", t0)):
            outage = {"adopted_s": round(log_time(adopted[0]) - t0, 2)}
        done.append({"fault": step.fault, "recovered_s": round(time.time() - t0, 1),
                     "at_step": start + step.after_steps,
                     "horovodrun_restarts": sum(r["seen"] >= t0 for r in run.restarts),
                     "recomputed": recomputed_since(run.steps, t0),
                     "charged": watch.ledger_total() - charged_before, **outage})
        print(f"\nsoak: fault {len(done)}: {done[-1]}")
    # The plan is over: training ends a few steps on (the job is sized to outlast any plan).
    shared_write(stop_file, str(run.step + 50))
    demo.wait("the end of training", lambda: run.done or run.ended is not None, run,
              600, progress)
    # From here the job ends: horovodrun exits, the supervisor deletes the workers and no
    # longer keeps the file (nobody reads it): the invariants held while it ran.
    watch.stop.set()
    print()
    return {"faults": done, "exit_code": job.exit_code_within(120), "steps": run.step,
            "launcher_exits": exits,
            "longest_gap_s": longest_gap(run.steps), "gaps": gaps(run.steps, backoffs=backoffs),
            "horovodrun_restarts": [r.get("reason") for r in run.restarts]}


def soak(seed: int, count: int = COUNT) -> dict[str, Any]:
    steps = plan(seed, count)
    print(f"soak: seed {seed}: " + ", ".join(s.fault for s in steps))
    out = Path(tempfile.mkdtemp(prefix=f"soak-{seed}-"))
    with demo.started_cluster() as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        # The shared directory holds the stop file only: the script keeps no checkpoint.
        _, mount = checkpointed(out / "shared")
        args = ["python", f"{STOCK_DIR}/{STOCK.name}", "--batches", str(STEPS),
                "--batches-per-commit", str(COMMIT_EVERY), "--sleep", "0.05",
                "--stop-file", f"{CHECKPOINT_MOUNT}/{STOP_FILE}"]
        job = Job(cluster, api, f"soak-{seed}", out, args=args, overlay=SIDECAR_OVERLAY,
                  transform=compose(stock_script_of(STOCK), generous_budget, mount,
                                    job_retries),
                  env={"SUPERVISOR_HOROVODRUN_RESTART_LIMIT": str(COUNT)})
        job.stop_file = out / "shared" / STOP_FILE
        watch = Watch(job, max_workers=3)
        checker = threading.Thread(target=watch.run, name="invariants", daemon=True)
        try:
            job.apply()
            checker.start()
            result = drive(job, steps, watch, job.stop_file)
            result["false_verdicts"] = [
                {k: e.get(k) for k in ("event", "pod", "node", "time")}
                for e in job.false_verdicts()]
            result["verdicts"] = job.verdicts()
        finally:
            watch.stop.set()
            checker.join(5)
            job.delete()
            api.close()
    result.update(seed=seed, commit=store.commit(), when=store.now(),
                  planned=[s.fault for s in steps], samples=watch.samples,
                  violations=watch.violations, logs=str(out),
                  ok=not watch.violations and not result["gaps"]
                  and result["exit_code"] in DOCUMENTED_EXITS
                  and not any(f["charged"] for f in result["faults"] if f["fault"] in FREE)
                  and not result["horovodrun_restarts"] and not result["false_verdicts"]
                  and all(f["recomputed"] <= COMMIT_EVERY for f in result["faults"]
                          if f["fault"] not in STARTS_OVER)
                  and all(f["steps_during"] > 0 and not f["decisions_during"]
                          for f in result["faults"] if f["fault"] == "api-outage")
                  and len(result["faults"]) >= min(count, COUNT))
    print(f"soak: seed {seed}: {len(result['faults'])} faults, exit {result['exit_code']}, "
          f"{len(watch.violations)} violations in {watch.samples} samples, longest interval "
          f"without a step {result['longest_gap_s']} s (over {GAP_S:.0f} s: {result['gaps']}); "
          f"logs in {out}")
    return result


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `soak` block: the seeds' runs (`soak_details`) summed up."""
    return {"seeds": [r["seed"] for r in runs], "ok": all(r["ok"] for r in runs),
            "faults": sum(len(r["faults"]) for r in runs),
            "horovodrun_restarts": sum(len(r.get("horovodrun_restarts", ())) for r in runs),
            "recomputed_max": max((f.get("recomputed", 0) for r in runs for f in r["faults"]
                                   if f["fault"] not in STARTS_OVER), default=0),
            "false_verdicts": sum(len(r.get("false_verdicts", ())) for r in runs),
            "longest_gap_s": max(r["longest_gap_s"] for r in runs),
            "violations": sum(len(r["violations"]) for r in runs)}


def merged(stored: Sequence[Mapping[str, Any]],
           new: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs the `soak` block sums up: the new ones, and the stored runs of other seeds of
    this soak (the stock script's: they carry `false_verdicts`; the main job's earlier soak
    had another job and other bounds), by seed. Each run says its commit and when it ran."""
    seeds = {r["seed"] for r in new}
    kept = [r for r in stored if "false_verdicts" in r and r["seed"] not in seeds]
    return sorted([*kept, *new], key=lambda r: r["seed"])


def main(seeds: Sequence[int] = (1,),
         stored: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    runs = merged(stored, [soak(seed) for seed in seeds])
    return {"soak": summary(runs), "soak_details": runs}
