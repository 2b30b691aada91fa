"""`elastic-supervisor status` at 1,000 workers on kwok (issue 26's target: it answers in <= 1 s).

One fresh local control plane and kwok; in one namespace, what `status` reads at its largest:
- WORKERS worker pods of job JOB, built by supervisor.workers.worker_pod from the shipped worker
  template (manifests/base/files/worker-template.yaml), some slots in a later incarnation, bound
  to ten kwok nodes, Running and Ready;
- the job's state ConfigMap as the supervisor saves it (core.state_of: the fleet of WORKERS slots
  with a ledger that spent restarts, two quarantined nodes) plus issue 26's `progress` with a
  1,000-sample history and its 50 `incidents` with every phase (/tmp/spec26.md's contract), and
  the scale ConfigMap;
- an hour of Events (kube-apiserver's default --event-ttl): the supervisor's decisions of a failure
  every FAILURE_EVERY_S seconds, through its own eventseries.Correlator (its series and combined
  Events; the last series write of each Event is the one applied) and in kube.EventRecorder's
  shape, beside the kubelet's and the scheduler's Events about every worker (core/v1).
Then the installed console script, `.venv/bin/elastic-supervisor status --job JOB -n NS`, and with
`--output json`, RUNS times each (interleaved, after one untimed run each), from process start to
exit, as a user runs it: a plain environment with the kubeconfig, Python writing its bytecode
cache as it does by default (into a cache of the bench's own, PYTHONPYCACHEPREFIX: the machine's
PYTHONDONTWRITEBYTECODE would make every run compile the Kubernetes client anew), and this
checkout's code first on the path. Where the time goes: the interpreter and the imports alone
(`--version`, `import kubernetes`), and in-process each API read, operate.status, render and the
JSON, IN_PROCESS_RUNS times.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from bench.discovery import list_pods, running_ready
from localcluster import kwok
from localcluster.controlplane import ControlPlane, Settings
from supervisor import cli, eventseries, kube, operate, workers
from supervisor.config import parse_config
from supervisor.decide import core, fleet, memory, policy
from supervisor.model import EventSpec
from tests.conftest import make_namespace

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "manifests" / "base" / "files" / "worker-template.yaml"
JOB = "elastic-train"  # the shipped template's job
WORKERS = 1000
NODES = 10
RUNS = 20  # of each command
IN_PROCESS_RUNS = 10
TARGET_S = 1.0
HOUR_S = 3600.0
FAILURE_EVERY_S = 2.0  # the supervisor's decisions: a failed worker this often, for an hour
HISTORY = 1000  # progress samples (the most the supervisor keeps)
INCIDENTS = 50  # the most the supervisor keeps
PHASES = ("detected", "fenced", "resumed", "created", "scheduled", "started", "joined", "full")
CAUSES = (("ExitCode", "failure"), ("NodeNotReady", "failure"), ("PodForceDeleted", "failure"),
          ("Hung", "failure"), ("Evicted", "leave"), ("Preempted", "leave"),
          ("NodeCordoned", "leave"), ("Stall", "failure"), ("ScaleOut", "scale"),
          ("ScaleIn", "scale"))
LAUNCHER = f"{JOB}-launcher-x7k2p"
DRIVER_AGENT = "es-bench-driver"


def seconds(samples: list[float]) -> dict[str, float]:
    """median / p90 (nearest rank) / max in seconds, and the count."""
    s = sorted(samples)
    return {"median": round(statistics.median(s), 3),
            "p90": round(s[min(len(s) - 1, -(-9 * len(s) // 10) - 1)], 3),
            "max": round(s[-1], 3), "n": len(s)}


def settings() -> memory.Settings:
    """The decisions' settings of a job of WORKERS workers (what state_of reads of them)."""
    cfg = parse_config({"SUPERVISOR_JOB_NAME": JOB, "SUPERVISOR_NAMESPACE": "bench",
                        "SUPERVISOR_NP": str(WORKERS), "SUPERVISOR_MIN_NP": str(WORKERS // 2),
                        "SUPERVISOR_MAX_NP": str(WORKERS)})
    return memory.Settings.of(cfg)


def the_fleet(rng: random.Random, now: float) -> fleet.Fleet:
    """WORKERS slots, one in five in a later incarnation, and the ledger of those restarts."""
    slots, per_slot, last = {}, {}, {}
    for i in range(WORKERS):
        inc = rng.choice((2, 3)) if rng.random() < 0.2 else 1
        slots[i] = fleet.Slot(incarnation=inc, avoid_node=f"kwok-{rng.randrange(NODES)}"
                              if inc > 1 else None)
        if inc > 1:
            per_slot[str(i)] = inc - 1
            last[str(i)] = round(now - rng.uniform(60, HOUR_S), 3)
    ledger = policy.Ledger(total=sum(per_slot.values()), per_slot=per_slot,
                           recent=tuple(sorted(last.values())[-100:]), last_replaced=last,
                           streak={k: 1 for k in per_slot})
    return fleet.Fleet(slots=slots, ledger=ledger)


def progress(rng: random.Random, now: float) -> dict[str, Any]:
    """issue 26's `progress` over the last hour: HISTORY samples, a gap now and then."""
    since, step, history = now - HOUR_S, 0, []
    for k in range(HISTORY):
        t = since + k * HOUR_S / HISTORY
        world = None if k % 97 == 50 else (WORKERS if rng.random() < 0.9 else WORKERS - 1)
        step += 0 if world is None else rng.randint(8, 14)
        history.append([round(t, 3), world, step])
    return {"step": step, "redone": 212, "rate": 3.2, "world": WORKERS, "desired": WORKERS,
            "training": True, "since": since, "at": now, "wall_s": HOUR_S,
            "training_s": 3480.0, "full_s": 3150.0, "goodput": 0.875, "goodput_any": 0.967,
            "productive_ws": 3_300_000.0, "lost_ws": 300_000.0, "history": history}


def incidents(rng: random.Random, now: float, f: fleet.Fleet) -> list[dict[str, Any]]:
    """issue 26's last INCIDENTS incidents, oldest first, each with every phase."""
    out = []
    for k in range(INCIDENTS):
        cause, kind = CAUSES[k % len(CAUSES)]
        slot = rng.randrange(WORKERS)
        t = now - HOUR_S + (k + 1) * HOUR_S / (INCIDENTS + 1)
        phases, at = {}, t
        for phase in PHASES:
            phases[phase] = round(at, 3)
            at += rng.uniform(0.1, 3.0)
        out.append({"id": k + 1, "cause": cause, "kind": kind,
                    "pods": [workers.pod_name(JOB, slot, f.slots[slot].incarnation)],
                    "slots": [slot], "phases": phases, "redone": rng.randint(0, 5),
                    "lost_ws": round(rng.uniform(5, 60), 1), "open": False})
    return out


def stored_state(rng: random.Random, now: float, f: fleet.Fleet) -> dict[str, Any]:
    """The state ConfigMap's JSON at its largest, as the supervisor saves it."""
    state = core.state_of(f, settings(), {"kwok-3": now + 1800, "kwok-7": now + 3000})
    return {**state, "progress": progress(rng, now), "incidents": incidents(rng, now, f)}


def worker_bodies(f: fleet.Fleet) -> list[dict[str, Any]]:
    """The job's worker pods as the supervisor creates them, bound to the kwok nodes."""
    template = workers.validate_template(yaml.safe_load(TEMPLATE.read_text()),
                                         {workers.LABEL_JOB: JOB})
    # The cluster-wide PriorityClass and the ServiceAccount of the manifests are not here;
    # neither is read by `status`.
    template["spec"].pop("priorityClassName", None)
    template["spec"].pop("serviceAccountName", None)
    bodies = []
    for slot, s in sorted(f.slots.items()):
        pod = workers.worker_pod(template, job=JOB, slot=slot, incarnation=s.incarnation,
                                 owner=None, avoid_node=s.avoid_node, hold_in="worker")
        pod["spec"]["nodeName"] = f"kwok-{slot % NODES}"
        bodies.append(pod)
    return bodies


def supervisor_writes(rng: random.Random, f: fleet.Fleet
                      ) -> list[tuple[float, eventseries.Write]]:
    """An hour of the supervisor's Event writes (seconds into the hour, write): a worker fails
    every FAILURE_EVERY_S; its decisions go through the supervisor's own Correlator."""
    series = eventseries.Correlator()
    out: list[tuple[float, eventseries.Write]] = []
    hosts = WORKERS
    for k in range(int(HOUR_S / FAILURE_EVERY_S)):
        now = k * FAILURE_EVERY_S
        slot = rng.randrange(WORKERS)
        inc = f.slots[slot].incarnation
        pod, new = workers.pod_name(JOB, slot, inc), workers.pod_name(JOB, slot, inc + 1)
        node, host = f"kwok-{slot % NODES}", f"10.64.{slot % NODES}.{slot // NODES + 2}"
        hosts = WORKERS - 1 if hosts == WORKERS else WORKERS
        specs = [
            EventSpec("Warning", "WorkerProcessExited", "Detect",
                      f"worker {pod} ({host}): its training process on {host} exited with 1 "
                      "(seen by horovodrun; the pod still runs, and Horovod does not use this "
                      "host again)"),
            EventSpec("Warning", "WorkerRestarting", "Restart",
                      f"worker {pod} (slot {slot}) on node {node}: ExitCode 1: container worker "
                      f"exited with 1; rule 'default-restart': Restart; replacing it with {new}; "
                      "restarts used 40/100"),
            EventSpec("Normal", "WorkerCreated", "Create",
                      f"created {new} for slot {slot} (incarnation {inc + 1})"),
            EventSpec("Normal", "WorkersChanged", "Discovery",
                      f"{hosts} hosts in the discovery file"),
        ]
        for spec in specs:
            name = f"{LAUNCHER}.{rng.getrandbits(48):012x}"
            out += [(now, w) for w in series.observe(spec, now, name)]
        out += [(now, w) for w in series.due(now)]
    out += [(HOUR_S, w) for w in series.flush()]
    return out


def kubelet_events(ns: str, pods: list[dict[str, Any]], start: float,
                   rng: random.Random) -> list[dict[str, Any]]:
    """The scheduler's and the kubelet's Events about each worker (core/v1), over the hour."""
    out = []
    for p in pods:
        name, node = p["metadata"]["name"], p["spec"]["nodeName"]
        t = start + rng.uniform(0, HOUR_S - 60)
        for i, (source, reason, message) in enumerate((
                ("default-scheduler", "Scheduled", f"Successfully assigned {ns}/{name} to {node}"),
                ("kubelet", "Pulled", 'Container image "elastic-supervisor-worker:0.1.0" already '
                                      "present on machine"),
                ("kubelet", "Created", "Created container: worker"),
                ("kubelet", "Started", "Started container worker"))):
            when = dt.datetime.fromtimestamp(t + i, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{rng.getrandbits(60):015x}", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                   "namespace": ns, "uid": p["metadata"]["uid"]},
                "reason": reason, "message": message, "type": "Normal", "count": 1,
                "source": {"component": source, **({"host": node} if source == "kubelet"
                                                   else {})},
                "firstTimestamp": when, "lastTimestamp": when,
                "reportingComponent": source, "reportingInstance": node})
    return out


