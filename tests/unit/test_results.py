"""README says what bench/results.json holds, and the file holds only what code in bench/ (and
`make demo`) wrote: the Results table and the demo's table are the stored blocks as
bench/tables.py renders them, a missing block reads "not recorded", and the suite timer reads
pytest's own summary lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import soak, store, suite, tables
from bench.__main__ import blank, merge
from localcluster import demo

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
RESULTS_HEADER = "| what | measured | target |"
DEMO_HEADER = "| fault | detected | resumed | full size |"


def table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table under `header`; [] when there is none."""
    lines = text.splitlines()
    if header not in lines:
        return []
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_a_block_two_benchmarks_write_keeps_the_keys_of_the_one_not_run() -> None:
    """bench/tf_hook.py and bench/e2e_stock_tf.py each write their keys of `e2e_stock_tf`: a
    run of one keeps what the other stored, and a block nobody measured stays as blank."""
    results = blank()
    stored = {"hook_cost_per_step": {"percent_of_a_stock_step": 0.7}}
    merge(results, {"e2e_stock_tf": stored})
    merge(results, {"e2e_stock_tf": {"resumed_after_kill_s": {"median": 0.4, "max": 0.6}},
                    "e2e_stock_tf_details": {"plan": []}})
    assert results["e2e_stock_tf"] == {**blank()["e2e_stock_tf"], **stored,
                                       "resumed_after_kill_s": {"median": 0.4, "max": 0.6}}
    assert results["e2e_stock_tf_details"] == {"plan": []}


def test_every_block_of_the_results_file_has_a_writer_in_bench_or_the_demo() -> None:
    written = set(blank()) | {suite.KEY, suite.VERDICTS_KEY, demo.RESULTS_KEY}
    assert set(store.load()) - written == set()


def test_the_soak_block_sums_up_the_runs_stored_beside_it() -> None:
    stored = store.load()
    assert stored["soak"] == soak.summary(stored["soak_details"])


def test_the_readme_results_table_is_the_results_file() -> None:
    readme = [(what, measured) for what, measured, _target in table(README.read_text(),
                                                                      RESULTS_HEADER)]
    assert readme == tables.results_rows(store.load()), (
        "README's Results table differs from bench/results.json: paste the rows "
        "`python -m bench.tables` prints (the targets are README's own)")


@pytest.mark.parametrize("page", [README, BENCHMARKS], ids=lambda p: p.name)
def test_the_demo_table_is_the_results_files_demo_block(page: Path) -> None:
    text, stored = page.read_text(), store.load()
    assert tables.demo_caption(stored) in text.splitlines()
    assert [tuple(row) for row in table(text, DEMO_HEADER)] == tables.demo_rows(stored)


def test_a_block_the_file_lacks_renders_as_not_recorded_never_as_a_number() -> None:
    assert {measured for _, measured in tables.results_rows({})} == {tables.NOT_RECORDED}
    assert tables.demo_rows({}) == []
    assert tables.NOT_RECORDED in tables.demo_caption({})


def test_the_demo_records_its_table_as_it_printed_it() -> None:
    at = 1_800_000_000.0
    faults = [demo.Fault("a worker's node frozen", at, 2, detected=at + 3.04, resumed=at + 3.16,
                         full=at + 18.66, usable=at + 13.9),
              demo.Fault("scale 2 -> 3", at + 60, 3, detected=at + 61.4)]
    result = demo.Result(0, demo.Run(Path("/nonexistent")), faults)
    block = demo.block(result, 229.4, {"when": "2026-11-28T12:00:00+00:00", "commit": "abc1234"})
    stored = {demo.RESULTS_KEY: block}
    assert tables.demo_rows(stored) == [("a worker's node frozen", "3.0 s", "3.2 s", "18.7 s"),
                                        ("scale 2 -> 3", "1.4 s", "-", "-")]
    assert tables.demo_caption(stored) == (
        "The run recorded in `bench/results.json` (`demo`: 2026-11-28, abc1234, 3 min 49 s, "
        "exit 0):")


def test_the_suite_timer_sums_pytests_summary_lines_of_every_phase() -> None:
    output = "\n".join([
        "All checks passed!",
        "tests/unit/test_core.py ........",
        "=================== 886 passed, 2 skipped, 3 warnings in 26.51s ===================",
        "FAILED tests/integration/test_x.py::test_y - AssertionError",
        "======= 1 failed, 158 passed, 1 error in 531.98s (0:08:51) =======",
        "=========================== no tests ran in 0.12s ============================",
    ])
    assert suite.phases(output) == [
        {"passed": 886, "skipped": 2, "seconds": 26.51},
        {"failed": 1, "passed": 158, "errors": 1, "seconds": 531.98},
    ]
    assert suite.totals(suite.phases(output)) == {"passed": 1044, "failed": 1, "errors": 1,
                                                  "skipped": 2}


