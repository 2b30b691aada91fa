"""The hook's cost: training speed with and without it, and its load on the supervisor at 1000.

1. Steps/s (`steps_per_s`): real horovodrun (elastic, Gloo) training the stock script
   (tests/e2e/stock_train.py, no extra sleep) on 2 fake hosts, with the hook (driver and worker
   halves, heartbeating to a collector) and without it (no hook in the environment at all),
   PAIRS runs each, alternated; rank 0's batches per second after the first 30 (start-up).
   On a shared 2-core machine the runs' spread is larger than the hook's cost, so its CPU is
   also measured directly (`hook_cpu`): the wrapper around each collective's wait, one
   heartbeat (built, signed, sent), and one read of the process's TCP endpoints (after each
   init, and every 10 s; it scans the network namespace's TCP table).
2. Load at 1000 workers (`fence`): a private control plane with 1000 worker pods on 10
   lease-renewed nodes, the real `elastic-supervisor run` with the stand-in horovodrun (which
   records the hook's key, port and run from its environment), and a load generator: 1000 UDP
   sockets, one per simulated training process of a listed pod, each sending a real heartbeat
   (the hook's format and key) every 0.5 s, 2000 datagrams a second, and receiving whatever the
   supervisor sends back. Over WINDOW_S: the supervisor's CPU % and RSS without and with the
   heartbeats, datagrams/s it counted (its /metrics), its sockets (one UDP socket, no
   connection per worker); then a worker pod fails (kubelet-style status, exit 137): the
   supervisor fences its host and pushes the dead set to the 999 others: the push's duration
   (its log `worker.fenced`) and the time from the status write until the last of the 999
   received it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client

from localcluster.controlplane import ControlPlane, Settings
from supervisor import kube
from supervisor.hook import HOOK_DIR
from supervisor.hook.elastic_supervisor_hook import KEY_ENV, RUN_ENV, watch, wire, worker
from tests.conftest import make_namespace
from tests.e2e.fakehosts import Channel, HorovodRun, HostSet
from tests.helpers import wait_for
from tests.integration.harness import Job, SupervisorProcess, scrape

WORKERS = 1000
PODS_PER_NODE = 100
WINDOW_S = 20.0
BEAT_S = 0.5
PAIRS = 3
BATCHES = 400
SKIP = 30
STOCK_STEPS_PER_S = 62.79  # measured by speed() with the hook (results.json, fence.steps_per_s)
STOCK_COLLECTIVES_PER_STEP = 4


# ---- 1. steps/s with and without the hook ------------------------------------------------------

def steps_per_s(run: HorovodRun) -> float:
    steps = [s for s in run.steps() if s["step"] > SKIP]
    return (len(steps) - 1) / (steps[-1]["time"] - steps[0]["time"])


def hook_cpu() -> dict[str, float]:
    """CPU cost of the hook's parts, in this process (they are the same in a worker)."""
    progress = worker.Progress()

    def bare_fn() -> None:
        return None

    noop = progress.wrap(bare_fn, "c")
    n = 200_000
    t0 = time.process_time()
    for _ in range(n):
        noop()
    wrapped = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(n):
        bare_fn()
    bare = time.process_time() - t0
    beater = worker.Beater(progress, key=wire.new_key(), supervisor=("127.0.0.1", 9), run="1",
                           host="10.0.0.1", local_rank=0, keep=[])
    beater.heartbeat()  # the first one reads the endpoints
    t0 = time.process_time()
    for _ in range(2000):
        beater._send(beater.heartbeat())
    beat = (time.process_time() - t0) / 2000
    t0 = time.process_time()
    for _ in range(50):
        beater.connections()
    endpoints = (time.process_time() - t0) / 50
    beater.sock.close()
    watcher = watcher_cpu()
    wrapper_s = (wrapped - bare) / n
    # One step of the stock lane's script (tests/e2e/stock_train.py, no extra sleep): its model
    # has 4 parameter tensors, so 4 allreduces end in 4 waits; in the step's time the heartbeat
    # thread sends step_s / 0.5 heartbeats and reads the endpoints step_s / 10 times.
    step_s = 1 / STOCK_STEPS_PER_S
    per_step = STOCK_COLLECTIVES_PER_STEP * wrapper_s + step_s * (2 * beat + endpoints / 10.0)
    return {"wrapper_ns_per_collective": round(wrapper_s * 1e9),
            "heartbeat_us": round(beat * 1e6, 1),
            "endpoints_read_ms": round(endpoints * 1e3, 3),
            "cpu_percent_of_one_core": round(100 * (2 * beat + endpoints / 10.0), 4),
            "watcher_cpu_percent_of_one_core": watcher,
            "stock_step_ms": round(step_s * 1e3, 2),
            "percent_of_a_stock_step": round(100 * per_step / step_s, 4)}


