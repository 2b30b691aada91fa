"""mpi-operator's host-list path, measured on a real node, side by side with the supervisor's.

mpi-operator (v2beta1) keeps `discover_hosts.sh` as a key of a ConfigMap that it rewrites on
every worker change and mounts into the launcher: horovodrun sees a change only once the kubelet
has projected the new ConfigMap into the pod's volume. Here, in one run on the local cluster with
real nodes:
- worker pods (the toolbox image, Running and Ready) of one job on real nodes;
- a writer in the style of mpi-operator's controller, at its best: it watches the job's pods and
  rewrites the ConfigMap (one `echo <pod>:1` line per Running worker, as the operator's
  `discover_hosts.sh` does) as soon as a watch event changes the set;
- a "launcher" pod on a real node mounting that ConfigMap, the kubelet with its default sync
  settings (syncFrequency 1 m, the Watch change-detection strategy): the new content is timed
  from this host through the pod's mount namespace (inotify on the volume directory, where the
  kubelet's atomic writer renames `..data`);
- the real supervisor (`elastic-supervisor run`, stand-in horovodrun) on the same pods, its
  discovery file timed with inotify.
Each change deletes one worker pod (grace 0) at a random moment (exponential gaps), so changes
land at random phases of the kubelet's sync; t0 is just before the API call, t1 the first time
each path's content no longer names the pod.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench.discovery import percentiles
from bench.inotify import RenameWatcher
from bench.versus import FileHistory
from localcluster.nodes import Cluster, ClusterSettings
from localcluster.tarimage import TOOLBOX_IMAGE
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import SupervisorProcess

JOB = "job1"
LABELS = {"elastic-supervisor/job": JOB, "elastic-supervisor/role": "worker"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())
CONFIGMAP = f"{JOB}-config"
KEY = "discover_hosts.sh"


def script(pods: list[str]) -> str:
    """The operator's discover_hosts.sh for these Running workers."""
    return "#!/bin/sh\n" + "".join(f"echo {p}:1\n" for p in sorted(pods))


class OperatorWriter:
    """Rewrites the ConfigMap whenever the set of Running workers changes (watch-driven)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core, self.ns = client.CoreV1Api(api), namespace
        self.running: set[str] = set()
        self._stop = threading.Event()
        self._watch = watch.Watch()
        self.writes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pods: list[str]) -> None:
        self.running = set(pods)
        self.core.create_namespaced_config_map(self.ns, {
            "metadata": {"name": CONFIGMAP}, "data": {KEY: script(pods)}})
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for ev in self._watch.stream(self.core.list_namespaced_pod, self.ns,
                                             label_selector=SELECTOR, timeout_seconds=60):
                    pod = ev["object"]
                    name = pod.metadata.name
                    running = (ev["type"] != "DELETED" and pod.status.phase == "Running"
                               and not pod.metadata.deletion_timestamp)
                    if running == (name in self.running):
                        continue
                    (self.running.add if running else self.running.discard)(name)
                    self.core.patch_namespaced_config_map(
                        CONFIGMAP, self.ns, {"data": {KEY: script(sorted(self.running))}})
                    self.writes += 1

    def close(self) -> None:
        self._stop.set()
        self._watch.stop()


class VolumeHistory:
    """Every update of a ConfigMap volume inside a pod: (inotify time, the key's content)."""

    def __init__(self, mount: Path) -> None:
        self.file = mount / KEY
        self.watcher = RenameWatcher(str(mount))
        self.snaps: list[tuple[float, str]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t, name = self.watcher.events.get()
            if name == "..data":
                with contextlib.suppress(OSError):
                    self.snaps.append((t, self.file.read_text()))

    def first_without(self, pod: str, after: float) -> float | None:
        return next((t for t, text in list(self.snaps)
                     if t > after and f"echo {pod}:1" not in text), None)

    def close(self) -> None:
        self._stop.set()
        self.watcher.events.put((0.0, ""))
        self.watcher.close()


def worker(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(LABELS)},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "dnsPolicy": "Default", "enableServiceLinks": False,
                     "containers": [{"name": "worker", "image": TOOLBOX_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["sleep", "1000000"]}]}}