def populate(api: client.ApiClient, ns: str, rng: random.Random) -> dict[str, Any]:
    """Create the pods, the state and the Events in `ns`; what was made."""
    corev1, events = client.CoreV1Api(api), client.EventsV1Api(api)
    now = time.time()
    f = the_fleet(rng, now)
    t = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: corev1.create_namespaced_pod(ns, b, _preload_content=False),
                      worker_bodies(f)))
    deadline = time.monotonic() + 120
    while sum(1 for p in list_pods(corev1, ns) if running_ready(p)) < WORKERS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {WORKERS} workers were not Running and Ready in 120 s")
        time.sleep(1)
    pods_s = time.monotonic() - t
    state = stored_state(rng, now, f)
    kube.StateStore(api, ns, fleet.state_name(JOB), None).save(state, None)
    kube.StateStore(api, ns, fleet.scale_name(JOB), None, key=fleet.SCALE_KEY).save(
        {"workers": WORKERS, "requestedAt": now - 1200}, None)
    t = time.monotonic()
    start = now - HOUR_S
    regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": LAUNCHER,
                 "uid": "5b0f5d5e-1f0a-4c8e-9d1e-0a6c3f1b2c4d"}

    def when(at: float) -> str:
        return kube.micro_time(dt.datetime.fromtimestamp(start + at, dt.UTC))

    writes = supervisor_writes(rng, f)
    creates = [kube.event_body(ns, w, when(at), instance=LAUNCHER, regarding=regarding)
               for at, w in writes if w.create]
    last_patch = {w.name: kube.series_patch(w, when(at)) for at, w in writes if not w.create}
    others = kubelet_events(ns, list(list_pods(corev1, ns)), start, rng)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: events.create_namespaced_event(ns, b, _preload_content=False),
                      creates))
        list(pool.map(lambda b: corev1.create_namespaced_event(ns, b, _preload_content=False),
                      others))
        list(pool.map(lambda kv: events.patch_namespaced_event(
            kv[0], ns, kv[1], _preload_content=False), last_patch.items()))
    return {"workers": WORKERS, "nodes": NODES,
            "state_configmap_bytes": len(json.dumps(state, sort_keys=True)),
            "events": {"in_namespace": len(creates) + len(others),
                       "supervisor": len(creates), "supervisor_with_series": len(last_patch),
                       "supervisor_decisions_in_the_hour": 4 * int(HOUR_S / FAILURE_EVERY_S),
                       "kubelet_and_scheduler": len(others)},
            "setup_s": {"pods": round(pods_s, 1), "events": round(time.monotonic() - t, 1)}}


