"""`make demo`: the main job on this machine, with scripted faults, a live line and a summary.

Starts the local cluster with three real nodes (localcluster.nodes: kubelet + containerd each,
the launcher and worker images in every node) and applies `manifests/overlays/local`
(the same YAML as on kind: RBAC, PriorityClasses, the launcher Job, the worker template and policy
ConfigMaps, the ssh Secret) with kubectl (localcluster.job). The Job controller makes the launcher
pod (the supervisor, with the manifests' ServiceAccount), the supervisor creates the worker pods,
and horovodrun trains worker_image/train.py on them over ssh. Faults, each once the job is back at
full size and has trained a little: SIGKILL of a worker container's process, a force delete, a
frozen node (kubelet, containerd and pods stopped by the freezer cgroup), scale 2 -> 3, scale
3 -> 2. At the end: a table (fault, detection, training resumed, back to full size), the
supervisor's own timeline PNG (`elastic-supervisor timeline`: world size, step rate, incidents
by phase, goodput; drawn from the state and Events it stored, read before the cluster stops) and
everything stopped. What it measured (the table, goodput, restarts, exit code, wall time) goes to
the `demo` block of bench/results.json (bench/store.py), which README's demo table is held to.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench import store
from localcluster import images
from localcluster.job import BASE_NAMESPACE, MainJob
from localcluster.nodes import Cluster, ClusterSettings
from supervisor import cli, kube
from supervisor.decide import progress

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, JOB = BASE_NAMESPACE, "elastic-train"
STEPS = 3000  # manifests/overlays/local sets --steps 3000
RESULTS_KEY = "demo"  # the block of bench/results.json a run writes


@dataclass
class Fault:
    name: str
    at: float  # wall time
    desired: int
    detected: float | None = None
    resumed: float | None = None
    full: float | None = None
    usable: float | None = None  # a new worker entered the discovery file (replacement Ready)


@dataclass
class Run:
    """What the launcher's log shows: rank 0's steps and the supervisor's decisions."""

    log: Path
    started: float = field(default_factory=time.time)  # when the job was applied
    offset: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)  # workers.changed log lines
    resets: list[float] = field(default_factory=list)  # elastic resets and resumed runs
    restarts: list[dict[str, Any]] = field(default_factory=list)  # horovodrun.restarting lines
    done: bool = False
    ended: int | None = None  # the launcher's exit code, once it ended

    def poll(self) -> None:
        if not self.log.exists():
            return
        with self.log.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for raw in chunk[:end].decode(errors="replace").splitlines():
            _, sep, text = raw.partition("]<stdout>:")
            line = text if sep else raw
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "loss" in rec and "step" in rec:
                self.steps.append(rec)
            elif rec.get("event") in ("reset", "resumed"):
                # A new run of horovodrun that resumed from its checkpoint starts a world too.
                self.resets.append(float(rec.get("time", time.time())))
            elif rec.get("event") == "horovodrun.restarting":
                self.restarts.append({**rec, "seen": time.time()})
            elif rec.get("event") == "done":
                self.done = True
            elif str(rec.get("event", "")).startswith(("worker.", "scale.")):
                self.decisions.append(rec)
            elif rec.get("event") == "workers.changed":
                self.changes.append(rec)
            elif rec.get("event") == "supervisor.exited":
                self.ended = int(rec.get("code", -1))

    @property
    def step(self) -> int:
        return self.steps[-1]["step"] if self.steps else 0

    @property
    def size(self) -> int:
        return self.steps[-1]["size"] if self.steps else 0


