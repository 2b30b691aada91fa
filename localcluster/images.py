"""The project's container images, made on this machine (no registry is reachable), as tarballs
that `ctr -n k8s.io images import` loads into a node's containerd.

`build(Settings())` returns image name -> tarball path for the launcher, the worker, the
native-sidecar mode's sidecar and trainer, the TensorFlow trainer, and the pause image
(`python -m localcluster images`, `make images`). Everything is cached under `$ES_CACHE`
(~/.cache/elastic-supervisor) and keyed by its inputs, so a warm machine returns at once, even
from a clean clone, without starting anything:
- base/: Debian bookworm made with `debootstrap --variant=minbase` through apt's configured
  Debian source (python3, python3-venv, ca-certificates), a rootfs tarball keyed by its recipe;
  `docker import`ed as elastic-supervisor-base:bookworm, the Dockerfiles' PYTHON_IMAGE.
- wheelhouse/: every wheel the images install (torch and its CUDA libraries as PyPI ships them,
  numpy, Horovod's and the supervisor's dependencies) downloaded once with pip, plus the Horovod
  wheel `make setup` built (never compiled again). Builds get it from a loopback HTTP server
  (pip's PIP_FIND_LINKS, PIP_NO_INDEX=1): pip in a build never reaches PyPI.
- wheelhouse-tf/: the same for the TensorFlow trainer (tensorflow-cpu, its dependencies, and the
  Horovod wheel built against it by scripts/build-tf-env.sh): a directory of its own, since both
  Horovod wheels have one file name; served under /tf/ by the same server.
- docker/: the data root of a dockerd that runs only while images are built, on its own socket
  and exec root, with no bridge, no iptables rules, no ip_forward change (`DockerDaemon`).
- images/: one `docker save` archive of the launcher, worker, trainer, sidecar and TensorFlow
  trainer (their shared layers once) named by their tags and image IDs, the pause image (a
  static C program, `pause.c`, written as a docker-save archive with tarfile), and an index
  from the inputs' key to them. A build checks what the images are made of before it saves
  them: the launcher and the trainer start with the training stage's layers, the worker with
  the trainer's, the TensorFlow trainer with the base image's; neither trainer holds anything
  of the supervisor, the sidecar no training stack (`docker run` of a probe in each).

Never touches a node: importing the tarballs is the local cluster's job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause.c"
PAUSE_VERSION = "3.10"
BASE_IMAGE = "elastic-supervisor-base:bookworm"
HOROVOD_VERSION = "0.28.1"
# Bump when the way an artefact is made changes in a way its inputs do not show.
BASE_RECIPE_VERSION = 1
IMAGES_RECIPE_VERSION = 3  # 3: the archive holds the TensorFlow trainer
RECIPE_LABEL = "org.elastic-supervisor.recipe"
# File names of this module's artefacts in $ES_CACHE/images (shared with other image makers):
# only files with these prefixes are ever removed.
ARCHIVE_PREFIX = "images-"
# Recipe 1's archives (launcher and worker only): removed like this module's own.
LEGACY_PREFIXES = ("launcher-worker-",)
PAUSE_PREFIX = "pause-static-"
# Fixed, outside the kernel's ephemeral range (32768-60999): the wheelhouse URL is a build arg,
# so it is part of Docker's cache key for every RUN that installs from it.
DEFAULT_WHEELHOUSE_PORT = 29417
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCHER_DOCKERFILE = "launcher_image/Dockerfile"
WORKER_DOCKERFILE = "worker_image/Dockerfile"
SIDECAR_DOCKERFILE = "sidecar_image/Dockerfile"
TRAINER_TF_DOCKERFILE = "trainer_tf_image/Dockerfile"
# The TensorFlow pin lives in the script that makes the hook tests' TensorFlow environment (and
# the Horovod wheel built against it): the image installs the very same version.
TF_ENV_SCRIPT = "scripts/build-tf-env.sh"
# Where the server mounts the TensorFlow wheelhouse, below the wheelhouse's own URL.
TF_WHEELHOUSE_PATH = "tf"

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"images: {line}", file=sys.stderr, flush=True)


class ImagesError(RuntimeError):
    """An image or one of its inputs could not be made; the message says which and why."""


def default_cache() -> Path:
    """Return the project's cache directory ($ES_CACHE, default ~/.cache/elastic-supervisor)."""
    return Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor"))


def _port_from_env() -> int:
    raw = os.environ.get("ES_WHEELHOUSE_PORT", str(DEFAULT_WHEELHOUSE_PORT))
    if not raw.isdigit() or not 1024 <= int(raw) <= 65535:
        raise ImagesError(f"ES_WHEELHOUSE_PORT={raw!r}: expected a port number 1024-65535")
    return int(raw)


@dataclass(frozen=True)
class Settings:
    """Where images are built from and cached, and how. Durations in seconds."""

    root: Path = ROOT  # the repository: the build context
    cache: Path = field(default_factory=default_cache)
    # Runs `pip download` and scripts/build-horovod.sh: a Python 3.11 with torch (make setup's).
    python: Path = field(default_factory=lambda: Path(sys.executable))
    # 127.0.0.1:port serves the wheelhouse to builds (ES_WHEELHOUSE_PORT).
    wheelhouse_port: int = field(default_factory=_port_from_env)
    # The daemon's socket, exec root and pid file: a tmpfs directory removed after every build.
    docker_run_dir: Path = Path("/run/elastic-supervisor-docker")
    docker_start_timeout_s: float = 60.0
    docker_stop_timeout_s: float = 60.0
    suite: str = "bookworm"


# ---- names, keys, build args: pure ----------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """The image references the project uses (as pods name them)."""

    launcher: str
    worker: str  # the trainer + the supervisor's package (baked mode)
    sidecar: str  # the supervisor alone (native-sidecar mode)
    trainer: str  # the worker Dockerfile's `trainer` stage: nothing of the supervisor
    training: str  # the launcher Dockerfile's `training` stage, the trainer's FROM
    pause: str
    # trainer_tf_image/Dockerfile: TensorFlow + Horovod on the base image, nothing of ours
    trainer_tf: str
    base: str = BASE_IMAGE


