"""The hook as Python loads it: fresh interpreters with the environment horovodrun forwards.

Checks that the hook's sitecustomize runs the one it hides, leaves unrelated processes alone,
patches the real Horovod 0.28.1 in a training process (every module that imports
`synchronize` gets the wrapped one) and in horovodrun's driver (timed sockets, dead
coordinators skipped, the join gate, hello to the supervisor), and that the driver refuses to
run, with one line and exit 8, when Horovod is another version or a patch target is missing (a
stand-in `horovod` package on PYTHONPATH plays the other version).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.hook import HOOK_DIR
from supervisor.hook.elastic_supervisor_hook import KNOWN_HOSTS_ENV, REFUSED, wire
from supervisor.hook.elastic_supervisor_hook.driver import READ_S, TimedSocket
from supervisor.model import ExitCode

KEY = wire.new_key()
WORKER_ENV = {"HOROVOD_HOSTNAME": "127.0.0.5", "HOROVOD_LOCAL_RANK": "0",
              "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "1"}


def python(code: str, *, pythonpath: list[Path | str], hook: bool = True, port: int = 9,
           extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (),
           key_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ELASTIC_SUPERVISOR_", "HOROVOD_"))}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    if hook:  # the key in the environment, or the job's key file (the manifests' way)
        env.update({"ELASTIC_SUPERVISOR_HOOK_PORT": str(port)})
        if key_file is not None:
            key_file.write_text(KEY.hex())
            env["ELASTIC_SUPERVISOR_HOOK_KEY_FILE"] = str(key_file)
        else:
            env["ELASTIC_SUPERVISOR_HOOK_KEY"] = KEY.hex()
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_hidden_sitecustomize_still_runs(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_RAN'] = '1'\n")
    for hook in (True, False):
        got = python("import os, sys; print(os.environ.get('OTHER_RAN'), "
                     "sys.modules['sitecustomize'].__file__)",
                     pythonpath=[HOOK_DIR, other], hook=hook)
        assert got.returncode == 0, got.stderr
        ran, first = got.stdout.split()
        assert ran == "1" and first == str(HOOK_DIR / "sitecustomize.py")
        assert got.stderr == ""


def test_an_unrelated_process_is_left_alone() -> None:
    code = "import sys, json; print(sorted(type(f).__name__ for f in sys.meta_path))"
    without = python(code, pythonpath=[HOOK_DIR], hook=False)
    with_key = python(code, pythonpath=[HOOK_DIR])
    assert without.returncode == with_key.returncode == 0
    assert "_Finder" not in without.stdout and without.stderr == "" == with_key.stderr
    # With the key it waits for Horovod's modules, and that is all it does.
    assert "_Finder" in with_key.stdout


CHECK_WORKER = """
    import horovod.torch as hvd
    import horovod.torch.functions as functions, horovod.torch.optimizer as optimizer
    import horovod.torch.elastic as elastic, horovod.torch.mpi_ops as mpi_ops
    wrapped = [getattr(f, "__wrapped__", None) is not None for f in (
        hvd.synchronize, functions.synchronize, optimizer.synchronize, mpi_ops.synchronize,
        hvd.init, elastic.init)]
    print(wrapped)