def cli_env(kubeconfig: Path, pycache: Path) -> dict[str, str]:
    """A user's shell: the kubeconfig, Python's default bytecode cache (our own directory)."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT),
            "PYTHONPYCACHEPREFIX": str(pycache)}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds from process start to exit, and its stdout; raise if it failed."""
    t = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                         timeout=60)
    took = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {out.returncode}: {out.stderr[-500:]}")
    return took, out.stdout


def check_table(text: str) -> None:
    rows = [ln for ln in text.splitlines() if ln.startswith(f"{JOB}-w")]
    if len(rows) != WORKERS or "LAST DECISIONS" not in text:
        raise RuntimeError(f"status shows {len(rows)} of {WORKERS} workers:\n{text[:500]}")


def check_json(text: str) -> None:
    s = json.loads(text)
    if s["listed"] != WORKERS or len(s["decisions"]) != 10:
        raise RuntimeError(f"status --output json: listed {s['listed']}, decisions "
                           f"{len(s['decisions'])}")


def time_cli(ns: str, kubeconfig: Path, pycache: Path) -> dict[str, Any]:
    """The console script as a user runs it: table and JSON, interleaved; and its fixed part."""
    exe = str(Path(sys.executable).parent / "elastic-supervisor")
    env = cli_env(kubeconfig, pycache)
    base = [exe, "status", "--job", JOB, "-n", ns]
    kinds: dict[str, tuple[list[str], Callable[[str], None]]] = {
        "table": (base, check_table), "json": ([*base, "--output", "json"], check_json)}
    first = {}
    for name, (argv, check) in kinds.items():  # compiles the bytecode cache, warms the API
        took, out = timed(argv, env)
        check(out)
        first[name] = round(took, 3)
    runs: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(RUNS):
        for name, (argv, check) in kinds.items():
            took, out = timed(argv, env)
            check(out)
            runs[name].append(took)
    py = sys.executable
    fixed = {
        "python_start": [timed([py, "-c", "pass"], env)[0] for _ in range(5)],
        "import_kubernetes": [timed([py, "-c", "import kubernetes"], env)[0]
                              for _ in range(10)],
        "cli_version": [timed([exe, "--version"], env)[0] for _ in range(10)],
    }
    return {"table_s": seconds(runs["table"]), "json_s": seconds(runs["json"]),
            "first_run_s": first,
            "start_and_imports_s": {k: seconds(v) for k, v in fixed.items()}}


