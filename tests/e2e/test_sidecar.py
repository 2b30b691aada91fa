"""Sidecar mode on real nodes (manifests/overlays/sidecar): the supervisor runs from its own
image (elastic-supervisor-sidecar) as a native sidecar of the launcher pod, and the training
container and every worker run the trainer image, which holds the training stack and nothing of
elastic-supervisor (localcluster.images checks that at build time). The training container runs
the user's command under /opt/elastic-supervisor/bin/es-run and holds no ServiceAccount token
(the supervisor's container alone mounts one); the workers get the hook from the ConfigMap the
supervisor makes of its own copy (no init container: they start as fast as baked workers).

`TestSidecarStockTour`: the stock script (imports nothing of ours) through the faults of the
stock lane that need the hook and the process tree: a SIGKILLed worker, a frozen training
process, a partitioned worker; then a SIGTERM to the pod's training container (what the kubelet
sends on a delete), which es-run hands to the supervisor. `TestSidecarMainJob`: the main job
(worker_image/train.py) with a killed worker, ended through the stop file with exit 0: the job's
exit code is the training container's. Bad launcher pods fail at once with exit 2 and one line
naming the fix.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from kubernetes import client

from localcluster.job import SIDECAR_OVERLAY, log_time
from localcluster.nodes import Cluster
from tests.e2e.jobs import (
    SHIPPED_QUARANTINE,
    TRAINER,
    Job,
    check_steps,
    check_training,
    main_job,
    tour_budgets,
)
from tests.e2e.test_stock_lane import (
    decisions,
    frozen_then_replaced,
    no_gloo_timeout,
    partitioned_then_replaced,
    sound,
    stock_job,
)
from tests.faults import PodFaults

SHARED = "/opt/elastic-supervisor"
WRAPPER = f"{SHARED}/bin/es-run"


def images_of(pod: dict[str, Any]) -> dict[str, str]:
    spec = pod["spec"]
    return {c["name"]: c["image"] for c in [*(spec.get("initContainers") or ()),
                                            *spec["containers"]]}


def the_training_image_has_nothing_of_ours(job: Job, image: str = TRAINER) -> None:
    """The launcher's training container and the workers run the trainer image `image` (the
    overlay's YOUR IMAGE); the hook the workers load comes from the supervisor's init
    container; horovodrun runs under es-run with the hook first on its PYTHONPATH."""
    launcher = job.launcher()
    assert launcher is not None and launcher["spec"].get("shareProcessNamespace") is True
    images = images_of(launcher)
    assert images["launcher"] == image, images
    assert images["elastic-supervisor"].startswith("elastic-supervisor-sidecar:"), images
    for name, pod in job.live_workers().items():
        got = images_of(pod)
        assert got == {"worker": images["launcher"]}, (name, got)  # no init container of ours
    horovodrun = job.processes(launcher["metadata"]["name"],
                               lambda argv: any(a.endswith("horovodrun") for a in argv[:2]))
    assert horovodrun, "horovodrun runs in the launcher pod"
    env = dict(e.split("=", 1) for e in Path(f"/proc/{horovodrun[0]}/environ").read_text()
               .split("\0") if "=" in e)
    assert env["PYTHONPATH"].split(":")[0] == f"{SHARED}/hook", env.get("PYTHONPATH")
    parent = int(Path(f"/proc/{horovodrun[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert WRAPPER in Path(f"/proc/{parent}/cmdline").read_text(), "es-run started it"


def root_of(pid: int) -> Path:
    """The container's filesystem that process `pid` (a host pid) sees."""
    return Path(f"/proc/{pid}/root")


def in_container(pid: int, path: str) -> Path:
    """`path` as process `pid` sees it, as a host path under its root: symlinks resolved inside
    that root (Debian's /var/run -> /run is absolute, and /proc/PID/root would follow it to
    the host's /run)."""
    root, done, hops = root_of(pid), PurePosixPath("/"), 0
    todo = list(PurePosixPath(path).parts[1:])
    while todo:
        part = todo.pop(0)
        if part == "..":
            done = done.parent
            continue
        host = root / str(done / part).lstrip("/")
        if host.is_symlink() and hops < 40:
            hops += 1
            target = PurePosixPath(os.readlink(host))
            if target.is_absolute():
                done = PurePosixPath("/")
            todo = [*target.parts[int(target.is_absolute()):], *todo]
            continue
        done = done / part
    return root / str(done).lstrip("/")


def files_under(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*.py"))
            if "__pycache__" not in f.parts}