def main(changes: int = 30, mean_gap_s: float = 8.0, work: Path | None = None,
         seed: int = 13) -> dict[str, Any]:
    """Run on a fresh cluster (kubelets with default sync settings); return results keys."""
    rng = random.Random(seed)
    work = work or Path("/tmp/es-bench-configmap")
    work.mkdir(parents=True, exist_ok=True)
    with Cluster(ClusterSettings(nodes=2, kubelet_sync_frequency_s=60)) as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        ns = make_namespace(core)
        names = [f"w{i}" for i in range(changes + 4)]
        for n in names:
            core.create_namespaced_pod(ns, worker(n))

        def all_running() -> bool:
            pods = core.list_namespaced_pod(ns, label_selector=SELECTOR).items
            return sum(p.status.phase == "Running" for p in pods) == len(names)

        wait_for(all_running, 180, 0.5, what="the workers running")
        writer = OperatorWriter(api, ns)
        writer.start(names)
        launcher = {"metadata": {"name": "launcher"}, "spec": {
            "dnsPolicy": "Default", "containers": [{
                "name": "launcher", "image": TOOLBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "1000000"],
                "volumeMounts": [{"name": "mpi", "mountPath": "/etc/mpi"}]}],
            "volumes": [{"name": "mpi", "configMap": {"name": CONFIGMAP,
                                                      "defaultMode": 0o755}}]}}
        core.create_namespaced_pod(ns, launcher)
        wait_for(lambda: core.read_namespaced_pod("launcher", ns).status.phase == "Running",
                 60, what="the launcher pod")
        pod = core.read_namespaced_pod("launcher", ns)
        node = cluster.node(pod.spec.node_name)
        pid = wait_for(lambda: next((p for p in node.pod_pids(pod.metadata.uid)
                                     if Path(f"/proc/{p}/root/etc/mpi/{KEY}").exists()), None),
                       30, what="the launcher's mount")
        volume = VolumeHistory(Path(f"/proc/{pid}/root/etc/mpi"))
        assert cluster.cp is not None
        sup = SupervisorProcess(cluster.cp, ns, work, SUPERVISOR_NP="1",
                                SUPERVISOR_MAX_NP=str(len(names)), SUPERVISOR_LOG_LEVEL="info",
                                SUPERVISOR_NODE_GRACE_SECONDS="86400", FAKE_POLL_S="1")
        ours = FileHistory(sup.discovery_file)
        sup.start()
        ips = {n: core.read_namespaced_pod(n, ns).status.pod_ip for n in names}
        wait_for(lambda: len(ours.lines()) == len(names), 60, what="the supervisor's file")
        applied: list[tuple[str, float]] = []
        try:
            for victim in rng.sample(names, changes):
                time.sleep(rng.expovariate(1 / mean_gap_s))
                t0 = time.perf_counter()
                core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
                applied.append((victim, t0))
            last = applied[-1][1]
            wait_for(lambda: volume.first_without(applied[-1][0], last) is not None, 180, 1,
                     what="the last change in the launcher's volume")
            ours_s, cm_s = [], []
            for victim, t0 in applied:
                line = f"{ips[victim]}:1"
                t_ours = ours.first(t0, lambda hosts, line=line: line not in hosts)
                t_cm = volume.first_without(victim, t0)
                if t_ours is not None:
                    ours_s.append(t_ours - t0)
                if t_cm is not None:
                    cm_s.append(t_cm - t0)
        finally:
            sup.close()
            ours.close()
            volume.close()
            writer.close()
            api.close()
    return {"configmap_path_latency_ms": {
        "supervisor_file": percentiles(ours_s), "configmap_volume": percentiles(cm_s),
        "kubelet_sync_frequency_s": 60, "changes": changes, "configmap_writes": writer.writes,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}


if __name__ == "__main__":
    import json
    print(json.dumps(main(), indent=2))
