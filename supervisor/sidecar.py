"""Sidecar mode (SUPERVISOR_MODE=sidecar): the supervisor in a native sidecar of the launcher
pod, horovodrun in the user's own training container, started by `es-run`.

The two containers share a process namespace (spec.shareProcessNamespace) and an emptyDir at
the same path (SUPERVISOR_SHARED_DIR). `elastic-supervisor install DIR` puts there what the
training container runs and loads: the POSIX-sh wrapper `bin/es-run` (supervisor/data/es-run,
which documents the files of `run/` both sides write), the discovery script and the hook.
The workers get the hook alone, from a ConfigMap the supervisor makes of its own copy
(`hookmap.hook_configmap`: a generated name, immutable, owned by the job) and mounts at
SHARED_DIR/hook: no init container to run before sshd, and the hook is the supervisor's own.

PURE: what a launcher pod must have (`pod_problems`), the launch file es-run sources
(`launch_script`); the hook's ConfigMap and the worker template with it added are hookmap.py's.
ADAPTER: `install`, `Link` (the files of `run/`) and `RemoteChild`, horovodrun as the loop sees
it (horovodrun.ChildProcess) when it is not our child: it is started, signalled and killed
through the shared process namespace, and its exit comes from es-run.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from supervisor import discovery
from supervisor.hook import HOOK_DIR
from supervisor.proc import TREE_MARKER, alive, kill_rounds

MODE_ENV = "SUPERVISOR_MODE"
WRAPPER = "bin/es-run"
RUN = "run"
POLL_S = 0.05
WRAPPER_SOURCE = Path(__file__).resolve().parent / "data" / "es-run"


def hook_dir(shared: Path) -> Path:
    return shared / "hook"


def wrapper(shared: Path) -> Path:
    return shared / WRAPPER


def discovery_script(shared: Path) -> Path:
    return shared / "discover_hosts.sh"


# ---- install ---------------------------------------------------------------------------------


def hook_sources() -> dict[str, Path]:
    """The hook's files, by their path under the hook directory: sitecustomize.py and the
    modules of the elastic_supervisor_hook package."""
    package = HOOK_DIR / "elastic_supervisor_hook"
    return {"sitecustomize.py": HOOK_DIR / "sitecustomize.py",
            **{f"{package.name}/{src.name}": src for src in sorted(package.glob("*.py"))}}


def install(dest: Path, discovery_source: Path) -> list[Path]:
    """Copy the wrapper, the discovery script and the hook into `dest` (each file replaced
    atomically: a container may be reading the old one); return what was written. OSError when
    `dest` cannot be written."""
    files: list[tuple[Path, Path, int]] = [
        (WRAPPER_SOURCE, wrapper(dest), 0o755),
        (discovery_source, discovery_script(dest), 0o755),
    ]
    files += [(src, hook_dir(dest) / rel, 0o644) for rel, src in hook_sources().items()]
    for src, target, mode in files:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(src, partial)
        partial.chmod(mode)
        partial.replace(target)
    # Both containers write here, whatever users they run as (only the pod's containers can
    # reach the emptyDir).
    (dest / RUN).mkdir(exist_ok=True)
    (dest / RUN).chmod(0o777)
    return [t for _, t, _ in files]


# ---- the launcher pod: pure ------------------------------------------------------------------


@dataclass(frozen=True)
class Sidecar:
    """What the supervisor learned of its own pod: its container, image and the volume shared
    with the training container (named `wrapped`)."""

    container: str
    image: str
    pull_policy: str | None
    volume: str
    wrapped: str


def _mounts(container: Mapping[str, Any]) -> dict[str, str]:
    """mountPath -> volume name."""
    return {str(m.get("mountPath", "")).rstrip("/") or "/": str(m.get("name"))
            for m in container.get("volumeMounts") or ()}


def _is_supervisor(container: Mapping[str, Any]) -> bool:
    return any(e.get("name") == MODE_ENV and e.get("value") == "sidecar"
               for e in container.get("env") or ())


def pod_problems(pod: Mapping[str, Any], shared: Path) -> tuple[list[str], Sidecar | None]:
    """Check the launcher pod `pod` (as read from the API) for sidecar mode; return (one line
    per problem, naming the fix; what was found when there is none)."""
    name = pod.get("metadata", {}).get("name", "?")
    spec = pod.get("spec") or {}
    where = f"launcher pod {name}"
    problems = []
    if not spec.get("shareProcessNamespace"):
        problems.append(f"{MODE_ENV}=sidecar: {where} has no spec.shareProcessNamespace: true; "
                        "set it, so that the supervisor can see, signal and reap horovodrun in "
                        "the training container")
    inits = spec.get("initContainers") or []
    containers = spec.get("containers") or []
    mine = [c for c in [*inits, *containers] if _is_supervisor(c)]
    if len(mine) != 1:
        problems.append(f"{MODE_ENV}=sidecar: {where}: expected exactly one container with env "
                        f"{MODE_ENV}=sidecar (set as a value, not through envFrom), found "
                        f"{len(mine)}")
        return problems, None
    me = mine[0]
    if me not in inits or me.get("restartPolicy") != "Always":
        problems.append(f"{MODE_ENV}=sidecar: container {me.get('name')} of {where} is not a "
                        "native sidecar; put it in initContainers with restartPolicy: Always "
                        "(Kubernetes 1.29 or later)")
    key = str(shared).rstrip("/") or "/"
    volume = _mounts(me).get(key)
    if volume is None:
        problems.append(f"SUPERVISOR_SHARED_DIR={str(shared)!r}: not mounted in container "
                        f"{me.get('name')} of {where}; mount an emptyDir there, in it and in "
                        "the training container")
    runner = str(wrapper(shared))
    wrapped = [c for c in containers
               if runner in [*(c.get("command") or ()), *(c.get("args") or ())]]
    if not wrapped:
        problems.append(f"{MODE_ENV}=sidecar: no container of {where} runs {runner}; start the "
                        f"training container with command: [{runner}] and the training "
                        "command as its args")
    elif volume is not None and (got := _mounts(wrapped[0]).get(key)) != volume:
        problems.append(f"SUPERVISOR_SHARED_DIR={str(shared)!r}: container "
                        f"{wrapped[0].get('name')} of {where} runs {runner} but "
                        + ("does not mount it" if got is None else f"mounts volume {got} there")
                        + f"; mount volume {volume} at {shared} in it too")
    if problems:
        return problems, None
    return [], Sidecar(container=str(me.get("name")), image=str(me.get("image")),
                       pull_policy=me.get("imagePullPolicy"), volume=str(volume),
                       wrapped=str(wrapped[0].get("name")))


def launch_script(gen: int, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The file es-run sources to start horovodrun: the generation first, then the variables
    (PYTHONPATH put before the training container's own), then the argv. Every value is
    quoted: nothing is interpreted by the shell."""
    lines = [f"ES_GEN={gen}"]
    for key, value in sorted(env.items()):
        if key == "PYTHONPATH":
            lines.append(f'export PYTHONPATH={shlex.quote(value)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
        else:
            lines.append(f"export {key}={shlex.quote(value)}")
    lines.append("set -- " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def parse_gen(text: str) -> int:
    """The generation of a launch file (0: none)."""
    first = text.split("\n", 1)[0]
    value = first.removeprefix("ES_GEN=")
    return int(value) if value != first and value.isdigit() else 0


def parse_pair(text: str) -> tuple[int, int] | None:
    """'<gen> <number>' (es-run's pid and exit files) or None."""
    words = text.split()
    if len(words) != 2 or not all(w.lstrip("-").isdigit() for w in words):
        return None
    return int(words[0]), int(words[1])


def launch_env(launch: str) -> dict[str, str]:
    """The variables a launch file exports (PYTHONPATH as written, unexpanded)."""
    env = {}
    for line in launch.splitlines():
        if line.startswith("export "):
            with contextlib.suppress(ValueError):
                words = shlex.split(line[len("export "):])
                if len(words) == 1 and "=" in words[0]:
                    key, value = words[0].split("=", 1)
                    env[key] = value
    return env


@dataclass(frozen=True)
class Running:
    """A horovodrun that es-run ran for an earlier supervisor of this pod: its launch
    generation, pid, the variables it was given, and the exit code es-run recorded for it
    (None while it runs)."""

    gen: int
    pid: int
    env: Mapping[str, str]
    code: int | None = None

    @property
    def marker(self) -> str | None:
        return self.env.get(TREE_MARKER)


# ---- the shared directory: adapter -----------------------------------------------------------


class Link:
    """The files of `<shared>/run`, as the supervisor reads and writes them."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared
        self.dir = shared / RUN

    def _read(self, name: str) -> str | None:
        try:
            return (self.dir / name).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def _write(self, name: str, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        discovery.write_atomic(self.dir / name, text)

    def announce(self) -> None:
        """Tell es-run a supervisor runs (it gives up after a while without one)."""
        self._write("supervisor", f"{os.getpid()}\n")

    def stopped(self) -> int | None:
        """The job's exit code, if a supervisor of this pod decided it already."""
        text = self._read("stop")
        return int(text) if text is not None and text.strip().isdigit() else None

    def stop(self, code: int) -> None:
        self._write("stop", f"{code}\n")

    def command(self) -> list[str] | None:
        """The training command es-run was given, once it wrote it."""
        raw = self._read("command")
        if raw is None or not raw.endswith("\0"):
            return None
        return raw[:-1].split("\0")

    def wrapper_alive(self) -> bool:
        text = self._read("wrapper")
        return text is not None and text.strip().isdigit() and psutil.pid_exists(int(text))

    def gen(self) -> int:
        return parse_gen(self._read("launch") or "")

    def launch(self, gen: int, argv: Sequence[str], env: Mapping[str, str]) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "exit").unlink()
        self._write("launch", launch_script(gen, argv, env))

    def pid(self, gen: int) -> int | None:
        pair = parse_pair(self._read("pid") or "")
        return pair[1] if pair is not None and pair[0] == gen else None

    def exit_code(self, gen: int) -> int | None:
        pair = parse_pair(self._read("exit") or "")
        return pair[1] if pair is not None and pair[0] == gen else None

    def take_signal(self) -> int | None:
        """A signal es-run got (and passed on through this file), once."""
        text = self._read("signal")
        if text is None:
            return None
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "signal").unlink()
        return int(text) if text.strip().isdigit() else None

    def running(self) -> Running | None:
        """The horovodrun an earlier supervisor of this pod had es-run start, if it still runs
        or es-run recorded its exit (`Running.code`): a supervisor that died between that exit
        and the `stop` it would have written left the job's outcome there."""
        text = self._read("launch") or ""
        gen = parse_gen(text)
        pid = self.pid(gen) if gen else None
        if pid is None:
            return None
        if (code := self.exit_code(gen)) is not None:
            return Running(gen, pid, launch_env(text), code)
        return Running(gen, pid, launch_env(text)) if psutil.pid_exists(pid) else None