def project_version(pyproject_text: str) -> str:
    """Return [project].version from pyproject.toml's text."""
    m = re.search(r'^version = "([^"]+)"$', pyproject_text, re.M)
    if m is None:
        raise ImagesError("pyproject.toml: no version = \"...\" line")
    return m[1]


def image_names(version: str) -> Names:
    """Return the names of the project's images for a version (pyproject.toml's)."""
    return Names(launcher=f"elastic-supervisor-launcher:{version}",
                 worker=f"elastic-supervisor-worker:{version}",
                 sidecar=f"elastic-supervisor-sidecar:{version}",
                 trainer=f"elastic-supervisor-trainer:{version}",
                 training=f"elastic-supervisor-training:{version}",
                 pause=f"localhost/elastic-supervisor-pause:{PAUSE_VERSION}",
                 trainer_tf=f"elastic-supervisor-trainer-tf:{version}")


def containerd_ref(name: str) -> str:
    """Return the reference containerd stores an image under (what `ctr` needs; the kubelet
    normalizes a pod's image the same way): a name without a registry is Docker Hub's."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if rest else f"docker.io/library/{name}"


def digest(*parts: object) -> str:
    """Return a sha256 hex digest of JSON-encoded parts (a cache key)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def dockerignore_patterns(text: str) -> list[str]:
    """Return the patterns of a .dockerignore, comments and blank lines dropped."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Return whether Docker leaves `path` (relative, '/'-separated) out of the build context.

    Docker's rules: patterns in order, the last one matching the path or one of its parent
    directories wins; `!` re-includes; `*` and `?` stay within one path segment, `**` spans any.
    """
    parents = [path] + ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = raw.removeprefix("!").strip().strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, p) for p in parents):
            excluded = not negated
    return excluded


def _may_reinclude(patterns: list[str], directory: str) -> bool:
    # Whether a `!` pattern could match something below an excluded directory.
    parts = directory.split("/")
    for raw in patterns:
        if not raw.startswith("!"):
            continue
        segs = raw[1:].strip().strip("/").split("/")
        if "**" in segs[: len(parts)] or (
                len(segs) > len(parts)
                and all(fnmatchcase(p, s) for p, s in zip(parts, segs, strict=False))):
            return True
    return False


def context_files(root: Path, patterns: list[str]) -> list[str]:
    """Return the files (relative paths, sorted) that Docker sends as the build context of root."""
    out: list[str] = []
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        dirs[:] = [d for d in dirs if not dockerignore_excludes(patterns, prefix + d)
                   or _may_reinclude(patterns, prefix + d)]
        out.extend(prefix + f for f in files if not dockerignore_excludes(patterns, prefix + f))
    return sorted(out)


def tree_digest(root: Path, files: Iterable[str]) -> str:
    """Return a digest of files' paths, executable bits and contents (symlinks: their target)."""
    h = hashlib.sha256()
    for rel in files:
        path = root / rel
        if path.is_symlink():
            body = os.readlink(path).encode()
            mode = "l"
        else:
            body = path.read_bytes()
            mode = "x" if path.stat().st_mode & 0o111 else "-"
        h.update(f"{rel}\0{mode}\0{hashlib.sha256(body).hexdigest()}\n".encode())
    return h.hexdigest()


def wheelhouse_url(port: int, mount: str = "") -> str:
    """Return the find-links URL builds get the wheelhouse from, or the one the server mounts
    at `mount` (the build runs on the host's network, so loopback is the host's)."""
    return f"http://127.0.0.1:{port}/{mount}{'/' if mount else ''}"


def build_args(*, base_image: str, torch_version: str, wheelhouse: str | None,
               training_image: str | None = None) -> dict[str, str]:
    """Return the --build-arg values for the Dockerfiles: the local base image, the torch pin,
    the wheelhouse (pip's own PIP_FIND_LINKS with PIP_NO_INDEX, or PyPI when None) and, for the
    worker, the training image it starts FROM."""
    args = {"PYTHON_IMAGE": base_image, "TORCH_VERSION": torch_version}
    if wheelhouse is not None:
        args |= {"PIP_FIND_LINKS": wheelhouse, "PIP_NO_INDEX": "1"}
    if training_image is not None:
        args["TRAINING_IMAGE"] = training_image
    return args


def tf_build_args(*, base_image: str, tf_version: str, wheelhouse: str | None) -> dict[str, str]:
    """Return the --build-arg values of the TensorFlow trainer: the local base image, the
    TensorFlow pin and its wheelhouse (pip's PIP_FIND_LINKS with PIP_NO_INDEX, or PyPI when
    None, where the build compiles Horovod)."""
    args = {"PYTHON_IMAGE": base_image, "TF_VERSION": tf_version}
    if wheelhouse is not None:
        args |= {"PIP_FIND_LINKS": wheelhouse, "PIP_NO_INDEX": "1"}
    return args


def docker_build_argv(*, dockerfile: str, tag: str, args: dict[str, str],
                      target: str | None = None) -> list[str]:
    """Return the `docker build` arguments (after `docker`) for one image, context ".": the
    legacy builder's flags (host network: the wheelhouse is on loopback), failed containers
    removed."""
    argv = ["build", "--network", "host", "--force-rm", "-f", dockerfile, "-t", tag]
    if target is not None:
        argv += ["--target", target]
    for key in sorted(args):
        argv += ["--build-arg", f"{key}={args[key]}"]
    return [*argv, "."]


@dataclass(frozen=True)
class BuildStep:
    """One `docker build`: the tag it makes, from which Dockerfile and stage, with which args."""

    tag: str
    dockerfile: str
    target: str | None
    args: dict[str, str]

    def argv(self) -> list[str]:
        return docker_build_argv(dockerfile=self.dockerfile, tag=self.tag, args=self.args,
                                 target=self.target)


