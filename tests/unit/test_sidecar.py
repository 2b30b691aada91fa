"""supervisor.sidecar's pure parts: what a launcher pod needs in sidecar mode (one line per
problem, naming the fix), the worker template with the hook added, the launch file; and a
supervisor started after horovodrun exited, with the real es-run."""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor import hookmap, sidecar
from supervisor.config import packaged_discovery_script, parse_config
from supervisor.loop import Supervisor
from supervisor.metrics import make_metrics
from supervisor.model import EventSpec
from tests.helpers import Log, wait_for

SHARED = Path("/opt/elastic-supervisor")
MOUNT = {"name": "elastic-supervisor", "mountPath": "/opt/elastic-supervisor"}


def launcher_pod() -> dict[str, Any]:
    """A launcher pod as the API server returns it (defaults filled in), in sidecar mode."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "elastic-train-x7k2p", "namespace": "ml", "uid": "u1"},
        "spec": {
            "shareProcessNamespace": True,
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "elastic-supervisor-install", "image": "es-sidecar:0.1.0",
                 "args": ["install", "/opt/elastic-supervisor"], "volumeMounts": [MOUNT],
                 "imagePullPolicy": "IfNotPresent", "terminationMessagePath":
                     "/dev/termination-log"},
                {"name": "elastic-supervisor", "image": "es-sidecar:0.1.0", "args": ["run"],
                 "restartPolicy": "Always", "imagePullPolicy": "IfNotPresent",
                 "env": [{"name": "SUPERVISOR_JOB_NAME", "value": "elastic-train"},
                         {"name": "SUPERVISOR_MODE", "value": "sidecar"}],
                 "volumeMounts": [MOUNT, {"name": "ssh", "mountPath": "/etc/edl/ssh",
                                          "readOnly": True},
                                  {"name": "kube-api-access-abcde", "readOnly": True,
                                   "mountPath": "/var/run/secrets/kubernetes.io/"
                                                "serviceaccount"}]},
            ],
            "containers": [
                {"name": "launcher", "image": "team/train:2024",
                 "command": ["/opt/elastic-supervisor/bin/es-run"],
                 "args": ["python", "train.py"], "volumeMounts": [dict(MOUNT)]},
            ],
            "volumes": [{"name": "elastic-supervisor", "emptyDir": {}}],
        },
    }


def broken(change: Any) -> dict[str, Any]:
    pod = launcher_pod()
    change(pod["spec"])
    return pod


@pytest.mark.parametrize(("pod", "expected"), [
    pytest.param(broken(lambda s: s.pop("shareProcessNamespace")),
                 ["SUPERVISOR_MODE=sidecar: launcher pod elastic-train-x7k2p has no "
                  "spec.shareProcessNamespace: true; set it, so that the supervisor can see, "
                  "signal and reap horovodrun in the training container"],
                 id="no shared process namespace"),
    pytest.param(broken(lambda s: s["containers"][0].update(command=None)),
                 ["SUPERVISOR_MODE=sidecar: no container of launcher pod elastic-train-x7k2p "
                  "runs /opt/elastic-supervisor/bin/es-run; start the training container with "
                  "command: [/opt/elastic-supervisor/bin/es-run] and the training command as "
                  "its args"], id="the training container without the wrapper"),
    pytest.param(broken(lambda s: s["initContainers"][1].update(volumeMounts=[])),
                 ["SUPERVISOR_SHARED_DIR='/opt/elastic-supervisor': not mounted in container "
                  "elastic-supervisor of launcher pod elastic-train-x7k2p; mount an emptyDir "
                  "there, in it and in the training container"], id="the hook path not mounted"),
    pytest.param(broken(lambda s: s["containers"][0].update(volumeMounts=[])),
                 ["SUPERVISOR_SHARED_DIR='/opt/elastic-supervisor': container launcher of "
                  "launcher pod elastic-train-x7k2p runs /opt/elastic-supervisor/bin/es-run but "
                  "does not mount it; mount volume elastic-supervisor at "
                  "/opt/elastic-supervisor in it too"], id="the training container without it"),
    pytest.param(broken(lambda s: s["initContainers"][1].pop("restartPolicy")),
                 ["SUPERVISOR_MODE=sidecar: container elastic-supervisor of launcher pod "
                  "elastic-train-x7k2p is not a native sidecar; put it in initContainers with "
                  "restartPolicy: Always (Kubernetes 1.29 or later)"], id="a plain init"),
    pytest.param(broken(lambda s: s["initContainers"][1].update(env=[])),
                 ["SUPERVISOR_MODE=sidecar: launcher pod elastic-train-x7k2p: expected exactly "
                  "one container with env SUPERVISOR_MODE=sidecar (set as a value, not through "
                  "envFrom), found 0"], id="mode through envFrom"),
])
def test_a_launcher_pod_unfit_for_sidecar_mode_is_named_with_its_fix(
        pod: dict[str, Any], expected: list[str]) -> None:
    problems, found = sidecar.pod_problems(pod, SHARED)
    assert (problems, found) == (expected, None)


def test_a_fit_launcher_pod_names_the_supervisors_image() -> None:
    assert sidecar.pod_problems(launcher_pod(), SHARED) == ([], sidecar.Sidecar(
        container="elastic-supervisor", image="es-sidecar:0.1.0", pull_policy="IfNotPresent",
        volume="elastic-supervisor", wrapped="launcher"))


WORKER = {
    "metadata": {"labels": {"elastic-supervisor/job": "j"}},
    "spec": {"containers": [
        {"name": "worker", "image": "team/train:2024",
         "env": [{"name": "SSHD_PORT", "value": "2222"}]},
        {"name": "logs", "image": "busybox",
         "env": [{"name": "PYTHONPATH", "value": "/app"}]}],
        "initContainers": [{"name": "theirs", "image": "x"}]},
}


HOOK_MOUNT = {"name": "elastic-supervisor-hook", "mountPath": "/opt/elastic-supervisor/hook",
              "readOnly": True}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic-train", "uid": "j1"}


def hook_files() -> dict[str, str]:
    return {path: src.read_text() for path, src in sidecar.hook_sources().items()}


def test_the_hooks_configmap_holds_the_supervisors_own_hook_under_a_name_nobody_chose() -> None:
    files = hook_files()
    cm = hookmap.hook_configmap("elastic-train", files, JOB_OWNER)
    meta = cm["metadata"]
    assert "name" not in meta and meta["generateName"] == "elastic-train-supervisor-hook-"
    assert cm["immutable"] is True
    assert meta["ownerReferences"] == [{**JOB_OWNER, "blockOwnerDeletion": True}]
    assert meta["labels"]["elastic-supervisor/job"] == "elastic-train"
    package = Path(sidecar.HOOK_DIR) / "elastic_supervisor_hook"
    assert sorted(files) == sorted(["sitecustomize.py", *(
        f"elastic_supervisor_hook/{f.name}" for f in package.glob("*.py"))])
    assert {"elastic_supervisor_hook/__init__.py", "elastic_supervisor_hook/worker.py",
            "elastic_supervisor_hook/wire.py"} < set(files)
    assert {k: len(v) for k, v in cm["data"].items()} == {
        path.replace("/", "."): len(text) for path, text in files.items()}
    # The API server refuses a ConfigMap over 1 MiB: the hook stays well under it.
    assert len(json.dumps(cm).encode()) < 512 * 1024
    assert "binaryData" not in cm  # no bytecode given
    compiled = hookmap.hook_configmap("elastic-train", files, None, hookmap.hook_bytecode(files))
    assert compiled["data"] == cm["data"] and sorted(compiled["binaryData"]) == sorted(
        f"{Path(p).parent}.__pycache__.{Path(p).stem}.{sys.implementation.cache_tag}.pyc"
        .removeprefix("..") for p in files)
    assert len(json.dumps(compiled).encode()) < 512 * 1024
    changed = hookmap.hook_configmap("elastic-train", {**files, "sitecustomize.py": "#"}, None)
    assert (changed["metadata"]["annotations"][hookmap.HOOK_DIGEST]
            != meta["annotations"][hookmap.HOOK_DIGEST])
    assert "ownerReferences" not in changed["metadata"]


def test_workers_get_the_hook_from_the_configmap_without_an_init_container() -> None:
    files = hook_files()
    before = copy.deepcopy(WORKER)
    out = hookmap.with_hook(WORKER, "elastic-train-supervisor-hook-x1", files, SHARED)
    assert before == WORKER  # not changed in place
    spec = out["spec"]
    assert spec["initContainers"] == WORKER["spec"]["initContainers"]  # theirs only
    volume = next(v for v in spec["volumes"] if v["name"] == "elastic-supervisor-hook")
    assert volume["configMap"]["name"] == "elastic-train-supervisor-hook-x1"
    assert volume["configMap"]["defaultMode"] == 0o444
    assert {i["path"]: i["key"] for i in volume["configMap"]["items"]} == {
        path: path.replace("/", ".") for path in files}
    for c in spec["containers"]:
        assert HOOK_MOUNT in c["volumeMounts"]
    assert [e for e in spec["containers"][0]["env"] if e["name"] == "PYTHONPATH"] == [
        {"name": "PYTHONPATH", "value": "/opt/elastic-supervisor/hook"}]
    assert [e for e in spec["containers"][1]["env"] if e["name"] == "PYTHONPATH"] == [
        {"name": "PYTHONPATH", "value": "/opt/elastic-supervisor/hook:/app"}]
    assert hookmap.with_hook(out, "other", files, SHARED) == out  # once only


def test_the_configmaps_files_are_the_hook_install_writes_and_a_python_loads_them_compiled(
        tmp_path: Path) -> None:
    """Lay the ConfigMap out as the kubelet does (each item's key at its path, read-only) and
    compare its sources with what `install` copies for the launcher; a Python of the
    supervisor's version with that directory first on its path runs the hook's sitecustomize
    and imports the package from there, from the ConfigMap's bytecode (nothing compiled)."""
    files = hook_files()
    bytecode = hookmap.hook_bytecode(files)
    assert sorted(bytecode) == sorted(
        str(Path(p).parent / "__pycache__" / f"{Path(p).stem}.{sys.implementation.cache_tag}.pyc")
        .removeprefix("./") for p in files)
    cm = hookmap.hook_configmap("elastic-train", files, None, bytecode)
    volume = hookmap.with_hook(WORKER, "x", [*files, *bytecode], SHARED)["spec"]["volumes"][-1]
    mounted = tmp_path / "mounted"
    for item in volume["configMap"]["items"]:
        (mounted / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        if item["key"] in cm["data"]:
            (mounted / item["path"]).write_text(cm["data"][item["key"]])
        else:
            (mounted / item["path"]).write_bytes(base64.b64decode(cm["binaryData"][item["key"]]))
    for f in mounted.rglob("*"):
        f.chmod(0o555 if f.is_dir() else 0o444)  # defaultMode 0444, a read-only volume
    installed = tmp_path / "installed"
    sidecar.install(installed, packaged_discovery_script())

    def sources(root: Path) -> dict[str, str]:
        return {str(f.relative_to(root)): f.read_text() for f in root.rglob("*.py")}

    assert sources(mounted) == sources(installed / "hook")
    got = subprocess.run(
        [sys.executable, "-I", "-v", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import site, sitecustomize, elastic_supervisor_hook as h; "
         "import elastic_supervisor_hook.worker; print(sitecustomize.__file__, h.__file__)",
         str(mounted)],
        capture_output=True, text=True, check=True, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert got.stdout.split() == [str(mounted / "sitecustomize.py"),
                                  str(mounted / "elastic_supervisor_hook" / "__init__.py")]
    loaded = {line.split("'")[1] for line in got.stderr.splitlines()
              if line.startswith("# code object from ")}
    for path in ("sitecustomize.py", "elastic_supervisor_hook/__init__.py",
                 "elastic_supervisor_hook/worker.py"):
        assert str(mounted / importlib.util.cache_from_source(path)) in loaded, (path, loaded)
    # A source that is not the one compiled: the pyc is refused (checked hash), the source runs.
    (mounted / "elastic_supervisor_hook").chmod(0o755)
    (mounted / "elastic_supervisor_hook" / "watch.py").chmod(0o644)
    (mounted / "elastic_supervisor_hook" / "watch.py").write_text("CHANGED = 1\n")
    got = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import elastic_supervisor_hook.watch as w; print(w.CHANGED)", str(mounted)],
        capture_output=True, text=True, check=True, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert got.stdout.strip() == "1"


def test_the_launch_file_is_posix_sh_that_keeps_every_word(tmp_path: Path) -> None:
    argv = ["horovodrun", "-np", "2", "python", "it's $x", "a\nb", ""]
    text = sidecar.launch_script(7, argv, {"A": "x y", "PYTHONPATH": "/h", "K": "$(id)"})
    assert sidecar.parse_gen(text) == 7
    assert sidecar.launch_env(text) == {"A": "x y", "K": "$(id)",
                                        "PYTHONPATH": "/h${PYTHONPATH:+:$PYTHONPATH}"}
    script = tmp_path / "launch"
    script.write_text(text)
    got = subprocess.run(["sh", "-c", '. "$0"; printf "%s|" "$A" "$K" "$PYTHONPATH" "$@"',
                          str(script)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": "/mine"})
    assert got.stdout == "|".join(["x y", "$(id)", "/h:/mine", *argv]) + "|"


@pytest.mark.parametrize(("text", "gen", "pair"), [
    ("ES_GEN=3\nexport A=b\n", 3, None),
    ("", 0, None),
    ("ES_GEN=x\n", 0, None),
    ("3 1234\n", 0, (3, 1234)),
    ("3\n", 0, None),
])
def test_the_files_es_run_writes_are_read_strictly(text: str, gen: int,
                                                   pair: tuple[int, int] | None) -> None:
    assert (sidecar.parse_gen(text), sidecar.parse_pair(text)) == (gen, pair)


def test_a_lease_holder_is_gone_only_when_it_was_of_this_pod_and_its_pid_is_free() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free (until reused: then it reads as alive, and we wait)
    assert sidecar.holder_gone(f"train-x7k2p/{dead.pid}", "train-x7k2p")
    assert not sidecar.holder_gone(f"train-x7k2p/{os.getpid()}", "train-x7k2p"), "ourselves"
    assert not sidecar.holder_gone(f"train-other/{dead.pid}", "train-x7k2p"), "another pod's"
    assert not sidecar.holder_gone("train-x7k2p/1", "train-x7k2p"), "alive"
    assert not sidecar.holder_gone("train-x7k2p", "train-x7k2p")


def test_a_supervisor_started_after_horovodrun_exited_honours_that_exit(
        tmp_path: Path) -> None:
    """Issue 39, item 6: the supervisor dies after horovodrun exited, before it wrote `stop`;
    the one the kubelet starts next takes that exit as the job's (through its loop, as if
    horovodrun had just exited), and never has es-run start training again."""
    shared = tmp_path / "es"
    sidecar.install(shared, packaged_discovery_script())
    link = sidecar.Link(shared)
    link.announce()  # the earlier supervisor (this process: es-run sees one running)
    wrapper = subprocess.Popen(["sh", str(sidecar.wrapper(shared)), "python", "train.py"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(link.wrapper_alive, 10, interval=0.02, what="es-run")
        first = sidecar.RemoteChild.start(link, ["sh", "-c", "exit 5"], {})
        assert first.wait(10) == 5  # es-run recorded it; the supervisor died here
        running = sidecar.Link(shared).running()
        assert running is not None and (running.gen, running.pid, running.code) == (
            first.gen, first.pid, 5)

        events: list[EventSpec] = []
        cfg = parse_config({"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a",
                            "SUPERVISOR_NP": "2", "SUPERVISOR_MODE": "sidecar",
                            "SUPERVISOR_SHARED_DIR": str(shared)})

        def start_child(argv: Any, env: Any) -> Any:
            raise AssertionError(f"horovodrun started again: {argv}")

        loop = Supervisor(cfg, log=Log(), metrics=make_metrics(), events=events.append,
                          start_child=start_child, base_env={}, act=print,  # type: ignore[arg-type]
                          kill_ssh_clients=None, count_ssh_clients=None)  # type: ignore[arg-type]
        outcome = loop.run(sidecar.Link(shared).command() or [],
                           sidecar.RemoteChild.adopt(sidecar.Link(shared), running))
        assert (outcome.code, outcome.reason) == (5, "horovodrun exited with 5")
        adopted = [e for e in events if e.reason == "HorovodrunExitAdopted"]
        assert len(adopted) == 1 and adopted[0].note == (
            f"horovodrun (pid {first.pid}) started for an earlier supervisor of this pod exited "
            "with 5 before that supervisor ended the job: its exit is the job's, training is "
            "not started again")
        assert link.gen() == first.gen, "es-run was given no new launch"
        link.stop(outcome.code)  # what run_sidecar does with it: es-run exits with it
        assert wrapper.wait(10) == 5
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
