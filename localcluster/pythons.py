"""Debian's own Python interpreters for the hook's tests: bullseye's 3.9 and trixie's 3.13.

The hook (supervisor/hook) runs inside users' training processes, on whatever Python their image
has (3.8 to 3.13). `python -m localcluster.pythons` (make setup) makes, for each suite of
SUITES, a minimal Debian root file system with `debootstrap --variant=minbase` and python3 and
python3-psutil (the way images.py makes the base image, through apt's configured Debian mirror),
trimmed as Debian's container images are, and keeps it as a directory under
$ES_CACHE/pythons/<suite>-<key>/, the key naming its recipe: a warm machine returns at once.

`run_argv` runs a command in one with chroot, inside new mount and PID namespaces (unshare, as
root): /proc for that PID namespace, /dev bound, a tmpfs on /tmp holding a copy of one host
directory. All of it goes when the command ends (its children too: they are in its PID
namespace), and nothing is ever written to the cached tree. Never touches a node or the network
but for debootstrap's downloads.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localcluster import images

# suite -> the python3 it ships (major.minor), the oldest and the newest Debian still serves
SUITES = {"bullseye": "3.9", "trixie": "3.13"}
PACKAGES = ("python3", "python3-psutil")
RECIPE_VERSION = 1  # bump when the way a rootfs is made changes and its recipe does not show it


@dataclass(frozen=True)
class Interpreter:
    """One suite's rootfs: where it is (or will be) cached and how it is made."""

    suite: str
    python: str  # the version its python3 has
    recipe: images.BaseRecipe
    path: Path


def host_suite(os_release: str) -> str:
    """PURE: the Debian codename in an /etc/os-release text; raise images.ImagesError if it
    names none."""
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME" and value.strip().strip('"'):
            return value.strip().strip('"')
    raise images.ImagesError("/etc/os-release has no VERSION_CODENAME: not a Debian host, so "
                             "no Debian mirror to debootstrap the hook's interpreters from")


def recipe(suite: str, sources: list[images.AptSource], host: str) -> images.BaseRecipe:
    """PURE: the recipe of `suite`'s rootfs, from apt's Debian mirror for that suite, or for
    the host's own suite (`host`) when the sources do not name it."""
    try:
        mirror, lines = images.debian_sources(sources, suite)
    except images.ImagesError:
        mirror, _ = images.debian_sources(sources, host)
        lines = [f"deb {mirror} {suite} main"]
    return images.BaseRecipe(suite=suite, mirror=mirror, sources_list=tuple(lines),
                             packages=PACKAGES)


def interpreters(cache: Path | None = None) -> list[Interpreter]:
    """Every suite's Interpreter on this machine (its apt sources name the mirror)."""
    cache = images.default_cache() if cache is None else cache
    sources = images.read_apt_sources()
    host = host_suite(Path("/etc/os-release").read_text())
    out = []
    for suite, version in SUITES.items():
        r = recipe(suite, sources, host)
        key = images.digest(RECIPE_VERSION, r.key)[:16]
        out.append(Interpreter(suite, version, r, cache / "pythons" / f"{suite}-{key}"))
    return out


def build(interpreter: Interpreter, log: images.Log) -> Path:
    """Return the interpreter's rootfs, made with debootstrap when it is not cached."""
    dest = interpreter.path
    if (dest / "usr/bin/python3").exists():
        log(f"{interpreter.suite} python {interpreter.python} cached: {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    r = interpreter.recipe
    log(f"debootstrap --variant={r.variant} {r.suite} from {r.mirror} (+ {', '.join(r.packages)})")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{interpreter.suite}-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        images.debootstrap_rootfs(r, rootfs, dest.with_name(f"{dest.name}.log"))
        # Recreated at run time (run_argv): nothing the host's debootstrap left is used there.
        for name in ("dev", "proc", "tmp"):
            shutil.rmtree(rootfs / name, ignore_errors=True)
            (rootfs / name).mkdir(mode=0o1777 if name == "tmp" else 0o755)
        rootfs.replace(dest)
    for old in dest.parent.glob(f"{interpreter.suite}-*"):
        if old != dest and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    log(f"{interpreter.suite} python {interpreter.python} made in {time.monotonic() - t0:.1f}s "
        f"({_size(dest) >> 20} MiB): {dest}")
    return dest


def _size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*"))


def build_all(log: images.Log) -> list[Path]:
    """Every suite's rootfs, the missing ones made side by side (debootstrap mostly waits on
    the mirror); raise images.ImagesError naming the first that failed."""
    todo = interpreters()
    results: dict[str, Path | Exception] = {}

    def one(i: Interpreter) -> None:
        try:
            results[i.suite] = build(i, log)
        except (images.ImagesError, OSError) as e:
            results[i.suite] = e

    threads = [threading.Thread(target=one, args=(i,), name=f"debootstrap-{i.suite}")
               for i in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in todo:
        got = results[i.suite]
        if isinstance(got, Exception):
            raise images.ImagesError(f"{i.suite}: {got}") from got
    return [i.path for i in todo]


def run_argv(rootfs: Path, copy: Path, argv: Sequence[str]) -> list[str]:
    """PURE: the command that runs `argv` in `rootfs` with chroot inside new mount and PID
    namespaces: /proc mounted for that PID namespace, the host's /dev bound, and a tmpfs on /tmp
    holding a copy of the host directory `copy` at /tmp/<its name>."""
    r = shlex.quote(str(rootfs))
    script = (f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp && mount --bind /dev {r}/dev && "
              f"cp -r {shlex.quote(str(copy))} {r}/tmp/ && "
              f"exec chroot {r} {shlex.join(argv)}")
    return ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={rootfs}/proc", "--",
            "sh", "-c", script]


def main() -> int:
    """Make the missing rootfs (make setup); print suite, python version and path lines."""
    def log(line: str) -> None:
        print(f"pythons: {line}", file=sys.stderr, flush=True)

    try:
        paths = build_all(log)
    except images.ImagesError as e:
        log(str(e))
        return 1
    for (suite, version), path in zip(SUITES.items(), paths, strict=True):
        print(f"{suite} python{version} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
