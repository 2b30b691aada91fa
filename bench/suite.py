"""`python -m bench.suite [--ci | --ci-only]`: time the test suite, record it in results.json.

Runs `make test` in this checkout as it is (its caches as they are) and records, in the `suite`
block's `make_test`: the wall time, make's exit code, the passed/failed/error/skipped counts
summed over the pytest runs of its phases (each phase's counts and seconds as pytest printed
them), the date, the commit and the machine, and the machine's busy CPU time meanwhile
(`busy_core_s`, from /proc/stat, and `cpu_share` of all its cores: on two cores a suite whose
busy time is B core-seconds takes at least B / 2 seconds however its lanes are laid out). With
`--ci` it then clones HEAD into a temporary directory and runs `.ci/run` there (setup, then
`make test`) with empty caches (ES_CACHE, GOCACHE and GOMODCACHE point at new empty
directories, removed afterwards), recorded as `ci_empty_cache`; `--ci-only` runs only that. A
sub-block not run keeps its stored value. Not part of `make test` (it runs it); each run's
output is kept in a log file whose path is recorded.

The same `make test` also fills the `false_verdicts` block: every job on real nodes appends its
Hung and stuck verdicts and quarantines, and those that named a pod or node the test had not
silenced (tests/e2e/jobs.py false_verdicts), to the file ES_VERDICTS_FILE names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import store
from tests.cpu import TIMES_ENV, busy_core_s

KEY = "suite"
VERDICTS_KEY = "false_verdicts"
# pytest's last line: "==== 3 failed, 886 passed, 2 skipped, 1 warning in 26.51s (0:00:26) ===="
SUMMARY = re.compile(r"^=+ (?P<counts>\d+ \w+.*?) in (?P<seconds>[\d.]+)s\b.* =+$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
TOTALS = ("passed", "failed", "errors", "skipped")


def phases(output: str) -> list[dict[str, Any]]:
    """Each pytest run's counts and seconds, in order, from the summary lines of `output`."""
    found = []
    for line in output.splitlines():
        m = SUMMARY.match(line.strip())
        if m:
            counts = {("errors" if k == "error" else k): int(n)
                      for n, k in COUNT.findall(m["counts"])}
            found.append({**counts, "seconds": float(m["seconds"])})
    return found


def totals(runs: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(r.get(k, 0) for r in runs) for k in TOTALS}


def timed(command: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None
          ) -> dict[str, Any]:
    """Run `command`, its output shown and kept in `log`; return what was measured."""
    started = store.provenance(cwd)
    t0, busy0 = time.monotonic(), busy_core_s()
    lines = []
    with log.open("w") as f, subprocess.Popen(command, cwd=cwd, env=env, text=True,
                                              stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
            lines.append(line)
    runs = phases("".join(lines))
    wall, busy1 = time.monotonic() - t0, busy_core_s()
    busy = None if busy0 is None or busy1 is None else round(busy1 - busy0, 1)
    return {**started, "command": " ".join(command), "wall_s": round(wall, 1),
            "exit_code": proc.returncode, **totals(runs), "phases": runs,
            "busy_core_s": busy,
            "cpu_share": None if busy is None else round(busy / wall / (os.cpu_count() or 1), 3),
            "log": str(log)}


def make_test(out: Path, verdicts: Path) -> dict[str, Any]:
    times = out / "test-times.jsonl"
    env = {**os.environ, "ES_VERDICTS_FILE": str(verdicts), TIMES_ENV: str(times)}
    run = timed(["make", "test"], store.REPO, out / "make-test.log", env)
    return {**run, "slowest_files": by_file(times)}


def by_file(times: Path, top: int = 12) -> list[dict[str, Any]]:
    """The test files that took longest (their tests' wall seconds summed, setup and teardown
    in), with the machine's busy core-seconds meanwhile, from tests/cpu.py's lines; the lanes
    that run side by side both count the seconds they shared."""
    files: dict[str, dict[str, Any]] = {}
    lines = times.read_text().splitlines() if times.exists() else []
    for line in lines:
        t = json.loads(line)
        f = files.setdefault(t["test"].split("::")[0], {"tests": 0, "wall_s": 0.0, "core_s": 0.0})
        f["tests"] += 1
        f["wall_s"] += t["wall_s"]
        f["core_s"] += t["core_s"]
    slow = sorted(files.items(), key=lambda kv: -kv[1]["wall_s"])[:top]
    return [{"file": name, "tests": f["tests"], "wall_s": round(f["wall_s"], 1),
             "core_s": round(f["core_s"], 1)} for name, f in slow]


def false_verdicts(verdicts: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The `false_verdicts` block from the jobs' lines of one `make test`."""
    jobs = [json.loads(line) for line in verdicts.read_text().splitlines()] \
        if verdicts.exists() else []
    given: dict[str, int] = {}
    for job in jobs:
        for event, n in job["verdicts"].items():
            given[event] = given.get(event, 0) + n
    return {"hung": sum(j["false_hung"] for j in jobs),
            "quarantine": sum(j["false_quarantine"] for j in jobs),
            "slow": sum(j.get("false_slow", 0) for j in jobs),
            "verdicts": given, "jobs": len(jobs), "false": [f for j in jobs for f in j["false"]],
            "ran": "make test: every job on real nodes (tests/e2e; the demo: its own block)",
            **{k: run[k] for k in ("commit", "date", "exit_code") if k in run}}


def ci_empty_cache(out: Path) -> dict[str, Any]:
    """`.ci/run` in a clean clone of HEAD with empty caches (all removed afterwards)."""
    scratch = Path(tempfile.mkdtemp(prefix="suite-ci-"))
    try:
        clone = scratch / "repo"
        subprocess.run(["git", "clone", "--quiet", str(store.REPO), str(clone)], check=True)
        caches = {name: scratch / name.lower() for name in ("ES_CACHE", "GOCACHE", "GOMODCACHE")}
        for path in caches.values():
            path.mkdir()
        env = {**os.environ, **{name: str(path) for name, path in caches.items()}}
        return timed([str(clone / ".ci" / "run")], clone, out / "ci-run.log", env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--ci", action="store_true",
                       help="also run .ci/run in a clean clone with empty caches (~70 min)")
    which.add_argument("--ci-only", action="store_true",
                       help="only that clean-clone run; make_test and false_verdicts keep "
                            "their stored values")
    args = parser.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    measured: dict[str, dict[str, Any]] = {}
    blocks: dict[str, Any] = {}
    if not args.ci_only:
        measured["make_test"] = make_test(out, out / "verdicts.jsonl")
        verdicts = false_verdicts(out / "verdicts.jsonl", measured["make_test"])
        blocks[VERDICTS_KEY] = verdicts
        print(f"false verdicts: {verdicts['hung']} Hung or stuck, {verdicts['quarantine']} "
              f"quarantines, over {verdicts['jobs']} jobs on real nodes")
    if args.ci or args.ci_only:
        measured["ci_empty_cache"] = ci_empty_cache(out)
    path = store.record({KEY: {**(store.load().get(KEY) or {}), **measured}, **blocks})
    for name, run in measured.items():
        print(f"suite {name}: {run['wall_s']} s, exit {run['exit_code']}, {run['passed']} "
              f"passed, {run['failed']} failed, {run['errors']} errors at {run['commit']}")
    print(f"wrote {path} ({KEY}); logs in {out}")
    return 0 if all(run["exit_code"] == 0 for run in measured.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