def worker_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"elastic-supervisor/job={JOB},elastic-supervisor/role=worker")
    return sorted((p for p in pods.items if p.status.phase == "Running"
                   and not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)


def wait(what: str, predicate: Any, run: Run, timeout: float, progress: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"\ndemo: gave up after {timeout:.0f}s waiting for {what}; the "
                             f"launcher's log: {run.log}")
        if run.ended is not None and not run.done:
            raise SystemExit(f"\ndemo: the launcher exited with {run.ended} while waiting "
                             f"for {what}; its log: {run.log}")
        run.poll()
        progress()
        time.sleep(0.2)


PLAN = ("kill", "force-delete", "freeze", "scale-out", "scale-in")


@dataclass
class Result:
    code: int | None  # the launcher's exit code
    run: Run
    faults: list[Fault]
    namespace: str = NAMESPACE
    # What `elastic-supervisor timeline` draws, read at the end (cli.timeline_sources): the
    # job's stored state and the namespace's Events; `unread` says why they could not be read.
    state: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    unread: str | None = None
    # The capacity-destroying verdicts, and those on a worker or node no fault silenced
    # (MainJob.verdicts): with the shipped defaults, none may be false.
    verdicts: dict[str, Any] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster demo")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out",
                        help="where the timeline PNG and the run's logs go")
    parser.add_argument("--no-record", action="store_true",
                        help=f"do not write the `{RESULTS_KEY}` block of bench/results.json")
    args = parser.parse_args(argv)
    t0, provenance = time.monotonic(), store.provenance()
    result = run_job(args.out, PLAN)
    summarize(result, args.out)
    print(f"demo: the launcher (supervisor) exited with {result.code}")
    if not args.no_record:
        measured = block(result, time.monotonic() - t0, provenance)
        print(f"demo: recorded in {store.record({RESULTS_KEY: measured})} ({RESULTS_KEY})")
    return 0 if result.code == 0 else 1


def block(result: Result, wall_s: float, provenance: dict[str, Any]) -> dict[str, Any]:
    """The RESULTS_KEY block of bench/results.json: what this run measured, as its table
    printed."""
    def since(t: float | None, f: Fault) -> float | None:
        return None if t is None else round(t - f.at, 2)

    return {**provenance, "wall_s": round(wall_s, 1), "exit_code": result.code,
            "faults": [{"fault": f.name, "detected_s": since(f.detected, f),
                        "resumed_s": since(f.resumed, f), "full_size_s": since(f.full, f),
                        "replacement_usable_s": since(f.usable, f)} for f in result.faults],
            "horovodrun_restarts": [r.get("reason") for r in result.run.restarts],
            "goodput": goodputs(result), "verdicts": result.verdicts}


def run_job(out: Path, plan: tuple[str, ...], cluster: Cluster | None = None,
            namespace: str = NAMESPACE) -> Result:
    """Run the main job with the faults of `plan`, in order, in `namespace` of `cluster` (or
    of a fresh local cluster, stopped afterwards)."""
    out.mkdir(parents=True, exist_ok=True)
    if cluster is None:
        with started_cluster() as fresh:
            return run_job(out, plan, fresh, namespace)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    job = MainJob(cluster, api, namespace, out)
    try:
        print(f"demo: kubectl apply -k manifests/overlays/local (namespace {namespace})")
        job.apply()
        return drive(job, plan)
    finally:
        job.close()
        api.close()


@contextlib.contextmanager
def started_cluster() -> Iterator[Cluster]:
    """A fresh local cluster (3 real nodes) with the launcher and worker images in every node."""
    print("demo: building (or reusing) the launcher and worker images")
    tarballs = images.build()
    print("demo: starting the local cluster: control plane and 3 real nodes, each with the "
          "images (from the nodes' image store: seconds once it is made)")
    cluster = Cluster(ClusterSettings(nodes=3, images=tuple(sorted(set(tarballs.values())))))
    cluster.start()
    try:
        yield cluster
    finally:
        problems = cluster.stop()
        print("demo: stopped the cluster" + (f"; host state NOT restored: {problems}"
                                             if problems else ""))


def at_size(run: Run, job: MainJob, n: int, since: float) -> Callable[[], bool]:
    """Training reset to world size n after `since` and took a step after that reset, with n
    worker pods. (A step at size n right after `since` proves nothing: a frozen worker's pod
    still looks Running, and the step may predate the fault taking hold; a next fault then could
    hit a replacement while it joins, which Horovod cannot survive: the survivors abort when a
    joining worker dies inside the rendezvous.)"""
    def check() -> bool:
        if run.done:
            return True
        reset = next((r for r in run.resets[::-1] if r >= since), None)
        stepped = reset is not None and any(
            s["time"] >= reset and s["size"] == n for s in run.steps[-50:])
        return stepped and len(worker_pods(job.core, job.namespace)) == n
    return check


