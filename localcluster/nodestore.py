"""Image stores for real nodes, imported once and hard-linked into every node.

Every node runs its own containerd, and a containerd keeps an image twice: its layer blobs
(content) and the unpacked layers (overlayfs snapshots). The training image is ~5 GB, so three
nodes that each import it need ~30 GB and, on two cores, minutes of unpacking per cluster start.

Instead the images are imported once into a seed store under the cache (`seed`), keyed by the
tarballs it holds, and each node's containerd root starts as a hard-linked copy of it
(`populate`): blobs and committed snapshots are never written again, so nodes may share their
inodes. The two bolt databases (containerd's metadata and the overlayfs snapshotter's) are
written, so every node gets a copy of its own. The seed and the node directories must be on one
filesystem; if they are not, `populate` says so and fails rather than copying gigabytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

Log = Callable[[str], None]
# Written by containerd after the seed is made: copied per node, never linked.
DATABASES = ("io.containerd.metadata.v1.bolt/meta.db",
             "io.containerd.snapshotter.v1.overlayfs/metadata.db")
COMPLETE = "complete.json"
MARGIN = 2 << 30  # bytes left for the nodes' containers, logs and etcd


class StoreError(RuntimeError):
    """The seed store could not be made or copied."""


def key(tarballs: Sequence[Path]) -> str:
    """The seed's key: the tarballs' names (they carry their content hashes), sizes, mtimes."""
    h = hashlib.sha256()
    for t in sorted(set(tarballs)):
        st = t.stat()
        h.update(f"{t.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _config(root: Path, state: Path, socket: Path) -> str:
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"""


def tool_env() -> dict[str, str]:
    """The environment for containerd, ctr and the node tools: PATH with the sbin directories."""
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    if "/usr/sbin" not in path.split(":"):
        path += ":/usr/sbin:/sbin"
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root")}


@contextlib.contextmanager
def _containerd(root: Path) -> Iterator[Path]:
    """A containerd of its own (no CRI) on `root`; yield its socket."""
    state = Path(tempfile.mkdtemp(prefix="es-seed-", dir="/run"))
    socket = state / "c.sock"
    (state / "config.toml").write_text(_config(root, state / "state", socket))
    log = (root.parent / "containerd.log").open("wb")
    proc = subprocess.Popen(["containerd", "--config", str(state / "config.toml")],
                            stdout=log, stderr=subprocess.STDOUT, env=tool_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while _ctr(socket, "version", timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise StoreError(f"seed containerd did not start (log: {log.name})")
            time.sleep(0.2)
        yield socket
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def _ctr(socket: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(socket), "-n", "k8s.io", *args],
                          capture_output=True, text=True, check=False, timeout=timeout,
                          env=tool_env())


def seed(tarballs: Sequence[Path], cache: Path, log: Log) -> Path:
    """The containerd root holding `tarballs` imported and unpacked (overlayfs), made once and
    cached; seeds of tarballs that no longer exist are removed."""
    base = cache / "nodestore"
    base.mkdir(parents=True, exist_ok=True)
    dest = base / key(tarballs)
    with open(base / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prune(base, keep=dest)
        if (dest / COMPLETE).exists():
            log(f"node image store cached: {dest}")
            return dest / "root"
        shutil.rmtree(dest, ignore_errors=True)
        work = base / f".{dest.name}.partial"
        shutil.rmtree(work, ignore_errors=True)
        # Blobs and unpacked layers: about twice the tarballs, plus room for the nodes' pods.
        need = 2 * sum(t.stat().st_size for t in set(tarballs)) + MARGIN
        free = shutil.disk_usage(base).free
        if free < need:
            raise StoreError(f"the node image store needs {need / 2**30:.1f} GiB free on the "
                             f"filesystem of {base}, it has {free / 2**30:.1f} GiB")
        (work / "root").mkdir(parents=True)
        t0 = time.monotonic()
        with _containerd(work / "root") as socket:
            for t in sorted(set(tarballs)):
                res = _ctr(socket, "images", "import", "--all-platforms", str(t),
                           timeout=3600)
                if res.returncode != 0:
                    shutil.rmtree(work, ignore_errors=True)
                    raise StoreError(f"ctr images import {t} failed: "
                                     f"{res.stderr.strip()[-500:]}")
        (work / COMPLETE).write_text(json.dumps(
            {"tarballs": sorted(str(t) for t in set(tarballs)),
             "seconds": round(time.monotonic() - t0, 1)}, indent=1))
        work.rename(dest)
        log(f"node image store made in {time.monotonic() - t0:.1f}s: {dest}")
        return dest / "root"


def _prune(base: Path, keep: Path) -> None:
    for d in base.iterdir():
        if d == keep or not d.is_dir():
            continue
        try:
            tarballs = json.loads((d / COMPLETE).read_text())["tarballs"]
        except (OSError, ValueError, KeyError):
            tarballs = None  # partial: its maker died (we hold the lock)
        if tarballs is None or not all(Path(t).exists() for t in tarballs):
            shutil.rmtree(d, ignore_errors=True)


def populate(seed_root: Path, root: Path) -> None:
    """Make `root` (absent or empty) a copy of the seed: hard links, databases copied."""
    if root.exists() and any(root.iterdir()):
        raise StoreError(f"{root} is not empty")
    root.parent.mkdir(parents=True, exist_ok=True)
    if root.exists():
        root.rmdir()
    # Shared with other copies, exclusive of `seed`: another checkout's images may replace
    # (prune) this seed, never while it is being copied.
    with open(seed_root.parent.parent / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not (seed_root.parent / COMPLETE).exists():
            raise StoreError(f"the node image store {seed_root.parent} was replaced by another "
                             "checkout's images before this cluster copied it: start it again")
        if os.stat(seed_root).st_dev != os.stat(root.parent).st_dev:
            raise StoreError(f"the node image store {seed_root} and the node directory "
                             f"{root.parent} are on different filesystems: hard links need "
                             "one (set TMPDIR or XDG_CACHE_HOME so that they share one)")
        res = subprocess.run(["cp", "-al", str(seed_root), str(root)], capture_output=True,
                             text=True, check=False)
    if res.returncode != 0:
        raise StoreError(f"cp -al {seed_root} {root}: {res.stderr.strip()[-300:]}")
    for db in DATABASES:
        path = root / db
        if path.exists():
            path.unlink()
            shutil.copy2(seed_root / db, path)
