"""bench/results.json: where every measured number lands, and who wrote it.

Owns reading and writing the file and the provenance each block carries (when, the commit, the
machine). The writers are `make bench` (bench/__main__.py: the benchmarks' blocks),
`python -m bench.suite` (`suite`: the test suite timed) and `make demo` (`demo`: the demo's
table); each replaces only its own blocks and keeps the others'. Nothing here measures, and no
number is written here that a caller did not measure.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results.json"


def load(path: Path = RESULTS) -> dict[str, Any]:
    """The stored blocks ({} when there is no file yet)."""
    return json.loads(path.read_text()) if path.exists() else {}


def write(results: Mapping[str, Any], path: Path = RESULTS) -> Path:
    """Write all blocks at once (a reader never sees half a file); return the path."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)
    return path


def record(blocks: Mapping[str, Any], path: Path = RESULTS) -> Path:
    """Replace `blocks` in the file, keep every other block as stored; return the path."""
    return write({**load(path), **blocks}, path)


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def commit(repo: Path = REPO) -> str | None:
    """HEAD's short hash, with "-dirty" when the work tree differs from it (None outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict[str, object]:
    """The machine a number was measured on: CPUs, their model, memory, Python, kernel."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem, 1),
            "python": platform.python_version(), "kernel": platform.release()}


def provenance(repo: Path = REPO) -> dict[str, Any]:
    """When, at which commit (of `repo`) and on which machine a block was measured."""
    return {"when": now(), "commit": commit(repo), "machine": machine()}