def watcher_cpu(seconds: float = 10.0) -> float:
    """CPU % of one core that a real process watcher (watch.py) takes, watching this process."""
    env = {**os.environ, KEY_ENV: wire.new_key().hex(), RUN_ENV: "1", watch.OF_ENV: "x",
           watch.PID_ENV: str(os.getpid()), watch.TARGET_ENV: "127.0.0.1:9"}
    proc = subprocess.Popen(watch.command(str(HOOK_DIR)), env=env)
    try:
        time.sleep(1.0)  # its start-up is not its steady cost
        p = psutil.Process(proc.pid)
        before = sum(p.cpu_times()[:2])
        time.sleep(seconds)
        return round(100 * (sum(p.cpu_times()[:2]) - before) / seconds, 3)
    finally:
        proc.kill()
        proc.wait()


def speed(work: Path) -> dict[str, Any]:
    hosts = HostSet(work)
    rates: dict[str, list[float]] = {"with_hook": [], "without_hook": []}
    try:
        addresses = hosts.start(2)
        for i in range(PAIRS):
            for kind in ("without_hook", "with_hook") if i % 2 else ("with_hook",
                                                                     "without_hook"):
                channel = Channel() if kind == "with_hook" else None
                d = work / f"{kind}-{i}"
                d.mkdir()
                run = HorovodRun(d, hosts, np=2, min_np=2, max_np=2, batches=BATCHES,
                                 channel=channel)
                try:
                    run.set_hosts(addresses)
                    run.start()
                    code = run.wait(600)
                    if code != 0:
                        raise SystemExit(f"bench fence: horovodrun exited {code}:\n{run.tail()}")
                    rates[kind].append(steps_per_s(run))
                    if channel is not None and not channel.of("hb"):
                        raise SystemExit("bench fence: the hook did not heartbeat")
                finally:
                    run.close()
                    if channel is not None:
                        channel.close()
                print(f"bench fence: {kind} run {i + 1}: {rates[kind][-1]:.1f} steps/s",
                      flush=True)
    finally:
        hosts.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"with_hook": round(med["with_hook"], 2),
            "without_hook": round(med["without_hook"], 2),
            "cost_percent": round(100 * (1 - med["with_hook"] / med["without_hook"]), 2),
            "runs": {k: [round(x, 2) for x in v] for k, v in rates.items()},
            "batches": BATCHES, "workers": 2}


# ---- 2. the supervisor's load at 1000 workers --------------------------------------------------