def test_the_suite_sums_each_files_tests_and_lists_the_slowest_first(tmp_path: Path) -> None:
    """bench.suite's `slowest_files`, from the lines tests/cpu.py appends per test."""
    times = tmp_path / "test-times.jsonl"
    times.write_text("".join(json.dumps(t) + "\n" for t in [
        {"test": "tests/e2e/test_a.py::TestTour::test_one", "wall_s": 40.25, "core_s": 30.0},
        {"test": "tests/unit/test_b.py::test_two", "wall_s": 0.5, "core_s": 0.4},
        {"test": "tests/e2e/test_a.py::test_three", "wall_s": 19.75, "core_s": 12.5},
        {"test": "tests/e2e/test_c.py::test_four[x]", "wall_s": 55.0, "core_s": 70.1}]))
    assert suite.by_file(times, top=2) == [
        {"file": "tests/e2e/test_a.py", "tests": 2, "wall_s": 60.0, "core_s": 42.5},
        {"file": "tests/e2e/test_c.py", "tests": 1, "wall_s": 55.0, "core_s": 70.1}]
    assert suite.by_file(tmp_path / "none.jsonl") == []


def test_a_recorded_block_replaces_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    store.write({"soak": {"ok": False}, "suite": {"old": 1}}, path)
    store.record({"suite": {"make_test": {"wall_s": 1.0}}}, path)
    assert store.load(path) == {"soak": {"ok": False}, "suite": {"make_test": {"wall_s": 1.0}}}


def test_the_suite_rows_say_what_bench_suite_recorded() -> None:
    phases = suite.phases("===== 1 failed, 1133 passed in 1423.00s (0:23:43) =====")
    run = {"when": "2026-11-28T14:00:00+00:00", "commit": "abc1234", "wall_s": 1423.0,
           "exit_code": 2, **suite.totals(phases), "phases": phases}
    rows = dict(tables.results_rows({suite.KEY: {"make_test": run}}))
    assert rows[tables.SUITE_WHAT["make_test"]] == (
        "23.7 min, exit 2: 1133 passed, 1 failed, 0 errors (2026-11-28, abc1234)")
    assert rows[tables.SUITE_WHAT["ci_empty_cache"]] == tables.NOT_RECORDED
    busy = {**run, "busy_core_s": 2490.0, "cpu_share": 0.875, "machine": {"cpus": 2}}
    rows = dict(tables.results_rows({suite.KEY: {"make_test": busy}}))
    assert rows[tables.SUITE_WHAT["make_test"]] == (
        "23.7 min, exit 2: 1133 passed, 1 failed, 0 errors; the machine busy 41.5 core-min, "
        "88% of its 2 cores (2026-11-28, abc1234)")


def test_the_false_verdicts_block_sums_the_jobs_lines(tmp_path: Path) -> None:
    lines = tmp_path / "verdicts.jsonl"
    hung = {"event": "worker.hung", "pod": "job-w1-0", "node": None, "detail": "silent"}
    lines.write_text("\n".join(json.dumps(j) for j in [
        {"namespace": "e2e-a", "verdicts": {"worker.hung": 2, "node.quarantined": 0},
         "silenced": ["job-w0-0"], "false_hung": 1, "false_quarantine": 0, "false": [hung]},
        {"namespace": "e2e-b", "verdicts": {"worker.hung": 1, "node.quarantined": 1},
         "silenced": ["es-node-2"], "false_hung": 0, "false_quarantine": 1, "false": []},
    ]) + "\n")
    block = suite.false_verdicts(lines, {"commit": "abc", "exit_code": 0})
    assert (block["hung"], block["quarantine"], block["jobs"]) == (1, 1, 2)
    assert block["verdicts"] == {"worker.hung": 3, "node.quarantined": 1}
    assert block["false"] == [hung] and block["commit"] == "abc"
    assert suite.false_verdicts(tmp_path / "none.jsonl", {})["jobs"] == 0


def test_the_quick_starts_make_test_minutes_are_the_recorded_ones() -> None:
    """README's quick start says how long `make test` took warm: the `suite` block's wall time
    (a prose number drifted from 34.9 recorded to 27.0 said once)."""
    text = " ".join(README.read_text().split())
    run = store.load()["suite"]["make_test"]
    said = f"`make test` took {run['wall_s'] / 60:.1f} minutes warm"
    assert said in text, f"README's quick start should say: {said}"
