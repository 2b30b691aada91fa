"""A throwaway containerd for tests of the images: the runtime real nodes use (containerd 1.6 +
runc, images imported with `ctr -n k8s.io images import`, containers started with `ctr run`),
without a kubelet. Everything lives in one directory, removed on stop, with what containerd
would otherwise put on the host redirected there: root, state, sockets, the `opt` plugin's
directory, runc's root and the containers' cgroups (under `es-scratch-<pid>` in every v1
hierarchy). The shims' socket directory /run/containerd/s is containerd's own and shared: it is
removed only if it was not there before and is empty.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from localcluster import nodestore

NAMESPACE = "k8s.io"
SHIM_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))

CONFIG = """\
version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = ""
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


class ContainerdError(RuntimeError):
    """containerd did not start, or a ctr command failed."""


class ScratchContainerd:
    """containerd on its own root, state and socket in a temporary directory (a context
    manager). `ctr(...)` runs ctr against it in the k8s.io namespace."""

    def __init__(self, parent: Path | None = None, *, store: Path | None = None) -> None:
        # `store`: a node image store (localcluster.nodes.image_store) the root starts as a
        # hard-linked copy of, as a node's does: its images are there at once, not imported.
        self.store = store
        self.dir = Path(tempfile.mkdtemp(prefix="es-scratch-containerd-", dir=parent))
        self.socket = self.dir / "containerd.sock"
        self.cgroup = f"es-scratch-{os.getpid()}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._absent = [p for p in SHIM_DIRS if not p.exists()]

    def __enter__(self) -> ScratchContainerd:
        config = self.dir / "config.toml"
        config.write_text(CONFIG.format(d=self.dir))
        if self.store is not None:
            nodestore.populate(self.store, self.dir / "root")
        with (self.dir / "containerd.log").open("wb") as log:
            self._proc = subprocess.Popen(["containerd", "--config", str(config)],
                                          stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not (self.socket.exists() and self.ctr("version", check=False).returncode == 0):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise ContainerdError("containerd did not start")
            time.sleep(0.1)
        return self

    def __exit__(self, *_: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            for task in self.ctr("tasks", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            for container in self.ctr("containers", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", container, check=False)
                self.ctr("containers", "delete", container, check=False)
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(10)
        self._proc = None
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            point = line.split()[4]
            if point.startswith(f"{self.dir}/"):
                subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            with contextlib.suppress(OSError):
                (hierarchy / self.cgroup).rmdir()
        for path in self._absent:
            with contextlib.suppress(OSError):
                path.rmdir()

    def ctr(self, *args: str, check: bool = True,
            timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """Run `ctr` against this containerd; raise ContainerdError if it fails and check."""
        done = subprocess.run(["ctr", "--address", str(self.socket), "-n", NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args[:4])}: {done.stderr.strip()[-500:]}")
        return done

    def run_argv(self, image: str, name: str, *command: str, env: dict[str, str] | None = None,
                 mounts: tuple[str, ...] = (), detach: bool = False) -> list[str]:
        """Return the `ctr run` command line for a container on the host network, its runc state
        and cgroup inside this containerd's directory."""
        argv = ["ctr", "--address", str(self.socket), "-n", NAMESPACE, "run", "--net-host",
                "--runc-root", str(self.dir / "runc"), "--cgroup", f"/{self.cgroup}/{name}"]
        argv += ["--detach"] if detach else ["--rm"]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        for mount in mounts:
            argv += ["--mount", mount]
        return [*argv, image, name, *command]

    def disk_usage(self) -> dict[str, int]:
        """Return the bytes in the content store and in the snapshots (du, hard links once)."""
        out = {}
        for key, sub in (("content", "io.containerd.content.v1.content"),
                         ("snapshots", "io.containerd.snapshotter.v1.overlayfs")):
            done = subprocess.run(["du", "-sb", str(self.dir / "root" / sub)],
                                  capture_output=True, text=True, check=False)
            out[key] = int(done.stdout.split()[0]) if done.returncode == 0 else 0
        return out