def wait_for_command(link: Link, *, stopping: Callable[[float], bool],
                     timeout_s: float) -> list[str] | None:
    """Wait for es-run's training command; None after `timeout_s` (or when `stopping(wait)`
    says a stop signal came)."""
    end = time.monotonic() + timeout_s
    while (command := link.command()) is None:
        if time.monotonic() >= end or stopping(0.1):
            return None
    return command


# ---- horovodrun in the training container ----------------------------------------------------


def _marked(p: psutil.Process, marker: str) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return p.environ().get(TREE_MARKER) == marker
    return False


def owned(pid: int, marker: str | None) -> bool:
    """Whether process `pid` (read from the run directory, which the training container can
    write) is a horovodrun es-run started for a supervisor: it carries the run's marker, and
    it is not this process."""
    if not marker or pid == os.getpid():
        return False
    with contextlib.suppress(psutil.NoSuchProcess):
        return _marked(psutil.Process(pid), marker)
    return False


def _tree(pid: int | None, marker: str | None, *, orphans: bool = True
          ) -> list[psutil.Process]:
    """horovodrun's process (`pid`; None once it exited: the pid may be another's now), its
    descendants, and the processes carrying the tree's marker that were orphaned (re-parented
    to the pod's pause process).

    `pid` and `marker` come from the run directory, which the training container can write: the
    process `pid` counts (with its descendants) only if it carries the marker, so that a pid
    written there never gets the supervisor, the pod's pause or anything else killed."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        if pid is not None and owned(pid, marker):
            root = psutil.Process(pid)
            found[pid] = root
            for p in root.children(recursive=True):
                found[p.pid] = p
    if marker and orphans:
        for p in psutil.process_iter():
            if p.pid in found:
                continue
            if _marked(p, marker):
                found[p.pid] = p
    return list(found.values())


def kill_tree(pid: int | None, marker: str | None, rounds: int = 3) -> int:
    """SIGKILL horovodrun `pid` and its tree; return how many processes got it."""
    def dead(procs: list[psutil.Process]) -> None:
        # Not our children: wait until they are dead (zombies, which their parents reap).
        end = time.monotonic() + 2
        while any(alive(p) for p in procs) and time.monotonic() < end:
            time.sleep(0.02)
    return kill_rounds(lambda: _tree(pid, marker), dead, rounds)


def holder_gone(holder: str, instance: str) -> bool:
    """Whether the leader Lease's holder `holder` ("<instance>/<pid>") is a supervisor process
    of this pod (`instance`) that no longer runs: in sidecar mode the pod's processes share one
    namespace, so its pid is ours to look at. (A pid reused since reads as alive: we wait.)"""
    name, _, pid = holder.rpartition("/")
    return (name == instance and pid.isdigit() and int(pid) != os.getpid()
            and not psutil.pid_exists(int(pid)))


class WrapperGone(Exception):
    """es-run is not running (the training container ended or never ran it)."""


@dataclass
class RemoteChild:
    """horovodrun started by es-run for the supervisor (horovodrun.ChildProcess)."""

    link: Link
    gen: int
    pid: int
    token: str

    @classmethod
    def start(cls, link: Link, argv: Sequence[str], env: Mapping[str, str], *,
              timeout_s: float = 30.0) -> RemoteChild:
        """Hand es-run the next launch and wait until it runs it; raise WrapperGone when es-run
        does not take it within `timeout_s`."""
        token = uuid.uuid4().hex
        gen = link.gen() + 1
        link.launch(gen, argv, {**env, TREE_MARKER: token})
        end = time.monotonic() + timeout_s
        while (pid := link.pid(gen)) is None:
            if not link.wrapper_alive():
                raise WrapperGone("es-run is not running: the training container ended")
            if time.monotonic() >= end:
                raise WrapperGone(f"es-run took no launch within {timeout_s:g}s (is the "
                                  "training container running it?)")
            time.sleep(POLL_S)
        return cls(link, gen, pid, token)

    @classmethod
    def adopt(cls, link: Link, running: Running) -> RemoteChild:
        """The horovodrun an earlier supervisor of this pod started, as this one's."""
        return cls(link, running.gen, running.pid, running.marker or "")

    def poll(self) -> int | None:
        code = self.link.exit_code(self.gen)
        if code is None and not self.link.wrapper_alive():
            return 128 + signal.SIGKILL  # the training container died with it
        return code

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"horovodrun (pid {self.pid}) still runs")
            time.sleep(POLL_S)
        return code

    def signal_group(self, sig: int) -> None:
        """Send `sig` to horovodrun and its descendants (es-run starts it in its own process
        group only where the shell has job control: the processes are signalled one by one)."""
        for p in _tree(self.pid, self.token, orphans=False):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                p.send_signal(sig)

    def kill_tree(self, rounds: int = 3) -> int:
        # Once es-run recorded the exit, the pid is free for another process: only the marker.
        exited = self.link.exit_code(self.gen) is not None
        killed = kill_tree(None if exited else self.pid, self.token, rounds)
        with contextlib.suppress(TimeoutError):
            self.wait(5)
        return killed

    def reap(self) -> list[int]:
        return []  # not our children: es-run and the pod's pause process reap them