def build_steps(names: Names, args: dict[str, str],
                tf_args: dict[str, str]) -> list[BuildStep]:
    """Return the builds, in order, given the launcher's build args (build_args) and the
    TensorFlow trainer's (tf_build_args): the training stage, the launcher on it; the trainer
    and then the worker from the worker Dockerfile on the training image (the worker's build
    takes its `trainer` stage from the cache: it starts with the trainer's layers); the sidecar
    on the base image alone (no torch version, no training image: it has neither); last the
    TensorFlow trainer, on the base image alone."""
    on_training = {"TRAINING_IMAGE": names.training}
    sidecar = {k: v for k, v in args.items() if k not in ("TORCH_VERSION", "TORCH_INDEX_URL")}
    return [BuildStep(names.training, LAUNCHER_DOCKERFILE, "training", args),
            BuildStep(names.launcher, LAUNCHER_DOCKERFILE, None, args),
            BuildStep(names.trainer, WORKER_DOCKERFILE, "trainer", on_training),
            BuildStep(names.worker, WORKER_DOCKERFILE, None, on_training),
            BuildStep(names.sidecar, SIDECAR_DOCKERFILE, None, sidecar),
            BuildStep(names.trainer_tf, TRAINER_TF_DOCKERFILE, None, tf_args)]


def layer_problems(names: Names, layers: dict[str, list[str]]) -> list[str]:
    """Return what is wrong with the images' layers (diff IDs, bottom first, by tag, the base
    image's and the training stage's included), one line each: an image that does not start
    with the layers of the one it is built on (a node would store those twice), a sidecar that
    holds any layer of the training stack."""
    found = []
    for image, under in ((names.launcher, names.training), (names.trainer, names.training),
                         (names.worker, names.trainer), (names.trainer_tf, names.base)):
        shared = layers[under]
        if layers[image][: len(shared)] != shared:
            found.append(f"{image} does not start with the layers of {under}: a node would "
                         "store them twice")
    stack = set(layers[names.training]) - set(layers[names.base])
    if stack & set(layers[names.sidecar]):
        found.append(f"{names.sidecar} holds layers of {names.training}: the sidecar must not "
                     "carry the training stack")
    return found


@dataclass(frozen=True)
class Forbidden:
    """What must not be in an image: Python modules and distributions (as its `python` finds
    them) and file or directory names anywhere on its filesystem."""

    modules: tuple[str, ...] = ()
    distributions: tuple[str, ...] = ()
    files: tuple[str, ...] = ()


def forbidden(names: Names) -> dict[str, Forbidden]:
    """Return, by image, what it must not hold: either trainer nothing of the supervisor (the
    native-sidecar mode's promise: a training image without elastic-supervisor, its hook
    included), the sidecar no training stack and no ssh (ssh-keygen and sshd stand for OpenSSH's
    packages: a file named `ssh` is also apt's ssh method in any Debian image)."""
    ours = Forbidden(modules=("supervisor", "elastic_supervisor_hook"),
                     distributions=("elastic-supervisor",),
                     files=("elastic_supervisor_hook", "elastic-supervisor"))
    return {
        names.trainer: ours,
        names.trainer_tf: ours,
        names.sidecar: Forbidden(modules=("torch", "horovod"),
                                 distributions=("torch", "horovod"),
                                 files=("horovodrun", "ssh-keygen", "sshd")),
    }


# Run by an image's own `python` (argv: a Forbidden as JSON, the directory to search): prints
# what it found of it as JSON. Python 3.8 code: it runs in any training image.
PROBE = """\
import importlib.metadata as md, importlib.util as iu, json, os, sys
want, top = json.loads(sys.argv[1]), sys.argv[2]
def has(name):
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True
files = []
for here, dirs, names in os.walk(top):
    if here == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    files += [os.path.join(here, n) for n in sorted(dirs + names) if n in want["files"]]
print(json.dumps({"modules": [m for m in want["modules"] if iu.find_spec(m)],
                  "distributions": [d for d in want["distributions"] if has(d)],
                  "files": sorted(files)}))
"""


def probe_argv(image: str, wanted: Forbidden, top: str = "/") -> list[str]:
    """Return the `docker` arguments that run PROBE in `image` (as root: it reads every
    directory; no network)."""
    return ["run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "python",
            image, "-c", PROBE, json.dumps(dataclasses.asdict(wanted)), top]


def content_problem(image: str, found: dict[str, list[str]]) -> str | None:
    """Return one line naming what PROBE found in `image` that it must not hold, or None."""
    parts = [f"{kind[:-1]} {name}" for kind in ("modules", "distributions", "files")
             for name in found.get(kind, [])]
    return f"{image} holds what it must not: {', '.join(parts)}" if parts else None


def torch_pin(pyproject_text: str) -> str:
    """Return the torch version pyproject.toml pins (its `train` extra)."""
    m = re.search(r'"torch==([^"]+)"', pyproject_text)
    if m is None:
        raise ImagesError("pyproject.toml: no \"torch==VERSION\" pin in the train extra")
    return m[1]


def tf_pin(script_text: str) -> str:
    """Return the TensorFlow version scripts/build-tf-env.sh installs (its TF_VERSION default)."""
    m = re.search(r"^TF_VERSION=\$\{TF_VERSION:-([^}]+)\}$", script_text, re.M)
    if m is None:
        raise ImagesError(f"{TF_ENV_SCRIPT}: no TF_VERSION=${{TF_VERSION:-VERSION}} line")
    return m[1]


def tf_wheelhouse_requirements(tf_version: str) -> list[str]:
    """Return what the TensorFlow wheelhouse must hold, as pip requirements: what
    scripts/build-training-venv.sh installs the TensorFlow trainer from (Horovod apart: its
    wheel is added as a file). No build requirements: nothing is compiled from a wheelhouse."""
    return [f"tensorflow-cpu=={tf_version}", "cloudpickle", "packaging", "psutil", "pyyaml"]


def project_dependencies(pyproject_text: str) -> list[str]:
    """Return [project].dependencies (what the launcher image installs before the code)."""
    return list(tomllib.loads(pyproject_text)["project"]["dependencies"])