def time_in_process(api: client.ApiClient, ns: str) -> dict[str, Any]:
    """Where `status`'s time goes once imported (ms): job_status (the reads made at once and
    operate.status) and the output, as the command makes them (the collector paused); each read
    alone; the Events of the namespace unselected and the pods with the collector running, as
    `status` read them before."""
    parts: dict[str, list[float]] = {}

    def part(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        out = fn()
        parts.setdefault(name, []).append(time.perf_counter() - t)
        return out

    selector = cli.DEFAULT_SELECTOR.format(job=JOB)
    for _ in range(IN_PROCESS_RUNS):
        part("list_pods_collector_running", lambda: kube.list_pods(api, ns, selector))
    with cli.collector_paused():
        for _ in range(IN_PROCESS_RUNS):
            time_parts(api, ns, selector, part)
    return {k: {x: (round(y * 1000, 1) if x != "n" else y) for x, y in seconds(v).items()}
            for k, v in parts.items()}


def time_parts(api: client.ApiClient, ns: str, selector: str,
               part: Callable[[str, Callable[[], Any]], Any]) -> None:
    """One round of the parts, each timed by `part`."""
    s = part("job_status", lambda: cli.job_status(api, JOB, ns))
    part("render", lambda: operate.render(s))
    part("json", lambda: json.dumps(s, indent=2))
    pods = part("list_pods", lambda: kube.list_pods(api, ns, selector))
    state = part("load_state", lambda: kube.StateStore(
        api, ns, fleet.state_name(JOB), None).load()[0])
    part("load_scale", lambda: kube.StateStore(api, ns, fleet.scale_name(JOB), None,
                                               key=fleet.SCALE_KEY).load())
    evs = part("list_events_supervisor", lambda: kube.list_events(
        api, ns, controller=kube.REPORTING_CONTROLLER))
    part("list_events_all", lambda: kube.list_events(api, ns))
    part("operate_status", lambda: operate.status(JOB, ns, pods=pods, state=state, scale=None,
                                                  events=evs))


def main() -> dict[str, Any]:
    """Run the benchmark; return the `status` part of bench/results.json."""
    t0 = time.monotonic()
    rng = random.Random(26)
    with (ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp, kwok.Kwok(cp),
          tempfile.TemporaryDirectory(prefix="es-bench-status-") as tmp):
        api = kube.make_api_client(str(cp.kubeconfig))
        api.user_agent = DRIVER_AGENT
        try:
            corev1 = client.CoreV1Api(api)
            nodes = [f"kwok-{i}" for i in range(NODES)]
            kwok.add_nodes(corev1, nodes)
            kwok.wait_nodes_ready(corev1, nodes)
            ns = make_namespace(corev1)
            made = populate(api, ns, rng)
            print(f"status bench: {made}", flush=True)
            timings = time_cli(ns, cp.kubeconfig, Path(tmp) / "pycache")
            inside = time_in_process(api, ns)
        finally:
            with contextlib.suppress(Exception):
                api.close()
    table, js = timings["table_s"], timings["json_s"]
    out = {**made, **timings, "in_process_ms": inside, "target_s": TARGET_S,
           "target_met": max(table["p90"], js["p90"]) <= TARGET_S,
           "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
           "wall_s": round(time.monotonic() - t0, 1)}
    print(f"status at {WORKERS} workers ({made['events']['in_namespace']} Events): table "
          f"{table}, json {js}; first runs {timings['first_run_s']}; "
          f"start and imports {timings['start_and_imports_s']}; in process (ms) {inside}",
          flush=True)
    return {"status": out}