"""


@pytest.mark.parametrize(("extra", "args", "expected"), [
    pytest.param(WORKER_ENV, (), [True] * 6, id="a training process: patched everywhere"),
    pytest.param({**WORKER_ENV, "ELASTIC_SUPERVISOR_HOOK_WORKER": "0"}, (), [False] * 6,
                 id="SUPERVISOR_WORKER_HOOK=false: untouched"),
    pytest.param(WORKER_ENV, ("--multiprocessing-fork",), [False] * 6,
                 id="a multiprocessing child: untouched"),
])
def test_a_training_process_gets_the_wrapped_wait_everywhere(
        extra: dict[str, str], args: tuple[str, ...], expected: list[bool]) -> None:
    got = python(CHECK_WORKER, pythonpath=[HOOK_DIR], extra_env=extra, args=args)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(expected), got.stderr
    assert "elastic-supervisor hook" not in got.stderr


def test_a_process_heartbeats_from_its_first_init_on() -> None:
    """A training process waiting in the first rendezvous of a run (here: real Horovod's
    elastic init asking a rendezvous server that accepts and never answers; on a cluster: a
    member of a fresh horovodrun's world lost there) already heartbeats, inside an init: the
    supervisor sees processes wait there for a member that never comes (the `broken` rule)
    instead of nothing until they abort at the Gloo timeout. The heartbeats used to begin only
    once the first init returned."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as silent:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(30)
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ELASTIC_SUPERVISOR_", "HOROVOD_"))}
        env.update({**WORKER_ENV, "PYTHONPATH": str(HOOK_DIR),
                    "ELASTIC_SUPERVISOR_HOOK_PORT": str(udp.getsockname()[1]),
                    "ELASTIC_SUPERVISOR_HOOK_KEY": KEY.hex(), "ELASTIC_SUPERVISOR_HOOK_RUN": "1",
                    "HOROVOD_GLOO_RENDEZVOUS_PORT": str(silent.getsockname()[1]),
                    "HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "gloo",
                    "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})
        proc = subprocess.Popen(
            [sys.executable, "-c", "import horovod.torch as hvd; hvd.init(); print('returned')"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        beats: list[dict[str, object]] = []
        try:
            while len([b for b in beats if b["in"] == "i"]) < 2:
                body = wire.decode(KEY, udp.recv(wire.MAX_DATAGRAM))
                if body is not None and body["t"] == "hb":
                    beats.append(body)
            running = proc.poll() is None
        finally:
            proc.kill()
            out, err = proc.communicate(timeout=30)
    assert running and "returned" not in out, err
    inside = [b for b in beats if b["in"] == "i"]
    assert [(b["rank"], b["size"], b["inits"], b["host"]) for b in inside] == [
        (None, None, 0, "127.0.0.5")] * 2
    assert 0 < inside[0]["wait"] < inside[1]["wait"]  # type: ignore[operator]


@pytest.mark.parametrize("from_file", [False, True], ids=["key in the environment",
                                                       "key from the job's file"])
def test_horovodruns_driver_is_hardened_and_says_hello(tmp_path: Path, from_file: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(30)
        got = python("""
            import horovod.runner.launch
            from horovod.runner.common.util import network
            from horovod.runner.elastic.driver import ElasticDriver
            import time
            print(network.socket.socket.__name__,
                  hasattr(ElasticDriver.get_worker_client, "__wrapped__")
                  and hasattr(ElasticDriver._update_host_assignments, "__wrapped__")
                  and hasattr(ElasticDriver._handle_worker_exit, "__wrapped__")
                  and hasattr(ElasticDriver._start_worker_processes, "__wrapped__"))
            time.sleep(0.5)  # the hello thread is a daemon
        """, pythonpath=[HOOK_DIR], port=sock.getsockname()[1],
                     key_file=tmp_path / "hook-key" if from_file else None)
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == ["TimedSocket", "True"]
        hello = wire.decode(KEY, sock.recv(wire.MAX_DATAGRAM))
    assert hello is not None and hello["t"] == "driver" and hello["ok"] is True
    assert hello["version"] == "0.28.1"


def test_the_drivers_ssh_checks_the_pinned_host_key(tmp_path: Path) -> None:
    known_hosts = tmp_path / "job secret" / "known_hosts"  # a space: the shell must see one word
    code = """
        import horovod.runner.launch
        from horovod.runner.util.remote import get_remote_command
        print(get_remote_command("true", "10.0.0.1", port=2222))
    """
    unpinned = python(code, pythonpath=[HOOK_DIR])
    assert unpinned.returncode == 0, unpinned.stderr
    assert "-o StrictHostKeyChecking=no" in unpinned.stdout  # Horovod's own: nothing checked
    got = python(code, pythonpath=[HOOK_DIR], extra_env={KNOWN_HOSTS_ENV: str(known_hosts)})
    assert got.returncode == 0, got.stderr
    argv = shlex.split(got.stdout)
    assert argv[:7] == ["ssh", "-o", "PasswordAuthentication=no",
                        "-o", "StrictHostKeyChecking=yes",
                        "-o", f"UserKnownHostsFile={known_hosts}"], argv
    assert "StrictHostKeyChecking=no" not in got.stdout


def stand_in_horovod(root: Path, version: str, *, get_worker_client: bool = True) -> Path:
    """A fake `horovod` package with the modules the driver hook patches."""
    files = {
        "horovod/__init__.py": f"__version__ = {version!r}\n",
        "horovod/runner/__init__.py": "",
        "horovod/runner/common/__init__.py": "",
        "horovod/runner/common/util/__init__.py": "",
        "horovod/runner/common/util/network.py": (
            "import socket\nclass BasicClient:\n    def _send_one(self): pass\n"
            "    def _probe_one(self): pass\n"),
        "horovod/runner/elastic/__init__.py": "",
        "horovod/runner/elastic/driver.py": (
            "from horovod.runner.common.util import network\nclass ElasticDriver:\n"
            + ("    def get_worker_client(self, s): pass\n" if get_worker_client else "")
            + "    def _notify_workers_host_changes(self): pass\n"
            "    def _update_host_assignments(self, hosts): pass\n"
            "    def _handle_worker_exit(self, slot_info, exit_code, timestamp): pass\n"
            "    def has_rank_assignment(self, host, slot): pass\n"
            "    def get_coordinator_info(self): pass\n"),
        "horovod/runner/launch.py": "import horovod.runner.elastic.driver\nprint('ran')\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("version", "has_method", "pin", "why"), [
    pytest.param("0.27.0", True, False, "Horovod 0.27.0 is not 0.28.x",
                 id="another Horovod version"),
    pytest.param("0.28.1", False, False, "horovod.runner.elastic.driver: RuntimeError: "
                 "horovod.runner.elastic.driver.ElasticDriver: get_worker_client",
                 id="a patch target missing"),
    pytest.param("0.28.1", True, True, "horovod.runner.util.remote was not imported before "
                 "horovod.runner.elastic.driver", id="host keys to pin, no ssh prefix to pin"),
])
def test_the_driver_refuses_to_run_unhardened(tmp_path: Path, version: str, has_method: bool,
                                              pin: bool, why: str) -> None:
    fake = stand_in_horovod(tmp_path, version, get_worker_client=has_method)
    got = python("import horovod.runner.launch", pythonpath=[HOOK_DIR, fake],
                 extra_env={KNOWN_HOSTS_ENV: str(tmp_path / "known_hosts")} if pin else None)
    assert got.returncode == REFUSED == ExitCode.HOOK_REFUSED
    assert "ran" not in got.stdout, "nothing of horovodrun ran"
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1, got.stderr
    assert lines[0].startswith("elastic-supervisor hook: refusing to run horovodrun's elastic "
                               "driver unhardened"), lines[0]
    assert why in lines[0]


def test_a_timed_socket_gives_up_on_a_peer_that_accepts_and_never_answers() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # the kernel accepts; nobody reads or answers: a frozen process
        s = TimedSocket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(20)  # what BasicClient._probe_one asks for: overridden
            s.connect(server.getsockname())
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                s.recv(1)
            assert READ_S - 0.1 <= time.monotonic() - t0 <= READ_S + 1
        finally:
            s.close()