def wheelhouse_requirements(pyproject_text: str) -> list[str]:
    """Return what the wheelhouse must hold, as pip requirements: exactly what
    scripts/build-training-venv.sh and the launcher Dockerfile install (Horovod apart: its
    wheel is added as a file)."""
    train = ["torch==" + torch_pin(pyproject_text), "numpy>=1.26,<3"]
    horovod = ["setuptools>=68", "wheel", "cffi", "cloudpickle", "packaging", "psutil", "pyyaml"]
    return train + horovod + project_dependencies(pyproject_text)


# ---- apt sources and the base image recipe ----------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    """One Debian source: URI, suites, components."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def parse_apt_sources(files: dict[str, str]) -> list[AptSource]:
    """Return the `deb` sources of apt's configuration files (name -> text): one-line .list and
    deb822 .sources formats."""
    out: list[AptSource] = []
    for name, text in sorted(files.items()):
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                for uri in fields.get("uris", "").split():
                    out.append(AptSource(uri.rstrip("/"), tuple(fields.get("suites", "").split()),
                                         tuple(fields.get("components", "").split())))
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    out.append(AptSource(words[1].rstrip("/"), (words[2],), tuple(words[3:])))
    return out


def debian_sources(sources: list[AptSource], suite: str) -> tuple[str, list[str]]:
    """Return the mirror to debootstrap `suite` from and the image's sources.list lines: the
    host's Debian entries for suite, suite-updates and suite-security (main only)."""
    wanted = (suite, f"{suite}-updates", f"{suite}-security")
    lines: list[str] = []
    mirror = ""
    for src in sources:
        if "main" not in src.components:
            continue
        for s in src.suites:
            if s in wanted and f"deb {src.uri} {s} main" not in lines:
                lines.append(f"deb {src.uri} {s} main")
                if s == suite and not mirror:
                    mirror = src.uri
    if not mirror:
        raise ImagesError(f"apt's sources name no Debian '{suite} main' entry to debootstrap "
                          "from (/etc/apt/sources.list, /etc/apt/sources.list.d/)")
    return mirror, lines


def read_apt_sources() -> list[AptSource]:
    """Return the sources of this machine's apt configuration."""
    files: dict[str, str] = {}
    for path in [Path("/etc/apt/sources.list"),
                 *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".list", ".sources") and path.is_file():
            files[path.name] = path.read_text(errors="replace")
    return parse_apt_sources(files)


BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# As Debian's own container images: no docs, man pages or translations from later apt installs.
DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
# Debian's docker-clean: no .deb files and no package caches (/var/cache/apt/*.bin, ~80 MB)
# are left in a layer by an apt-get install.
_APT_RM = ("rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb "
           "/var/cache/apt/*.bin || true")
APT_CLEAN = (f'DPkg::Post-Invoke {{ "{_APT_RM}"; }};\n'
             f'APT::Update::Post-Invoke {{ "{_APT_RM}"; }};\n'
             'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n')


@dataclass(frozen=True)
class BaseRecipe:
    """How the base image is made; its key names the cached rootfs tarball."""

    suite: str
    mirror: str
    sources_list: tuple[str, ...]
    packages: tuple[str, ...] = BASE_PACKAGES
    variant: str = "minbase"
    env: tuple[str, ...] = (f"PATH={PATH_ENV}", "LANG=C.UTF-8")

    @property
    def key(self) -> str:
        """A digest of everything that makes the rootfs."""
        return digest(BASE_RECIPE_VERSION, self.suite, self.mirror, self.sources_list,
                      self.packages, self.variant, self.env, DPKG_EXCLUDES, APT_CLEAN)

    def docker_changes(self) -> list[str]:
        """Return `docker import --change` instructions: env, command and the recipe label."""
        return [*(f"ENV {e}" for e in self.env), 'CMD ["bash"]',
                f"LABEL {RECIPE_LABEL}={self.key}"]


# ---- the pause image: a docker-save archive written with tarfile ---------------------------


def _tar_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, data


def _tar_bytes(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pause_archive(binary: bytes, name: str) -> bytes:
    """Return a docker-save archive (manifest.json, config, one layer) of an image holding only
    /pause, run as nobody (65535): what `ctr images import` and a sandbox_image need.
    Deterministic: the same binary gives the same bytes."""
    layer = _tar_bytes([_tar_member("pause", binary, 0o755)])
    diff_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535",
                   "Env": [f"PATH={PATH_ENV}"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "localcluster/images.py: gcc -static localcluster/pause.c"}],
    }, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name],
                            "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    dirinfo = tarfile.TarInfo(diff_id)
    dirinfo.type, dirinfo.mode, dirinfo.mtime = tarfile.DIRTYPE, 0o755, 0
    return _tar_bytes([(dirinfo, b""), _tar_member(f"{diff_id}/layer.tar", layer),
                       _tar_member(config_name, config), _tar_member("manifest.json", manifest)])