def the_workers_hook_is_the_supervisors_own_from_its_configmap(job: Job) -> None:
    """Every worker mounts, read-only at SHARED/hook, the ConfigMap the supervisor made of its
    own hook (a generated name, immutable, owned by the Job): the files a worker sees are, byte
    for byte, those of the supervisor package in the sidecar container, and its training
    process runs with that directory first on its PYTHONPATH."""
    made = job.logs("sidecar.hook_configmap")
    assert made, "the supervisor made the hook's ConfigMap"
    name = made[-1]["configmap"]
    cm = job.core.read_namespaced_config_map(name, job.namespace)
    assert name.startswith("elastic-train-supervisor-hook-") and cm.immutable is True
    assert [(o.kind, o.name) for o in cm.metadata.owner_references] == [("Job", "elastic-train")]
    site = next(root_of(job.supervisor_pid()).glob("opt/venv/lib/python3*/site-packages"))
    own = files_under(site / "supervisor" / "hook")
    own.pop("__init__.py")  # supervisor.hook's own (HOOK_DIR), not loaded by the workers
    for pod_name, pod in job.live_workers().items():
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["elastic-supervisor-hook"]["configMap"]["name"] == name, pod_name
        training = [pid for pid in job.processes(pod_name, lambda argv: any(
            a.endswith("stock_train.py") or a.endswith("train.py") for a in argv))]
        assert training, f"{pod_name}: no training process"
        env = dict(e.split("=", 1) for e in Path(f"/proc/{training[0]}/environ").read_text()
                   .split("\0") if "=" in e)
        assert env["PYTHONPATH"].split(":")[0] == f"{SHARED}/hook", env.get("PYTHONPATH")
        hook = root_of(training[0]) / SHARED.lstrip("/") / "hook"
        # the kubelet's layout: each item a link into ..data, the dot entries its own
        listed = {p.name for p in hook.iterdir() if not p.name.startswith("..")}
        listed |= {f"elastic_supervisor_hook/{p.name}"
                   for p in (hook / "elastic_supervisor_hook").iterdir()}
        # and the bytecode the supervisor compiled (__pycache__, its Python's tag)
        assert listed - {"elastic_supervisor_hook", "__pycache__",
                         "elastic_supervisor_hook/__pycache__"} == set(own), (pod_name, listed)
        assert {k: (hook / k).read_bytes() for k in own} == own, pod_name
        assert len(list((hook / "elastic_supervisor_hook" / "__pycache__").glob("*.pyc"))) \
            == len(own) - 1, pod_name


def only_the_supervisor_holds_the_token(job: Job) -> None:
    """The launcher pod mounts no ServiceAccount token but the supervisor's own projected one:
    the training container (es-run, horovodrun, the user's code) finds no token file."""
    launcher = job.launcher()
    assert launcher is not None
    spec = launcher["spec"]
    assert spec.get("automountServiceAccountToken") is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert in_container(job.supervisor_pid(), token).read_text().count(".") == 2  # a JWT
    wrapper = job.processes(launcher["metadata"]["name"],
                            lambda argv: any(a == WRAPPER for a in argv[:2]))
    horovodrun = job.processes(launcher["metadata"]["name"],
                               lambda argv: any(a.endswith("horovodrun") for a in argv[:2]))
    assert wrapper and horovodrun
    for pid in [*wrapper, *horovodrun]:
        assert not in_container(pid, token).exists(), f"pid {pid} of the training container"
        assert not in_container(pid, "/var/run/secrets/kubernetes.io").exists(), pid
        assert "serviceaccount" not in Path(f"/proc/{pid}/mountinfo").read_text(), pid


def status_as_printed_with_incidents(job: Job, *, size: int, failures: int) -> None:
    """Once the job is settled at `size`: `status`'s step is the one the script printed
    (Job.status_as_printed), its world full, its goodput below 1, each of the (at least
    `failures`) failed workers in an incident, and `status` shows the newest incidents (10)
    with their pods."""
    job.settled(size)
    s = job.status_as_printed()
    p = s["progress"]
    assert p["world"] == p["desired"] == size and 0 < p["goodput"] < 1, p
    logged: dict[int, set[str]] = {}  # incident -> its pods, as the supervisor said last
    for e in job.logs("incident.opened") + job.logs("incident.closed"):
        logged[e["incident"]] = set(e["pods"])
    failed = job.logs("worker.failed")
    assert len(failed) >= failures and all(
        any(e["pod"] in pods for pods in logged.values()) for e in failed), (failed, logged)
    shown = {i["id"]: set(i["pods"]) for i in s["incidents"]}
    assert shown, s
    newest = sorted(logged)[-len(shown):]
    assert sorted(shown) == newest and all(shown[k] == logged[k] for k in shown), (shown, logged)


@pytest.fixture(scope="class")
def sidecar_tour(cluster: Cluster, cluster_api: client.ApiClient,
                 main_images: dict[str, Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Job, PodFaults]]:
    with stock_job(cluster, cluster_api, tmp_path_factory.mktemp("sidecar-tour"),
                   policy=tour_budgets, overlay=SIDECAR_OVERLAY, **SHIPPED_QUARANTINE) as jf:
        yield jf


