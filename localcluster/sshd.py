"""Fake hosts: one real OpenSSH sshd bound to one loopback address (127.x.y.z) each.

horovodrun reaches a worker by `ssh <host> -p PORT -i KEY ...`; a fake host is an sshd listening
only on its own loopback address, key-only login, with its own host key, in a temporary
directory. `KeyPair` makes the client key pair (the job's ssh Secret plays this role in a cluster).
Only for tests that need real ssh sessions or real horovodrun without Kubernetes, quickly:
the supervisor's ssh-client handling (tests/integration/test_ssh_clients.py), the worker image's
sshd configuration and train.py under horovodrun (tests/e2e/test_train_script.py). Nothing that
claims to be end to end runs on them: that is the real nodes' job (localcluster/nodes.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


class SshdError(RuntimeError):
    pass


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path

    @classmethod
    def generate(cls, directory: Path, name: str = "id_ed25519") -> KeyPair:
        directory.mkdir(parents=True, exist_ok=True)
        key = directory / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "elastic-supervisor",
                        "-f", str(key)], check=True, stdin=subprocess.DEVNULL)
        return cls(key, key.with_suffix(".pub"))


def ssh_client_args(key: KeyPair, port: int) -> list[str]:
    """Options for an ssh client to reach fake hosts non-interactively."""
    return ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-i", str(key.private), "-p", str(port)]


def host_key(path: Path) -> Path:
    """Return `path`, an ed25519 host key, generating it first if it does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                       check=True, stdin=subprocess.DEVNULL)
    return path


def write_sshd_config(directory: Path, address: str, port: int, hostkey: Path,
                      authorized_keys: Path, *, set_env: dict[str, str] | None = None) -> Path:
    """Write `directory`/sshd_config for one fake host and return its path.

    Key-only root login on `address`:`port`; `set_env` is exported into every session (sshd
    otherwise gives sessions a fresh environment), e.g. a marker that finds them later.
    Sessions get SHLVL=1, so bash started by sshd skips ~/.bashrc (it sources it only at level
    1), as in an image whose root has none worth running: this machine's runs `pyenv rehash`,
    whose lock file a killed session leaves behind, stalling every later session for 60 s.
    """
    authorized_keys.chmod(0o600)
    lines = [
        f"ListenAddress {address}:{port}",
        f"HostKey {hostkey}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {directory / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PermitUserEnvironment no",
        "LogLevel ERROR",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
    ]
    env = {"SHLVL": "1", **(set_env or {})}
    lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    cfg = directory / "sshd_config"
    cfg.write_text("\n".join([*lines, ""]))
    return cfg


def sshd_argv(config: Path) -> list[str]:
    """Return the command that runs sshd in the foreground with `config`, logging to stderr.

    Raises SshdError if sshd is missing; creates its privilege separation directory.
    """
    if not os.access(SSHD, os.X_OK):
        raise SshdError(f"sshd not found at {SSHD} (install openssh-server: make setup)")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    return [SSHD, "-D", "-e", "-f", str(config)]


class FakeHost:
    """sshd on `address`:`port`, accepting only `authorized` keys; start() / stop()."""

    def __init__(self, address: str, port: int, authorized: KeyPair,
                 workdir: Path | None = None) -> None:
        self.address, self.port, self.authorized = address, port, authorized
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"es-host-{address}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> FakeHost:
        d = self.workdir
        hostkey = host_key(d / "ssh_host_ed25519_key")
        (d / "authorized_keys").write_text(self.authorized.public.read_text())
        cfg = write_sshd_config(d, self.address, self.port, hostkey, d / "authorized_keys")
        log = (d / "sshd.log").open("ab")
        self.proc = subprocess.Popen(sshd_argv(cfg), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SshdError(f"sshd on {self.address}:{self.port} exited "
                                f"{self.proc.returncode}: {(d / 'sshd.log').read_text()[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                    (self.address, self.port), timeout=0.5):
                return self
            time.sleep(0.05)
        raise SshdError(f"sshd on {self.address}:{self.port} not listening after {timeout}s")

    def stop(self) -> None:
        """Kill sshd and every session it forked (its whole process group), remove the dir."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
