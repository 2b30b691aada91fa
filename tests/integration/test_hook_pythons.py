"""The hook's unit tests under the Pythons of users' images: Debian bullseye's python3 (3.9) and
trixie's (3.13), and the project's own.

The hook runs inside users' training processes, on whatever Python their image has.
tests/integration/hook_unittests.py holds its tests for any python3 >= 3.8 (standard library
only, unittest; fake `horovod` modules stand in for Horovod, which none of these trees has). Each
Debian interpreter is a minimal Debian tree with python3 and python3-psutil that make setup
made (localcluster/pythons.py, cached); the script runs there with chroot inside new mount and
PID namespaces, on a copy of supervisor/hook, so it sees that Python's standard library and
psutil only. Every test of the script must run and pass: none skipped, none missing.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import pythons
from supervisor.hook import HOOK_DIR

SCRIPT = Path(__file__).with_name("hook_unittests.py")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG": "C.UTF-8", "HOME": "/tmp"}


def script_tests() -> int:
    """How many test methods the script's TestCase classes have."""
    tree = ast.parse(SCRIPT.read_text())
    return sum(1 for cls in tree.body if isinstance(cls, ast.ClassDef)
               for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test"))


SUITES = [*pythons.SUITES, "venv"]


def command(suite: str, run: Path) -> tuple[list[str], str, dict[str, str]]:
    """The command that runs the script under `suite`'s python (copying `run` in), the version
    that python must say, its environment."""
    if suite == "venv":
        return ([sys.executable, "-B", str(run / SCRIPT.name), str(run)],
                ".".join(map(str, sys.version_info[:2])),
                {**ENV, "PATH": os.environ.get("PATH", ENV["PATH"])})
    interpreter = {i.suite: i for i in pythons.interpreters()}[suite]
    if not (interpreter.path / "usr/bin/python3").exists():
        pytest.fail(f"no {suite} python3 at {interpreter.path}: run make setup "
                    "(python -m localcluster.pythons)")
    return (pythons.run_argv(interpreter.path, run,
                             ["python3", "-B", f"/tmp/run/{SCRIPT.name}", "/tmp/run"]),
            interpreter.python, ENV)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[dict[str, tuple[str, subprocess.Popen[str]]]]:
    """The script started under every interpreter at once (each takes ~4 s, mostly waiting for
    heartbeats), on a copy of the hook as the supervisor ships it (supervisor/hook) and the
    script: suite -> (the version its python must say, its process)."""
    run = tmp_path_factory.mktemp("hook-pythons") / "run"
    shutil.copytree(HOOK_DIR, run, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SCRIPT, run / SCRIPT.name)
    started = {}
    try:
        for suite in SUITES:
            argv, version, env = command(suite, run)
            started[suite] = (version, subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        yield started
    finally:
        for _, proc in started.values():
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("suite", SUITES)
def test_the_hooks_unit_tests_pass(suite: str,
                                   runs: dict[str, tuple[str, subprocess.Popen[str]]]) -> None:
    version, proc = runs[suite]
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    first = out.splitlines()[0]
    assert first.startswith(f"hook-tests: python {version}."), first
    assert "psutil none" not in first, f"{first}: python3-psutil expected in the tree"
    assert f"Ran {script_tests()} tests" in out, out
    assert out.rstrip().endswith("OK"), out  # not "OK (skipped=1)"
