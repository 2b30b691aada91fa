"""decide/'s import contract (scripts/layers.py, run by `make lint`): it holds on this tree, and
it fails, naming the file, the line and the chain, on deliberate violations: a direct import of
what does I/O, an adapter reached through a pure-looking module, a call of the wall clock; an
import only for annotations (under TYPE_CHECKING) does not count."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from scripts import layers

ROOT = Path(__file__).resolve().parents[2]


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_contract_holds_on_this_tree() -> None:
    assert layers.violations(ROOT) == []


def test_each_kind_of_violation_is_one_line_with_its_chain(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "supervisor/__init__.py": "",
        "supervisor/channel.py": "import socket\n",
        "supervisor/shared.py": "from supervisor.channel import X\n",
        "supervisor/pure.py": "import re\n",
        "supervisor/decide/__init__.py": "",
        "supervisor/decide/a.py": "from supervisor import shared, pure\n",
        "supervisor/decide/b.py": "def f():\n    import os\n    return os\n",
        "supervisor/decide/c.py": ("import datetime\n\n\ndef g():\n"
                                   "    return datetime.datetime.now()\n"),
        "supervisor/decide/d.py": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                   "    from supervisor.kube import Api\n"),
        "supervisor/decide/e.py": "from . import a\n",
    })
    assert layers.violations(root) == [
        "supervisor/decide/b.py:2: supervisor.decide.b imports os: decide/ does no I/O, reads "
        "no clock and runs no thread (scripts/layers.py)",
        "supervisor/decide/c.py:5: supervisor.decide.c calls .now(): decide/ reads no clock and "
        "opens no file (scripts/layers.py)",
        "supervisor/shared.py:1: supervisor.decide.a -> supervisor.shared imports "
        "supervisor.channel, an adapter (supervisor.channel): decide/ imports no adapter "
        "(scripts/layers.py)",
    ]


def test_make_lint_fails_on_a_thread_imported_into_the_real_decide(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "supervisor", tmp_path / "supervisor",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    hang = tmp_path / "supervisor/decide/hang.py"
    hang.write_text(hang.read_text() + "\nimport threading  # a deliberate violation\n")
    done = subprocess.run([sys.executable, str(ROOT / "scripts/layers.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "supervisor/decide/hang.py" in done.stderr and "imports threading" in done.stderr
    assert done.stderr.strip().endswith("1 violation(s) of decide/'s import contract")
    clean = subprocess.run([sys.executable, str(ROOT / "scripts/layers.py"), str(ROOT)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert (clean.returncode, clean.stderr) == (0, "")
