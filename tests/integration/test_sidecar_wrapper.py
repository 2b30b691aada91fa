"""es-run (supervisor/data/es-run) and the supervisor's side of it (supervisor.sidecar), as real
processes: the wrapper under dash, bash and busybox sh, started the way a training container
starts it, and driven by the very Link and RemoteChild the supervisor uses in sidecar mode.
No cluster: the shared emptyDir is a temporary directory and the shared process namespace is
this machine's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor import sidecar
from supervisor.config import packaged_discovery_script

SHELLS = [s for s in (["dash"], ["bash"], ["busybox", "sh"]) if shutil.which(s[0])]


@pytest.fixture(params=SHELLS, ids=lambda s: s[0])
def shell(request: pytest.FixtureRequest) -> list[str]:
    return list(request.param)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    dest = tmp_path / "es"
    sidecar.install(dest, packaged_discovery_script())
    return dest


class Wrapper:
    """es-run started as a training container's entrypoint, with `command` as its args."""

    def __init__(self, shell: list[str], shared: Path, command: list[str],
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([*shell, str(sidecar.wrapper(shared)), *command],
                                     env={**os.environ, "PYTHONPATH": "/users/own",
                                          **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.link = sidecar.Link(shared)

    def exited(self, timeout: float = 10) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def wrappers() -> Iterator[list[Wrapper]]:
    made: list[Wrapper] = []
    yield made
    for w in made:
        w.kill()


def until(what: str, check: object, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start(shell: list[str], shared: Path, wrappers: list[Wrapper], command: list[str],
          **env: str) -> Wrapper:
    link = sidecar.Link(shared)
    link.announce()
    w = Wrapper(shell, shared, command, env)
    wrappers.append(w)
    until("es-run's command", lambda: link.command() is not None)
    return w


TRICKY = ["it's", "a $HOME `x`", "", "two\nlines", "--np=2"]


def test_the_command_and_the_launch_pass_every_word_unchanged(
        shell: list[str], shared: Path, wrappers: list[Wrapper], tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = 'printf "%s|" "$@" >"$OUT"; printf "%s" "$PYTHONPATH" >"$OUT.env"; exit 3'
    w = start(shell, shared, wrappers, ["-c", script, "sh", *TRICKY])
    assert w.link.command() == ["-c", script, "sh", *TRICKY]
    child = sidecar.RemoteChild.start(w.link, ["sh", *w.link.command()],  # type: ignore[misc]
                                      {"OUT": str(out), "PYTHONPATH": "/opt/hook"})
    assert child.wait(10) == 3
    assert out.read_text() == "|".join(TRICKY) + "|"
    # The hook first, then the training container's own PYTHONPATH.
    assert Path(f"{out}.env").read_text() == "/opt/hook:/users/own"
    w.link.stop(0)
    assert w.exited() == (0, "")


def test_a_restart_is_a_new_launch_and_the_job_code_is_the_supervisors(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = start(shell, shared, wrappers, ["-c", "exit $((CODE))"])
    first = sidecar.RemoteChild.start(w.link, ["sh", "-c", "exit $((CODE))"], {"CODE": "1"})
    assert first.wait(10) == 1
    second = sidecar.RemoteChild.start(w.link, ["sh", "-c", "exit $((CODE))"], {"CODE": "0"})
    assert (second.gen, second.wait(10)) == (first.gen + 1, 0)
    assert second.pid != first.pid
    w.link.stop(6)  # e.g. too few workers left for MIN_NP
    assert w.exited()[0] == 6


def test_kill_tree_reaches_the_grandchildren(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = start(shell, shared, wrappers, ["true"])
    # Durations of this test's own: another run of the suite on the machine sleeps too.
    a, b, c = (str(300 + os.getpid() % 10_000 * 3 + i) for i in range(3))
    child = sidecar.RemoteChild.start(
        w.link, ["sh", "-c", f"sleep {a} & (sleep {b} &) ; sleep {c}; exit 0"], {})
    until("the tree", lambda: len(psutil.Process(child.pid).children(recursive=True)) >= 2)
    tree = {p.pid for p in psutil.Process(child.pid).children(recursive=True)}
    # the orphan (its subshell exited) is found by the marker
    orphans = {p.pid for p in psutil.process_iter(["cmdline"])
               if p.info["cmdline"] == ["sleep", b]}
    assert orphans
    assert child.kill_tree() >= 3
    assert child.wait(5) == 128 + signal.SIGKILL
    for pid in tree | orphans:
        until(f"pid {pid} gone", lambda pid=pid: not _alive(pid))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_pods_sigterm_goes_to_the_supervisor_which_forwards_it(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = start(shell, shared, wrappers, ["true"])
    child = sidecar.RemoteChild.start(
        w.link, ["sh", "-c", "trap 'exit 42' TERM; while :; do sleep 0.05; done"], {})
    time.sleep(0.3)
    w.proc.send_signal(signal.SIGTERM)  # the kubelet stops the training container
    until("the signal file", (w.link.dir / "signal").exists)
    assert w.link.take_signal() == signal.SIGTERM and w.link.take_signal() is None
    assert child.poll() is None  # es-run left horovodrun to the supervisor
    child.signal_group(signal.SIGTERM)
    assert child.wait(10) == 42
    w.link.stop(143)
    assert w.exited()[0] == 143


def test_without_a_supervisor_es_run_gives_up_and_says_why(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = Wrapper(shell, shared, ["true"], {"ES_RUN_ORPHAN_SECONDS": "1"})
    wrappers.append(w)
    code, err = w.exited(timeout=15)
    assert code == 3
    assert "no elastic-supervisor running in this pod for 1s" in err


def test_a_job_ended_before_es_run_started_ends_it_at_once(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    link = sidecar.Link(shared)
    link.stop(2)  # the supervisor found bad configuration and said so first
    w = Wrapper(shell, shared, ["true"])
    wrappers.append(w)
    assert w.exited()[0] == 2


def test_no_command_is_bad_input(shell: list[str], shared: Path) -> None:
    got = subprocess.run([*shell, str(sidecar.wrapper(shared))], capture_output=True,
                         text=True, timeout=10, check=False)
    assert got.returncode == 2
    assert got.stderr.startswith("es-run: no training command: use it as command: [")


def test_a_dead_wrapper_is_a_killed_horovodrun(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = start(shell, shared, wrappers, ["true"])
    child = sidecar.RemoteChild.start(w.link, ["sleep", "300"], {})
    w.proc.kill()  # the training container was OOM-killed with everything in it
    w.proc.wait()
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(5) == 128 + signal.SIGKILL
    t0 = time.monotonic()
    with pytest.raises(sidecar.WrapperGone, match="es-run is not running"):
        sidecar.RemoteChild.start(w.link, ["true"], {})
    assert time.monotonic() - t0 < 1, "said at once, not after the timeout"


def test_a_supervisor_started_again_finds_the_run_it_did_not_start(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    w = start(shell, shared, wrappers, ["true"])
    child = sidecar.RemoteChild.start(w.link, ["sh", "-c", "sleep 300"], {})
    running = sidecar.Link(shared).running()
    assert running is not None and (running.gen, running.pid, running.marker) == (
        child.gen, child.pid, child.token)
    adopted = sidecar.RemoteChild.adopt(sidecar.Link(shared), running)
    assert (adopted.gen, adopted.pid, adopted.token) == (child.gen, child.pid, child.token)
    assert adopted.kill_tree() >= 1
    assert adopted.wait(5) == 128 + signal.SIGKILL
    ended = sidecar.Link(shared).running()  # its exit, for a supervisor started after it
    assert ended is not None and (ended.gen, ended.code) == (child.gen, 128 + signal.SIGKILL)
    nxt = sidecar.RemoteChild.start(w.link, ["true"], {})
    assert (nxt.gen, nxt.wait(5)) == (child.gen + 1, 0)


def test_install_is_idempotent_and_complete(tmp_path: Path) -> None:
    dest = tmp_path / "es"
    first = sidecar.install(dest, packaged_discovery_script())
    again = sidecar.install(dest, packaged_discovery_script())
    assert first == again
    assert os.access(sidecar.wrapper(dest), os.X_OK)
    assert os.access(sidecar.discovery_script(dest), os.X_OK)
    hook = sidecar.hook_dir(dest)
    # The hook loads from the copy alone (no supervisor package on the path).
    got = subprocess.run([sys.executable, "-S", "-c",
                          "import elastic_supervisor_hook, sys; print(elastic_supervisor_hook"
                          ".__file__)"], env={"PYTHONPATH": str(hook)}, capture_output=True,
                         text=True, check=True, cwd=tmp_path)
    assert got.stdout.strip().startswith(str(hook))


def test_a_pid_written_into_the_run_directory_that_is_not_the_runs_is_never_killed(
        shell: list[str], shared: Path, wrappers: list[Wrapper]) -> None:
    """The training container can write the run directory: a pid there (ours, the pod's
    pause, any other process) is signalled only if it carries the run's marker."""
    w = start(shell, shared, wrappers, ["true"])
    child = sidecar.RemoteChild.start(w.link, ["sh", "-c", "sleep 300"], {})
    assert sidecar.owned(child.pid, child.token)
    bystander = subprocess.Popen(["sleep", "303"])
    try:
        link = sidecar.Link(shared)
        link._write("pid", f"{child.gen} {bystander.pid}\n")  # as the training container can
        forged = link.running()
        assert forged is not None and forged.pid == bystander.pid
        assert not sidecar.owned(forged.pid, forged.marker)
        assert not sidecar.owned(os.getpid(), forged.marker), "never the supervisor itself"
        sidecar.RemoteChild.adopt(link, forged).signal_group(signal.SIGKILL)
        # the run's own processes are still found by their marker
        assert sidecar.kill_tree(forged.pid, forged.marker) >= 1
        time.sleep(0.2)
        assert bystander.poll() is None, "the bystander was signalled"
    finally:
        bystander.kill()
        bystander.wait()