def build_pause(settings: Settings, name: str, log: Log) -> Path:
    """Return the pause image's archive, compiling pause.c statically when its source changed."""
    source = PAUSE_SOURCE.read_bytes()
    key = digest(source.decode(), PAUSE_VERSION, name)[:16]
    dest = settings.cache / "images" / f"{PAUSE_PREFIX}{key}.tar"
    if dest.exists():
        log(f"pause image cached: {dest}")
        return dest
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ImagesError("gcc not found: needed to build the pause image (Debian gcc, libc6-dev)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pause"
        _run([gcc, "-static", "-Os", "-s", "-Wall", "-Werror", f'-DVERSION="{PAUSE_VERSION}"',
              "-o", str(out), str(PAUSE_SOURCE)], what="gcc -static pause.c")
        version = _run([str(out), "-v"], what="pause -v").stdout.strip()
        _atomic_write(dest, pause_archive(out.read_bytes(), name))
    for old in dest.parent.glob(f"{PAUSE_PREFIX}*.tar"):
        if old != dest:
            old.unlink()
    log(f"pause image built ({version}, {dest.stat().st_size} bytes): {dest}")
    return dest


# ---- processes and files ---------------------------------------------------------------------


def _run(argv: list[str], *, what: str, timeout: float = 600,
         **kw: object) -> subprocess.CompletedProcess[str]:
    """Run a command, returning its result; raise ImagesError with its output if it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              **kw)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImagesError(f"{what}: {e}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise ImagesError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done


def _atomic_write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    tmp.write_bytes(data)
    tmp.replace(dest)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def build_lock(settings: Settings, log: Log = _stderr) -> Iterator[None]:
    """Hold the cache's build lock for a `with` block: one build (one dockerd on the data root)
    at a time; a second caller waits."""
    path = settings.cache / "images" / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another image build to finish ({path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _since(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f}s"


# ---- the base rootfs (debootstrap) -----------------------------------------------------------


def base_recipe(settings: Settings) -> BaseRecipe:
    """Return the base image's recipe from this machine's apt sources."""
    mirror, lines = debian_sources(read_apt_sources(), settings.suite)
    return BaseRecipe(suite=settings.suite, mirror=mirror, sources_list=tuple(lines))


def build_base_rootfs(settings: Settings, recipe: BaseRecipe, log: Log) -> Path:
    """Return the base rootfs tarball for the recipe, made with debootstrap when missing."""
    dest = settings.cache / "base" / f"{settings.suite}-{recipe.key[:16]}.tar"
    if dest.exists():
        log(f"base rootfs cached: {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"debootstrap --variant={recipe.variant} {recipe.suite} from {recipe.mirror} "
        f"(+ {', '.join(recipe.packages)}; ~65 s)")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        debootstrap_rootfs(recipe, rootfs, dest.with_suffix(".log"))
        partial = dest.with_name(f".{dest.name}.partial")
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial),
              "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
              "--exclude=./run/*", "--exclude=./tmp/*", "."], what="tar of the base rootfs")
        partial.replace(dest)
    for old in dest.parent.glob(f"{settings.suite}-*.tar"):
        if old != dest:
            old.unlink()
    log(f"base rootfs made in {_since(t0)} ({dest.stat().st_size >> 20} MiB): {dest}")
    return dest


def debootstrap_rootfs(recipe: BaseRecipe, rootfs: Path, logfile: Path) -> None:
    """Make `rootfs` (a directory that does not exist yet) with debootstrap from the recipe,
    trimmed as Debian's container images are; its output goes to `logfile`. Raise ImagesError
    with the log's tail if debootstrap fails."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImagesError("debootstrap not found: run make setup (Debian debootstrap)")
    with logfile.open("w") as out:
        done = subprocess.run(
            [debootstrap, f"--variant={recipe.variant}",
             f"--include={','.join(recipe.packages)}", recipe.suite, str(rootfs),
             recipe.mirror], stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise ImagesError(f"debootstrap failed (exit {done.returncode}; log {logfile}):\n"
                          f"{_tail(logfile)}")
    _trim_rootfs(rootfs, recipe)


def _trim_rootfs(rootfs: Path, recipe: BaseRecipe) -> None:
    # What Debian's container images do: no package caches or lists, no docs; the host's
    # hostname and resolver are not the image's (the runtime provides them).
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
                    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*",
                    "usr/share/locale/*", "var/log/*.log", "var/log/apt/*"):
        for path in rootfs.glob(pattern):
            if path.name in ("locale.alias", "partial", "lock", "auxfiles"):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for name in ("etc/hostname", "etc/resolv.conf"):
        (rootfs / name).unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list").write_text("\n".join(recipe.sources_list) + "\n")
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/excludes").write_text(DPKG_EXCLUDES)
    (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)


# ---- the wheelhouse --------------------------------------------------------------------------


def horovod_wheel(settings: Settings, log: Log) -> Path:
    """Return the Horovod wheel make setup built (scripts/build-horovod.sh; compiles only when
    it is not cached for this torch and Python)."""
    script = settings.root / "scripts" / "build-horovod.sh"
    done = _run([str(script), str(settings.python)], what="scripts/build-horovod.sh",
                timeout=3600, env={**os.environ, "ES_CACHE": str(settings.cache)})
    wheel = Path(done.stdout.strip().splitlines()[-1])
    if not wheel.is_file():
        raise ImagesError(f"scripts/build-horovod.sh printed {wheel}, which is not a file")
    log(f"horovod wheel: {wheel}")
    return wheel


def horovod_tf_wheel(settings: Settings, tf_version: str, log: Log) -> Path:
    """Return the Horovod wheel built against tensorflow-cpu `tf_version` (scripts/build-tf-env.sh
    builds it with the TensorFlow environment of the hook's tests, $ES_CACHE/tf-venv). When
    warm, found where scripts/build-horovod.sh caches it, without importing TensorFlow; else
    that environment is made (or checked: it is kept when ready) and the script asked."""
    pytag = _run([str(settings.python), "-c",
                  "import sys; print('cp%d%d' % sys.version_info[:2])"],
                 what="python tag").stdout.strip()
    cached = settings.cache / "wheels" / f"horovod-{HOROVOD_VERSION}-tf{tf_version}-{pytag}"
    found = sorted(cached.glob("horovod-*.whl"))
    if found:
        log(f"horovod wheel (TensorFlow {tf_version}): {found[0]}")
        return found[0]
    env = {**os.environ, "ES_CACHE": str(settings.cache), "TF_VERSION": tf_version}
    venv = settings.cache / "tf-venv"
    log(f"the TensorFlow environment and its Horovod wheel: {TF_ENV_SCRIPT} {venv} "
        "(~4 min cold)")
    _run([str(settings.root / TF_ENV_SCRIPT), str(venv)], what=TF_ENV_SCRIPT, timeout=3600,
         env=env)
    done = _run([str(settings.root / "scripts" / "build-horovod.sh"), str(venv / "bin" / "python"),
                 "tensorflow"], what="scripts/build-horovod.sh (tensorflow)", timeout=3600,
                env=env)
    wheel = Path(done.stdout.strip().splitlines()[-1])
    if not wheel.is_file():
        raise ImagesError(f"scripts/build-horovod.sh printed {wheel}, which is not a file")
    log(f"horovod wheel (TensorFlow {tf_version}): {wheel}")
    return wheel


def build_wheelhouse(settings: Settings, requirements: list[str], horovod: Path,
                     log: Log, *, directory: str = "wheelhouse") -> Path:
    """Return the wheelhouse for these requirements and Horovod wheel, a directory under
    $ES_CACHE/`directory`, downloading what it lacks with pip (binary wheels for this Python; a
    previous wheelhouse's files there are hard-linked in first, so a changed requirement
    downloads only what changed). Older wheelhouses under `directory` are removed."""
    tag = _run([str(settings.python), "-c",
                "import sys, sysconfig; print(f'cp{sys.version_info[0]}{sys.version_info[1]}-'"
                " + sysconfig.get_platform())"], what="python tag").stdout.strip()
    key = digest(requirements, horovod.name, hashlib.sha256(horovod.read_bytes()).hexdigest(),
                 tag)[:16]
    parent = settings.cache / directory
    dest = parent / key
    if (dest / ".complete").exists():
        log(f"wheelhouse cached: {dest}")
        return dest
    t0 = time.monotonic()
    partial = parent / f".{key}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    for old in parent.iterdir():
        if old.is_dir() and old.name != partial.name and (old / ".complete").exists():
            for wheel in old.glob("*.whl"):
                with contextlib.suppress(FileExistsError):
                    os.link(wheel, partial / wheel.name)
    (partial / "requirements.txt").write_text("\n".join(requirements) + "\n")
    shutil.copy2(horovod, partial / horovod.name)
    log(f"pip download into {directory} ({len(requirements)} requirements + Horovod; "
        "torch and its CUDA libraries are ~3 GB the first time, TensorFlow ~0.4 GB)")
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    _run([str(settings.python), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
          "--only-binary=:all:", "-d", str(partial), "--find-links", str(partial),
          "-r", str(partial / "requirements.txt"), str(partial / horovod.name)],
         what="pip download (wheelhouse)", timeout=3600, env=env)
    (partial / ".complete").write_text(f"{tag}\n")
    if dest.exists():
        shutil.rmtree(dest)
    partial.replace(dest)
    for old in parent.iterdir():
        if old.is_dir() and old != dest:
            shutil.rmtree(old)
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    log(f"wheelhouse made in {_since(t0)} ({size >> 20} MiB): {dest}")
    return dest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    served: list[str]

    def log_message(self, format: str, *args: object) -> None:
        self.served.append(self.path)


class _MountingHandler(_QuietHandler):
    mounts: dict[str, Path]

    def translate_path(self, path: str) -> str:
        # /<mount>/rest is rest in that mount's directory; anything else is the main directory's.
        head, sep, rest = path.lstrip("/").partition("/")
        if not sep or head not in self.mounts:
            return super().translate_path(path)
        main, self.directory = self.directory, str(self.mounts[head])
        try:
            return super().translate_path(f"/{rest}")
        finally:
            self.directory = main


class WheelhouseServer:
    """The wheelhouse on http://127.0.0.1:port/ (a directory listing pip reads as find-links),
    and each of `mounts` (name -> directory) on http://127.0.0.1:port/name/, for the duration of
    a `with` block. `served` lists the paths requested."""

    def __init__(self, directory: Path, port: int, mounts: dict[str, Path] | None = None) -> None:
        self.directory, self.port = directory, port
        self.mounts = dict(mounts or {})
        self.served: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return wheelhouse_url(self.port)

    def __enter__(self) -> WheelhouseServer:
        handler = type("Handler", (_MountingHandler,), {"served": self.served,
                                                         "mounts": self.mounts})
        try:
            self._server = http.server.ThreadingHTTPServer(
                ("127.0.0.1", self.port),
                functools.partial(handler, directory=str(self.directory)))
        except OSError as e:
            raise ImagesError(f"wheelhouse server: cannot listen on 127.0.0.1:{self.port} ({e}); "
                              "set ES_WHEELHOUSE_PORT to a free port") from e
        self._thread = threading.Thread(target=self._server.serve_forever, name="wheelhouse",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)


# ---- the Docker daemon -----------------------------------------------------------------------

CGROUP_PARENT = "elastic-supervisor-docker"


def docker_cli() -> str:
    """Return the docker client: Debian docker.io's (the daemon's version) before any other."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ImagesError("docker client not found: run make setup (Debian docker.io)")


def dockerd_argv(data_root: Path, run_dir: Path) -> list[str]:
    """Return the dockerd command line: its own socket, exec root, data root and key, no bridge,
    no iptables rules, no ip_forward or masquerading, containers under one cgroup parent."""
    # setpriv: SIGTERM (a clean shutdown) to dockerd if the building process dies.
    return ["setpriv", "--pdeathsig", "TERM", "--",
            "dockerd", f"--data-root={data_root}", f"--exec-root={run_dir / 'exec'}",
            f"--pidfile={run_dir / 'dockerd.pid'}", f"--host=unix://{run_dir / 'docker.sock'}",
            f"--config-file={run_dir / 'daemon.json'}",
            "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
            "--userland-proxy=false", f"--cgroup-parent={CGROUP_PARENT}",
            "--storage-driver=overlay2", "--log-level=warn"]


def _mounts_under(*dirs: Path) -> list[str]:
    # Mount points below dirs, deepest first, from /proc/self/mountinfo (octal escapes decoded).
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\(\d{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
        if any(point == str(d) or point.startswith(f"{d}/") for d in dirs):
            found.append(point)
    return sorted(found, key=len, reverse=True)


class DockerDaemon:
    """A dockerd of the project's own, only for a `with` block: socket and exec root under
    Settings.docker_run_dir, data root under the cache (layers persist between builds). On exit
    it is stopped (SIGTERM, then SIGKILL after the timeout) and what it leaves on the host is
    removed: mounts under its directories, the run directory, its cgroup parent, and the
    /run/docker and /run/containerd/s directories when they were not there before."""

    def __init__(self, settings: Settings, log: Log) -> None:
        self.settings, self.log = settings, log
        self.data_root = settings.cache / "docker"
        self.run_dir = settings.docker_run_dir
        self.logfile = settings.cache / "images" / "dockerd.log"
        self.cli = docker_cli()
        self._proc: subprocess.Popen[bytes] | None = None
        self._absent_before: list[Path] = []

    @property
    def host(self) -> str:
        return f"unix://{self.run_dir / 'docker.sock'}"

    def __enter__(self) -> DockerDaemon:
        if shutil.which("dockerd") is None:
            raise ImagesError("dockerd not found: run make setup (Debian docker.io)")
        if (self.run_dir / "docker.sock").exists():
            raise ImagesError(f"{self.run_dir / 'docker.sock'} exists: another project dockerd "
                              "is running, or one died; stop it or remove the directory")
        self._absent_before = [p for p in (Path("/run/docker/plugins"), Path("/run/docker"),
                                           Path("/run/containerd/s"), Path("/run/containerd"))
                               if not p.exists()]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        # The daemon's ID key: dockerd 20.10 writes /etc/docker/key.json unless told otherwise
        # (only its config file can).
        (self.run_dir / "daemon.json").write_text(
            json.dumps({"deprecated-key-path": str(self.data_root / "key.json")}) + "\n")
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("w") as out:
            self._proc = subprocess.Popen(dockerd_argv(self.data_root, self.run_dir),
                                          stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.settings.docker_start_timeout_s
        while not self._ping():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise ImagesError(f"dockerd did not come up (log {self.logfile}):\n"
                                  f"{_tail(self.logfile)}")
            time.sleep(0.2)
        return self

    def __exit__(self, *_: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(self.settings.docker_stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.log("dockerd ignored SIGTERM: killing it")
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(10)
        self._proc = None
        for point in _mounts_under(self.run_dir, self.data_root):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            with contextlib.suppress(OSError):
                (hierarchy / CGROUP_PARENT).rmdir()
        for path in self._absent_before:  # in order: children first; only if empty
            with contextlib.suppress(OSError):
                path.rmdir()

    def _ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(str(self.run_dir / "docker.sock"))
                s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return b" 200 " in s.recv(64)
        except OSError:
            return False

    def env(self) -> dict[str, str]:
        """Return the docker client's environment: this daemon, the legacy builder (BuildKit
        would try to pull docker/dockerfile for the `# syntax=` lines), no ~/.docker."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0",
                "DOCKER_CONFIG": str(self.run_dir / "client")}

    def docker(self, *args: str, what: str, timeout: float = 600) -> str:
        """Run a docker command against this daemon; return its stdout."""
        return _run([self.cli, *args], what=what, timeout=timeout, env=self.env()).stdout

    def image_id(self, ref: str) -> str | None:
        """Return the ID of an image, or None when the daemon has none by that name."""
        done = subprocess.run([self.cli, "image", "inspect", "-f", "{{.Id}}", ref],
                              capture_output=True, text=True, env=self.env(), check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    def label(self, ref: str, name: str) -> str | None:
        """Return a label of an image, or None when the image or the label is missing."""
        done = subprocess.run([self.cli, "image", "inspect", "-f",
                               f'{{{{index .Config.Labels "{name}"}}}}', ref],
                              capture_output=True, text=True, env=self.env(), check=False)
        value = done.stdout.strip()
        return value if done.returncode == 0 and value not in ("", "<no value>") else None

    def layers(self, ref: str) -> list[str]:
        """Return an image's layer diff IDs, bottom first."""
        return list(json.loads(self.docker("image", "inspect", "-f", "{{json .RootFS.Layers}}",
                                           ref, what=f"inspect {ref}")))

    def build(self, argv: list[str], *, context: Path, logfile: Path) -> None:
        """Run `docker build` (argv from docker_build_argv) in context, its steps logged."""
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with logfile.open("w") as out:
            proc = subprocess.Popen([self.cli, *argv], cwd=context, env=self.env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if line.startswith("Step "):
                    self.log(f"  {line.rstrip()[:150]}")
            code = proc.wait()
        if code != 0:
            raise ImagesError(f"docker {' '.join(argv[:8])} ... failed (exit {code}; log "
                              f"{logfile}):\n{_tail(logfile)}")


def ensure_base_image(docker: DockerDaemon, rootfs: Path, recipe: BaseRecipe, log: Log) -> None:
    """Import the base rootfs as BASE_IMAGE unless the daemon has it for this recipe already
    (a new import would get a new ID and rebuild every layer above it)."""
    if docker.label(BASE_IMAGE, RECIPE_LABEL) == recipe.key:
        log(f"base image present: {BASE_IMAGE}")
        return
    argv = ["import", *[a for c in recipe.docker_changes() for a in ("--change", c)],
            "--message", f"debootstrap --variant={recipe.variant} {recipe.suite}",
            str(rootfs), BASE_IMAGE]
    docker.docker(*argv, what=f"docker import {BASE_IMAGE}")
    log(f"base image imported: {BASE_IMAGE}")


# ---- the whole build -------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Everything the project's images are made from; `key` names their archive's index."""

    names: Names
    base_key: str
    wheelhouse: str  # the wheelhouse directory's name: a digest of its requirements
    tf_wheelhouse: str  # the TensorFlow wheelhouse's (its TensorFlow pin and Horovod wheel)
    context: str  # tree_digest of the build context
    args: tuple[tuple[str, str], ...]  # every build's args, as (tag, name=value)

    @property
    def key(self) -> str:
        return digest(IMAGES_RECIPE_VERSION, self.names.launcher, self.names.worker,
                      self.names.sidecar, self.names.trainer, self.names.training,
                      self.names.trainer_tf, self.base_key, self.wheelhouse,
                      self.tf_wheelhouse, self.context, self.args)[:16]


@dataclass(frozen=True)
class Built:
    """The result of one build: archives by image name, and what the images are made of."""

    tarballs: dict[str, Path]
    image_ids: dict[str, str]
    # Layer diff IDs, bottom first, of every image built, the base and the training stage's.
    layers: dict[str, list[str]]


def archive_name(image_ids: dict[str, str]) -> str:
    """Return the file name of the archive of these images (tag -> image ID): named by a digest
    of every tag and ID, so a saved archive is reused whenever the daemon built the very same
    images under the same tags, and never otherwise."""
    return f"{ARCHIVE_PREFIX}{digest(sorted(image_ids.items()))[:16]}.tar"


def _index_path(settings: Settings, key: str) -> Path:
    return settings.cache / "images" / f"{ARCHIVE_PREFIX}index-{key}.json"


def _cached(settings: Settings, inputs: Inputs) -> Built | None:
    try:
        record = json.loads(_index_path(settings, inputs.key).read_text())
    except (OSError, ValueError):
        return None
    archive = settings.cache / "images" / record["archive"]
    if not archive.exists():
        return None
    return Built({n: archive for n in record["image_ids"]}, record["image_ids"],
                 record["layers"])


def build_images(settings: Settings, log: Log = _stderr) -> Built:
    """Build (or take from the cache) the launcher, worker, trainer, sidecar and TensorFlow
    trainer images, check what they are made of, and return their one archive."""
    pyproject = (settings.root / "pyproject.toml").read_text()
    names = image_names(project_version(pyproject))
    recipe = base_recipe(settings)
    wheelhouse = build_wheelhouse(settings, wheelhouse_requirements(pyproject),
                                  horovod_wheel(settings, log), log)
    tf_version = tf_pin((settings.root / TF_ENV_SCRIPT).read_text())
    tf_wheelhouse = build_wheelhouse(settings, tf_wheelhouse_requirements(tf_version),
                                     horovod_tf_wheel(settings, tf_version, log), log,
                                     directory="wheelhouse-tf")
    patterns = dockerignore_patterns((settings.root / ".dockerignore").read_text())
    files = sorted({*context_files(settings.root, patterns), ".dockerignore",
                    LAUNCHER_DOCKERFILE, WORKER_DOCKERFILE, SIDECAR_DOCKERFILE,
                    TRAINER_TF_DOCKERFILE})
    args = build_args(base_image=BASE_IMAGE, torch_version=torch_pin(pyproject),
                      wheelhouse=wheelhouse_url(settings.wheelhouse_port))
    tf_args = tf_build_args(base_image=BASE_IMAGE, tf_version=tf_version,
                            wheelhouse=wheelhouse_url(settings.wheelhouse_port,
                                                      TF_WHEELHOUSE_PATH))
    steps = build_steps(names, args, tf_args)
    inputs = Inputs(names, recipe.key, wheelhouse.name, tf_wheelhouse.name,
                    tree_digest(settings.root, files),
                    tuple((s.tag, f"{k}={v}") for s in steps for k, v in sorted(s.args.items())))
    if (hit := _cached(settings, inputs)) is not None:
        log(f"images cached: {hit.tarballs[names.launcher]}")
        return hit
    rootfs = build_base_rootfs(settings, recipe, log)
    images_dir = settings.cache / "images"
    with DockerDaemon(settings, log) as docker, \
            WheelhouseServer(wheelhouse, settings.wheelhouse_port,
                             {TF_WHEELHOUSE_PATH: tf_wheelhouse}) as server:
        ensure_base_image(docker, rootfs, recipe, log)
        for step in steps:
            t0 = time.monotonic()
            log(f"docker build {step.tag}")
            docker.build(step.argv(), context=settings.root,
                         logfile=images_dir / "logs" / f"{step.tag.replace(':', '-')}.log")
            log(f"built {step.tag} in {_since(t0)}")
        wheels = sorted({Path(p).name for p in server.served if p.endswith(".whl")})
        if wheels:
            log(f"wheels served to the builds: {len(wheels)}")
        docker.docker("image", "prune", "-f", what="docker image prune")
        layers = {tag: docker.layers(tag) for tag in (names.base, *(s.tag for s in steps))}
        problems = layer_problems(names, layers)
        for image, wanted in forbidden(names).items():
            found = json.loads(docker.docker(*probe_argv(image, wanted),
                                             what=f"the content probe of {image}"))
            if (problem := content_problem(image, found)) is not None:
                problems.append(problem)
        if problems:
            raise ImagesError("; ".join(problems))
        saved = sorted(s.tag for s in steps if s.tag != names.training)
        ids = {tag: docker.image_id(tag) or "" for tag in saved}
        archive = images_dir / archive_name(ids)
        if archive.exists():
            log(f"archive cached: {archive}")
        else:
            t0 = time.monotonic()
            partial = archive.with_name(f".{archive.name}.partial")
            docker.docker("save", "-o", str(partial), *saved, what="docker save", timeout=3600)
            partial.replace(archive)
            log(f"docker save in {_since(t0)} ({archive.stat().st_size >> 20} MiB): {archive}")
    record = {"archive": archive.name, "image_ids": ids, "layers": layers}
    _atomic_write(_index_path(settings, inputs.key), json.dumps(record, indent=1).encode())
    # Only this module's own files: others cache their images in the same directory.
    for prefix in (ARCHIVE_PREFIX, *LEGACY_PREFIXES):
        for old in [*images_dir.glob(f"{prefix}*.json"), *images_dir.glob(f"{prefix}*.tar")]:
            if old.name not in (archive.name, _index_path(settings, inputs.key).name):
                old.unlink()
    return Built({tag: archive for tag in ids}, ids, layers)


def pause(settings: Settings | None = None, log: Log = _stderr) -> tuple[str, Path]:
    """The pause image's name (containerd's sandbox_image) and archive, built once."""
    settings = settings or Settings()
    names = image_names(project_version((settings.root / "pyproject.toml").read_text()))
    return names.pause, build_pause(settings, names.pause, log)


def build(settings: Settings | None = None, log: Log = _stderr) -> dict[str, Path]:
    """Build every image the local cluster runs, or take it from the cache; return image name ->
    tarball path for `ctr -n k8s.io images import`. The launcher, worker, trainer, sidecar and
    TensorFlow trainer share one archive (their common layers once): import each distinct path
    once per node."""
    settings = settings or Settings()
    t0 = time.monotonic()
    with build_lock(settings, log):
        names = image_names(project_version((settings.root / "pyproject.toml").read_text()))
        pause = build_pause(settings, names.pause, log)
        built = build_images(settings, log)
    log(f"images ready in {_since(t0)}")
    return {**built.tarballs, names.pause: pause}