@pytest.mark.tour
class TestSidecarStockTour:
    def test_the_training_container_and_the_workers_run_an_image_without_us(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        job, _ = sidecar_tour
        job.settled(2)
        the_training_image_has_nothing_of_ours(job)
        assert "HangDetectionOff" not in job.reasons()
        assert job.logs("sidecar.found"), "the supervisor checked its pod"

    def test_the_workers_load_the_supervisors_own_hook_from_its_configmap(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        job, _ = sidecar_tour
        job.settled(2)
        the_workers_hook_is_the_supervisors_own_from_its_configmap(job)

    def test_the_training_container_has_no_token_and_the_supervisor_has_its_own(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        """Issue 39, item 9: the supervisor works (it created the workers and the hook's
        ConfigMap, and the faults after this one are handled) with the only token."""
        job, _ = sidecar_tour
        job.settled(2)
        only_the_supervisor_holds_the_token(job)

    def test_a_killed_supervisor_is_started_again_and_adopts_the_running_horovodrun(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        """The keeper (`python -m supervisor.keeper`, supervisor/keeper.py) starts the
        supervisor again in its container at once, twice in a row, where the kubelet's
        CrashLoopBackOff would hold the second restart 10 s; the new supervisor finds the
        horovodrun es-run runs for the old one and supervises it as it is: no restart of
        horovodrun, so the stock script loses nothing. The faults after this one prove the
        adopted run is watched (hang detection, the fence)."""
        job, _ = sidecar_tour
        job.settled(2)
        t00 = time.time()
        took = []
        for _ in range(2):
            pid = job.supervisor_pid()
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)
            adopted = job.wait("the horovodrun adopted",
                               lambda t0=t0: [r for r in job.logs("horovodrun.adopted")
                                              if log_time(r) > t0], 120)
            took.append(log_time(adopted[0]) - t0)
            assert job.supervisor_pid() != pid
        assert [r["signal"] for r in job.logs_since("keeper.restarting", t00)] == [9, 9]
        launcher = job.launcher()
        assert launcher is not None
        [sidecar] = [c for c in launcher["status"]["initContainerStatuses"]
                     if c["name"] == "elastic-supervisor"]
        assert sidecar["restartCount"] == 0, "the keeper restarted it, not the kubelet"
        assert took[1] < 8.0, f"adopted {took[1]:.1f}s after the second kill: throttled?"
        t0 = t00
        assert job.logs_since("horovodrun.started", t0) == [], "horovodrun was not restarted"
        # The Event is posted after the log line, by the event recorder's thread.
        job.wait("the HorovodrunAdopted Event", lambda: "HorovodrunAdopted" in job.reasons(), 30)
        past = (job.last_step() or {"step": 0})["step"]
        job.wait_training(past=past + 10, size=2, timeout=120)
        steps = [r for r in job.steps() if r["time"] > t0]
        assert all(b["step"] == a["step"] + 1 for a, b in itertools.pairwise(steps)), \
            "no batch computed again: the training went on through the supervisor's restart"
        assert job.exit_code() is None and len(job.launchers()) == 1
        print(f"adopted {took[0]:.1f}s and {took[1]:.1f}s after the two kills")
        sound(job, t0)

    def test_a_sigkilled_worker_is_replaced(self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        job, faults = sidecar_tour
        job.settled(2)
        victim, _ = job.victim()
        t0 = time.time()
        faults.kill(victim)
        took = no_gloo_timeout(job, t0)
        job.back_to(2, t0)
        d = decisions(job)[victim]
        assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
        assert job.successor(victim) in job.live_workers()
        print(f"{victim}: resumed {took:.2f}s after the kill (sidecar mode)")
        sound(job, t0)

    def test_a_frozen_process_is_found_by_its_silence(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        frozen_then_replaced(*sidecar_tour)

    def test_a_partitioned_worker_is_found_and_cut_off(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        partitioned_then_replaced(*sidecar_tour)

    def test_status_counts_the_stock_scripts_steps_across_the_adoption_and_the_faults(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        """The hook counts the stock script's optimizer steps (it prints them too): the step
        `status` shows is the one printed, through a supervisor's restart and three faults, and
        each fault is an incident."""
        status_as_printed_with_incidents(sidecar_tour[0], size=2, failures=3)

    def test_sigterm_to_the_training_container_goes_through_the_supervisor(
            self, sidecar_tour: tuple[Job, PodFaults]) -> None:
        job, _ = sidecar_tour
        job.settled(2)
        t0 = time.time()
        launcher = job.launcher()
        assert launcher is not None
        wrapper = job.processes(launcher["metadata"]["name"],
                                lambda argv: any(a == WRAPPER for a in argv[:2]))
        assert wrapper, "es-run in the training container"
        for pid in wrapper:
            os.kill(pid, signal.SIGTERM)  # what the kubelet does on a delete
        code = job.wait_exit(120)
        assert code != 0, f"stopped, not finished\n{job.tail()}"
        forwarded = job.logs("signal.forwarded")
        assert [f["signal"] for f in forwarded] == ["SIGTERM"], forwarded
        exited = job.wait("the supervisor's exit", lambda: job.logs("supervisor.exited"), 30,
                          after_exit=True)
        assert exited[-1]["code"] == code, "the job's exit code is the supervisor's verdict"
        assert job.logs_since("worker.hung", t0) == [], "workers stopped on purpose are not Hung"
        check_steps(job.records())


@pytest.fixture(scope="class")
def sidecar_main(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    # The shipped defaults, all of them: the restart budgets, the quarantine (the other jobs
    # switch it off: main_job), the hang thresholds. A healthy job must not lose a worker or a
    # node to them (checked at its end).
    out = tmp_path_factory.mktemp("sidecar-main")
    with main_job(cluster, cluster_api, out, steps=1_000_000, checkpoint=out / "checkpoint",
                  overlay=SIDECAR_OVERLAY, env=SHIPPED_QUARANTINE) as job:
        job.wait_training(past=10, size=2, timeout=420)
        yield job


@pytest.mark.tour
class TestSidecarMainJob:
    def test_a_killed_worker_container_is_replaced(self, sidecar_main: Job) -> None:
        job = sidecar_main
        job.settled(2)
        the_training_image_has_nothing_of_ours(job)
        victim, _ = job.victim()
        t0 = time.time()
        job.kill_container(victim)
        job.back_to(2, t0, timeout=120)
        d = job.decision(victim)
        assert (d["cause"], d["exit_code"], d["action"]) == ("ExitCode", 137, "Restart")
        assert job.logs_since("horovodrun.started", t0) == [], "horovodrun was not restarted"
        check_steps(job.records())

    def test_the_job_ends_through_the_stop_file_with_exit_0(self, sidecar_main: Job) -> None:
        job = sidecar_main
        target = job.stop_at()
        assert job.wait_exit(300) == 0, job.tail()
        check_training(job.records(), target, final_size=2)
        exited = job.logs("supervisor.exited")
        assert [e["code"] for e in exited] == [0], exited
        # Under the shipped defaults no healthy worker was declared Hung or stuck, and no node
        # was quarantined for the one kill (an exit 137 is an operator's, not the node's).
        assert [e["event"] for e in job.logs() if e.get("event") in (
            "worker.hung", "worker.stuck", "node.quarantined")] == []


def without(change: str) -> Any:
    """A transform that breaks the sidecar-mode launcher pod in one way."""
    def transform(docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            if doc["kind"] != "Job":
                continue
            spec = doc["spec"]["template"]["spec"]
            if change == "shareProcessNamespace":
                spec.pop("shareProcessNamespace")
            elif change == "wrapper":
                spec["containers"][0]["command"] = ["sh", "-c", "sleep 600", "sh"]
            elif change == "mount":  # the supervisor's container without the shared dir
                me = next(c for c in spec["initContainers"] if c["name"] == "elastic-supervisor")
                me["volumeMounts"] = [m for m in me["volumeMounts"]
                                      if m["name"] != "elastic-supervisor"]
            elif change == "install":  # the shared dir left empty
                spec["initContainers"] = [c for c in spec["initContainers"]
                                          if c["name"] != "elastic-supervisor-install"]
    return transform


@pytest.mark.parametrize(("change", "line"), [
    ("shareProcessNamespace", "has no spec.shareProcessNamespace: true; set it"),
    ("wrapper", f"runs {WRAPPER}; start the training container with command: [{WRAPPER}]"),
    ("mount", f"SUPERVISOR_SHARED_DIR='{SHARED}': not mounted in this container; mount "
              "there the emptyDir the training container mounts"),
    ("install", f"SUPERVISOR_SHARED_DIR='{SHARED}': no hook in it ({SHARED}/hook/"
                "sitecustomize.py is missing); run `elastic-supervisor install"),
])
def test_a_launcher_pod_unfit_for_sidecar_mode_fails_at_once_naming_the_fix(
        make_job: Callable[..., Job], change: str, line: str) -> None:
    job = make_job(steps=10, transform=without(change), overlay=SIDECAR_OVERLAY)
    job.wait("the supervisor's line", lambda: line in job.text(), 120, after_exit=True)
    assert not job.logs("horovodrun.started")
    if change == "shareProcessNamespace":
        # es-run cannot see the supervisor, but reads the exit code it left in the files
        assert job.wait_exit(120) == 2, job.tail()