def scale(job: MainJob, n: int) -> None:
    """`elastic-supervisor scale` the job to n workers."""
    subprocess.run([sys.executable, "-m", "supervisor", "scale", "--job", JOB,
                    "--namespace", job.namespace, "--workers", str(n)], check=True,
                   env={**os.environ, "KUBECONFIG": str(job.cluster.kubeconfig)},
                   stdout=subprocess.DEVNULL)


def drive(job: MainJob, plan: tuple[str, ...]) -> Result:
    core, cluster = job.core, job.cluster
    deadline = time.monotonic() + 300
    while job.launcher() is None or not job.log.exists():
        if time.monotonic() > deadline:
            raise SystemExit("demo: the launcher pod did not start within 300 s")
        time.sleep(0.5)
    run = Run(job.log)
    faults: list[Fault] = []
    frozen: list[str] = []

    def progress() -> None:
        last = run.decisions[-1] if run.decisions else {}
        what = (f"{last.get('event')} {last.get('pod', '')} {last.get('action', '')}".strip()
                if last else "-")
        restarts = sum(1 for d in run.decisions if d.get("action") == "Restart")
        print(f"\rstep {run.step:>3}/{STEPS}  world size {run.size}  restarts {restarts}  "
              f"last decision: {what[:60]:<60}", end="", flush=True)

    def trained(n: int) -> Any:
        start = run.step
        return lambda: run.step >= start + n or run.done

    def fault(name: str, desired: int, act: Any) -> None:
        # Each fault hits a job back at full size that has trained a little since the last:
        # two faults at once can take every worker, and then no state survives (Horovod ends).
        wait("some training", trained(15), run, 120, progress)
        if run.done:
            return
        faults.append(Fault(name, time.time(), desired))
        act()
        wait(f"recovery from {name}", at_size(run, job, desired, faults[-1].at), run, 240,
             progress)
        while frozen:  # the node comes back once the job recovered without it
            cluster.node(frozen.pop()).thaw()

    def victim() -> client.V1Pod:
        """The last worker not on the launcher's node (a lost node must not take the
        supervisor with it)."""
        workers = worker_pods(core, job.namespace)
        launcher = job.launcher()
        launcher_node = launcher["spec"].get("nodeName") if launcher else None
        others = [p for p in workers if p.spec.node_name != launcher_node]
        return (others or workers)[-1]

    def freeze() -> None:
        node = victim().spec.node_name
        frozen.append(node)
        job.silence_node(cluster.node(node))  # where a Hung verdict or a quarantine may land
        cluster.node(node).freeze()

    faults_by_key = {
        "kill": ("SIGKILL a worker's container", 2,
                 lambda: job.kill_container(victim().metadata.name)),
        "force-delete": ("force-delete a worker", 2, lambda: job.force_delete(
            victim().metadata.name)),
        "freeze": ("a worker's node frozen", 2, freeze),
        "scale-out": ("scale 2 -> 3", 3, lambda: scale(job, 3)),
        "scale-in": ("scale 3 -> 2", 2, lambda: scale(job, 2)),
    }
    wait("training to start", lambda: run.step > 0, run, 600, progress)
    for key in plan:
        fault(*faults_by_key[key])
    wait("the end of training", lambda: run.done, run, 600, progress)
    print()
    code = job.exit_code_within(90)
    run.poll()
    measure(run, faults)
    result = Result(code, run, faults, job.namespace, verdicts=job.verdicts())
    try:
        result.state, result.events = cli.timeline_sources(job.api, JOB, job.namespace)
    except kube.KubeError as e:
        result.unread = str(e)
    return result


def measure(run: Run, faults: list[Fault]) -> None:
    """Fill in each fault's detection, resumption, replacement and full-size times."""
    for f in faults:
        after = [d for d in run.decisions if _t(d) >= f.at]
        f.detected = _t(after[0]) if after else None
        resets = [r for r in run.resets if r >= f.at]
        steps_after = [s for s in run.steps if s["time"] >= (resets[0] if resets else f.at)]
        f.resumed = steps_after[0]["time"] if steps_after else None
        f.full = next((s["time"] for s in run.steps
                       if s["time"] >= (f.resumed or f.at) and s["size"] == f.desired), None)
        f.usable = next((_t(c) for c in run.changes if _t(c) >= f.at and c.get("added")),
                        None)