class Generator:
    """1000 simulated training processes heartbeating to the supervisor."""

    def __init__(self, key: bytes, port: int, run: str, hosts: list[str]) -> None:
        self.key, self.addr, self.run = key, ("127.0.0.1", port), run
        self.hosts = hosts
        self.socks = []
        for _ in hosts:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
            self.socks.append(s)
        self.seq = [0] * len(hosts)
        self.done = [0] * len(hosts)
        self.fv = [0] * len(hosts)
        self.fence_at: dict[int, float] = {}
        self.sent = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True),
                         threading.Thread(target=self._receive, daemon=True)]

    def start(self) -> Generator:
        for t in self._threads:
            t.start()
        return self

    def _beat(self, i: int) -> bytes:
        self.seq[i] += 1
        self.done[i] += 3
        waiting = self.seq[i] % 2 == 0
        return wire.encode(self.key, {
            "t": "hb", "s": f"sim-{i:04d}", "n": self.seq[i], "run": self.run, "pid": 10000 + i,
            "host": self.hosts[i], "lr": 0, "rank": i, "size": len(self.hosts), "inits": 1,
            "done": self.done[i], "wait": 0.012 if waiting else None,
            "in": "c" if waiting else None, "addrs": [self.hosts[i]], "ports": [],
            "fv": self.fv[i], "problems": []})

    def _send(self) -> None:
        n, t0, k = len(self.socks), time.monotonic(), 0
        while not self._stop.is_set():
            due = t0 + k * BEAT_S / n
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            i = k % n
            with contextlib.suppress(OSError):
                self.socks[i].sendto(self._beat(i), self.addr)
                self.sent += 1
            k += 1

    def _receive(self) -> None:
        sel = selectors.DefaultSelector()
        for i, s in enumerate(self.socks):
            sel.register(s, selectors.EVENT_READ, i)
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                i = key.data
                with contextlib.suppress(OSError):
                    data = key.fileobj.recv(wire.MAX_DATAGRAM)  # type: ignore[union-attr]
                    body = wire.decode(self.key, data)
                    if body and body["t"] == "fence":
                        self.fence_at.setdefault(i, time.monotonic())
                        self.fv[i] = body["v"]

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for s in self.socks:
            s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"workers": WORKERS, "heartbeat_period_s": BEAT_S}
    with ControlPlane(Settings(node_monitor_grace_period_s=40)) as cp:
        api = kube.make_api_client(str(cp.kubeconfig))
        core = client.CoreV1Api(api)
        ns = make_namespace(core)
        job = Job(api, ns)
        sup = gen = None
        try:
            nodes = [job.node(f"n{i}") for i in range(WORKERS // PODS_PER_NODE)]
            with ThreadPoolExecutor(4) as pool:
                pods = list(pool.map(lambda i: job.worker(f"w{i}", nodes[i % len(nodes)]),
                                     range(WORKERS)))
            metrics_port = free_port()
            sup = SupervisorProcess(cp, ns, work, SUPERVISOR_NP="1",
                                    SUPERVISOR_MAX_NP=str(WORKERS), SUPERVISOR_LOG_LEVEL="info",
                                    SUPERVISOR_RESYNC_SECONDS="1", FAKE_POLL_S="1",
                                    SUPERVISOR_METRICS_PORT=str(metrics_port))
            sup.discovery_file.parent.mkdir(parents=True, exist_ok=True)
            sup.start()
            start = wait_for(lambda: sup.records("start"), 120, what="horovodrun started")[0]
            wait_for(lambda: len((sup.content() or "").splitlines()) == WORKERS, 120,
                     what=f"{WORKERS} hosts listed")
            hook = start["hook"]
            proc = psutil.Process(sup.pid)
            time.sleep(5)
            proc.cpu_percent(None)
            time.sleep(WINDOW_S / 2)
            out["supervisor_cpu_percent_without"] = round(proc.cpu_percent(None), 2)
            out["supervisor_rss_mb_without"] = round(proc.memory_info().rss / 2**20, 1)
            hosts = [job.ips[p] for p in pods]
            gen = Generator(bytes.fromhex(hook["ELASTIC_SUPERVISOR_HOOK_KEY"]),
                            int(hook["ELASTIC_SUPERVISOR_HOOK_PORT"]),
                            hook["ELASTIC_SUPERVISOR_HOOK_RUN"], hosts).start()
            time.sleep(5)  # every simulated process has spoken
            before, t0, sent0 = scrape(metrics_port), time.monotonic(), gen.sent
            proc.cpu_percent(None)
            time.sleep(WINDOW_S)
            cpu = proc.cpu_percent(None)
            after, t1 = scrape(metrics_port), time.monotonic()

            def counted(m: dict[str, float], outcome: str) -> float:
                return m.get(f'elastic_supervisor_hook_datagrams{{outcome="{outcome}"}}', 0.0)

            out["supervisor_cpu_percent"] = round(cpu, 2)
            out["supervisor_rss_mb"] = round(proc.memory_info().rss / 2**20, 1)
            out["datagrams_per_s"] = round((counted(after, "received")
                                            - counted(before, "received")) / (t1 - t0), 1)
            out["sent_per_s"] = round((gen.sent - sent0) / (t1 - t0), 1)
            out["rejected"] = counted(after, "rejected")
            out["heartbeating_processes"] = after.get(
                "elastic_supervisor_heartbeating_processes", 0.0)
            conns = proc.net_connections(kind="inet")
            out["supervisor_sockets"] = {
                "udp": sum(1 for c in conns if c.type == socket.SOCK_DGRAM),
                "tcp": sum(1 for c in conns if c.type == socket.SOCK_STREAM)}
            # One worker fails: the supervisor fences its host and pushes to the 999 others.
            victim = pods[WORKERS // 2]
            t_fail = time.monotonic()
            job.terminate(victim, 137)
            others = WORKERS - 1
            wait_for(lambda: len(gen.fence_at) >= others, 60,
                     what=f"the dead set at {others} processes")
            fenced = sup.wait_log("worker.fenced", timeout=30)
            arrivals = sorted(gen.fence_at.values())
            out["fence_push"] = {
                "processes": len(arrivals), "push_ms": fenced["push_ms"],
                "status_write_to_all_received_ms": round((arrivals[-1] - t_fail) * 1000, 1),
                "first_to_last_received_ms": round((arrivals[-1] - arrivals[0]) * 1000, 1)}
        finally:
            if gen is not None:
                gen.close()
            if sup is not None:
                sup.close()
            job.close()
            with contextlib.suppress(Exception):
                core.delete_namespace(ns)
            api.close()
    return out


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="es-bench-fence-") as tmp:
        root = Path(tmp)
        (root / "speed").mkdir()
        (root / "load").mkdir()
        result = {"steps_per_s": speed(root / "speed"), "hook_cpu": hook_cpu(),
                  **load(root / "load")}
    print(f"fence: {json.dumps(result)}", flush=True)
    return {"fence": result}