def goodput_from_steps(steps: list[dict[str, Any]], decisions: list[dict[str, Any]],
                       since: float, at: float, initial: int = 2) -> tuple[float, float]:
    """The job's goodput (training at the size asked for, training at all) over [since, at]
    from rank 0's printed steps alone, by supervisor.decide.progress's rule: a pause between two new
    steps (a step past every one before) of at most max(MIN_PAUSE_S, PAUSE_STEPS x the median
    step time) was training; the size asked for is the last `scale.applied` before it."""
    points, high = [], -1
    for r in steps:
        if int(r["step"]) > high:
            high = int(r["step"])
            points.append((float(r["time"]), int(r["size"]), high))
    points = [x for x in points if since <= x[0] <= at]
    asked = sorted((_t(d), int(d["workers_to"])) for d in decisions
                   if d.get("event") == "scale.applied")
    per_step = sorted((b[0] - a[0]) / (b[2] - a[2]) for a, b in itertools.pairwise(points))
    if not per_step or at <= since:
        return 0.0, 0.0
    limit = max(progress.MIN_PAUSE_S, progress.PAUSE_STEPS * per_step[len(per_step) // 2])
    full = trained = 0.0
    for a, b in itertools.pairwise(points):
        gap = b[0] - a[0]
        if gap <= limit:
            trained += gap
            want = next((n for t, n in reversed(asked) if t <= a[0]), initial)
            full += gap if a[1] >= want else 0.0
    return full / (at - since), trained / (at - since)


def goodputs(result: Result) -> dict[str, Any] | None:
    """The goodput the supervisor stored and the one rank 0's steps give over its window."""
    p = (result.state or {}).get("progress") or {}
    if p.get("goodput") is None or p.get("since") is None or p.get("at") is None:
        return None
    full, trained = goodput_from_steps(result.run.steps, result.run.decisions,
                                       float(p["since"]), float(p["at"]))
    return {"tool": {"full": p["goodput"], "any": p["goodput_any"]},
            "steps": {"full": round(full, 4), "any": round(trained, 4)},
            "diff": round(max(abs(p["goodput"] - full), abs(p["goodput_any"] - trained)), 4),
            "window_s": round(float(p["at"]) - float(p["since"]), 1)}


def summarize(result: Result, out: Path) -> None:
    """Print the faults' table and draw the supervisor's timeline of the run."""
    def since(t: float | None, f: Fault) -> str:
        return "-" if t is None else f"{t - f.at:6.1f} s"

    print(f"\n{'fault':<40} {'detected':>9} {'resumed':>9} {'full size':>10}")
    for f in result.faults:
        print(f"{f.name:<40} {since(f.detected, f):>9} {since(f.resumed, f):>9} "
              f"{since(f.full, f):>10}")
    if v := result.verdicts:
        given = ", ".join(f"{n} {e}" for e, n in v["verdicts"].items())
        print(f"\nverdicts: {given}; on a worker or node no fault silenced: "
              f"{v['false_hung']} Hung or stuck, {v['false_quarantine']} quarantines, "
              f"{v.get('false_slow', 0)} slow")
    if result.unread is not None:
        print(f"\ntimeline: not drawn, the job's state and Events could not be read: "
              f"{result.unread}")
        return
    g = goodputs(result)
    if g is not None:
        print(f"\ngoodput over {g['window_s']} s: the supervisor {100 * g['tool']['full']:.1f} % "
              f"at full size, {100 * g['tool']['any']:.1f} % training at all; rank 0's steps "
              f"{100 * g['steps']['full']:.1f} % and {100 * g['steps']['any']:.1f} %")
    _, line = cli.draw_timeline(JOB, result.namespace, result.state, result.events,
                                out / "demo-timeline.png")
    print(f"\ntimeline: {line}")


def _t(rec: dict[str, Any]) -> float:
    """The wall time of a supervisor log record."""
    try:
        return dt.datetime.fromisoformat(rec.get("timestamp", "").replace("Z", "+00:00")
                                         ).timestamp()
    except ValueError:
        return 0.0
