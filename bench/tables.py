"""README's results tables, rendered from bench/results.json (`python -m bench.tables`).

Owns the words and rounding of README's Results table (its "what" and "measured" cells; the
targets are README's own) and of the demo's table and caption. Pure: a function of the stored
blocks; a block the file lacks renders as NOT_RECORDED, never as a number.
tests/unit/test_results.py fails when README says anything else, so after a measurement the
printed rows are pasted into README.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench import store

NOT_RECORDED = "not recorded by bench/ yet"

Results = Mapping[str, Any]


def _s(x: float) -> str:
    return f"{x:.2f}"


def _median_max(d: Mapping[str, float]) -> str:
    return f"{_s(d['median'])} s median, {_s(d['max'])} s max"


def discovery_top(r: Results) -> tuple[str, str]:
    n = max(r["discovery_latency_ms"], key=int)
    d = r["discovery_latency_ms"][n]
    return (f"discovery file updated after a change, {int(n):,} workers (kwok)",
            f"p50 {d['p50']} ms, p99 {d['p99']} ms")


def discovery_1000(r: Results) -> tuple[str, str]:
    return "the same at 1,000 workers", f"p99 {r['discovery_latency_ms']['1000']['p99']} ms"


def footprint(r: Results) -> tuple[str, str]:
    n = max(int(k) for k in r["discovery_latency_ms"])
    return (f"supervisor at {n:,} workers: RSS, idle CPU, startup",
            f"{r[f'supervisor_rss_mb_{n}']} MB, {r[f'supervisor_cpu_percent_idle_{n}']} %, "
            f"{r[f'startup_s_{n}']} s")


def without_kwok(d: Mapping[str, Any]) -> str:
    """The latency from the API's Failed, when the run measured it (bench/replacement.py)."""
    seen = d.get("from_failed_seen")
    return "" if not seen else f" (from the Failed status in the API: p99 {seen['p99']} ms)"


def replacement(r: Results) -> tuple[str, str]:
    d = r["replacement_latency_ms"]
    return (f"failure -> replacement pod created, {d['workers']:,} workers",
            f"p50 {d['p50']} ms, p99 {d['p99']} ms{without_kwok(d)}")


def scale_10000(r: Results) -> tuple[str, str]:
    d, idle = r["replacement_latency_ms_10000"], r["pass_ms_idle_10000"]
    return ("at 10,000 workers (kwok): failure -> replacement created; a pass with nothing "
            "changed; Event writes a minute",
            f"p99 {d['p99']} ms{without_kwok(d)}; mean {idle['mean']} ms, all <= "
            f"{idle['max_le']:g} ms; {r['events_per_min_10000']}")


def poller(r: Results) -> tuple[str, str]:
    (n, d), = r["baseline_poll_details"].items()
    never = ", ".join(f"{v['never_seen']} of {v['changes']} {kind}"
                      for kind, v in d["never_seen_by_poller"].items())
    return (f"host list kept against a {d['poll_period_s']:g} s list poller, {int(n):,} workers",
            f"p99 {d['ours']['p99']:.1f} ms vs {d['poller']['p99'] / 1000:.2f} s: "
            f"**{r['speedup_vs_poll_p99']}x**; the poller never sees {never}")


def configmap(r: Results) -> tuple[str, str]:
    d = r["configmap_path_latency_ms"]
    return ("against mpi-operator's ConfigMap volume (worker deleted -> host list)",
            f"p99 {d['supervisor_file']['p99']:.0f} ms vs "
            f"{d['configmap_volume']['p99'] / 1000:.1f} s")


def e2e_resumed(r: Results) -> tuple[str, str]:
    d = r["e2e_details"]
    kinds = [d[f"resume_after_{k}_s"] for k in ("kill", "force_delete", "freeze")]
    return ("real training on real nodes, resumed after SIGKILL / force delete / frozen node",
            " / ".join(_s(k["median"]) for k in kinds)
            + f" s median, {_s(max(k['max'] for k in kinds))} s max")


def e2e_full_size(r: Results) -> tuple[str, str]:
    faults = [f for f in r["e2e_details"]["faults"] if f["full_size_s"] is not None]
    slowest = max(faults, key=lambda f: f["full_size_s"])
    return ("fault -> back at full size",
            f"{_s(statistics.median(f['full_size_s'] for f in faults))} s median, "
            f"{_s(slowest['full_size_s'])} s max ({slowest['fault']})")


def e2e_rerun(r: Results) -> tuple[str, str]:
    return (f"steps computed again (commit every {r['e2e_details']['commit_every']})",
            f"at most {r['e2e']['steps_rerun_max']}")


def goodput(r: Results) -> tuple[str, str]:
    return ("goodput the supervisor reports vs rank 0's printed steps (the demo's faults)",
            f"within {100 * r['e2e']['goodput_tool_vs_steps_diff_max']:.2f} %")


def status(r: Results) -> tuple[str, str]:
    d = r["status"]
    return (f"`status` at {d['workers']:,} workers (kwok, {d['events']['in_namespace']:,} Events)",
            f"{d['table_s']['median']} s median, {d['table_s']['max']} s max")


def stock_hang(r: Results) -> tuple[str, str]:
    return ("stock script (imports nothing of ours): resumed after a frozen process, partition "
            "or silent node", _median_max(r["e2e_stock"]["resumed_after_hang_s"]))


def stock_stuck(r: Results) -> tuple[str, str]:
    return ("stock script: resumed after a deadlocked main thread",
            _median_max(r["e2e_stock"]["resumed_after_stuck_s"]))


def stock_restarts(r: Results) -> tuple[str, str]:
    faults = [f for job in r["e2e_stock_details"]["jobs"] for f in job["faults"]
              if "skipped" not in f]
    return (f"horovodrun restarts over {len(faults)} stock-script faults",
            str(r["e2e_stock"]["horovodrun_restarts"]))


STRAGGLERS_WHAT = ("a worker slow but alive (one of 3 given 20 % of a CPU; the stock scripts, "
                   "no checkpoint): named; the step rate back within 10 %")
LINK_WHAT = ("a worker on a slow link (one of 3 narrowed to {rate}; the stock torch script, "
             "no checkpoint): named; the step rate back within 10 %")


def stragglers(r: Results) -> tuple[str, str]:
    d = r["stragglers"]
    case = (d.get("cases") or {}).get("cpu") or d
    return STRAGGLERS_WHAT, _straggled(d, case)


def stragglers_link(r: Results) -> tuple[str, str]:
    d = r["stragglers"]
    return LINK_WHAT.format(rate=d.get("link_rate")), _straggled(d, d["cases"]["link"])


def _straggled(d: Mapping[str, Any], case: Mapping[str, Any]) -> str:
    named, back = case["detected_s"], case["rate_recovered_s"]
    return (f"{_s(named['median'])} s / {_s(back['median'])} s median, {_s(named['max'])} s / "
            f"{_s(back['max'])} s max over {named['n']} runs "
            f"({', '.join(case.get('frameworks') or ['torch'])}); {d['steps_recomputed']} steps "
            f"computed again, {d['horovodrun_restarts']} horovodrun restarts, "
            f"{d['false_positives']} false positives in {d['false_positives_of']}")


def sidecar(r: Results) -> tuple[str, str]:
    d = r["sidecar"]
    side = (d["resumed_after_kill_s"], d["resumed_after_hang_s"])
    baked = (d["baked_in_same_runs"]["resumed_after_kill_s"],
             d["baked_in_same_runs"]["resumed_after_hang_s"])
    return ("sidecar mode (your image as it is): resumed after a SIGKILL / a frozen process",
            f"{_s(side[0]['median'])} / {_s(side[1]['median'])} s median, "
            f"{_s(side[0]['max'])} / {_s(side[1]['max'])} s max (baked in, same runs: "
            f"{_s(baked[0]['max'])} / {_s(baked[1]['max'])} s max)")


PODSTART_WHAT = ("sidecar mode: a replacement worker's sshd after the fault, and full size after "
                 "two kills at once")


def podstart(r: Results) -> tuple[str, str]:
    side, baked = r["podstart"]["sidecar"], r["podstart"]["baked"]

    def cell(d: Mapping[str, Any]) -> str:
        return (f"{_s(d['fault_to_sshd_s']['median'])} s and {_s(d['joined_last_s']['median'])} s "
                f"median, {_s(d['fault_to_sshd_s']['max'])} s and "
                f"{_s(d['joined_last_s']['max'])} s max")
    return PODSTART_WHAT, f"{cell(side)} (baked in, same runs: {cell(baked)})"


def sequences(r: Results) -> tuple[str, str]:
    d = r["e2e_sequences"]
    worst = max(v["max"] for v in d["resumed_s_by_fault"].values())
    outcome = "all resumed" if not d["failed"] and not d["skipped"] else (
        f"{len(d['failed'])} failed, {d['skipped']} skipped, the others resumed")
    return (f"{d['faults']} faults in the middle of recoveries",
            f"{outcome} within {_s(worst)} s, {d['horovodrun_restarts']} horovodrun restarts")


def disruptions(r: Results) -> tuple[str, str]:
    d = r["disruptions"]
    return (f"{d['disruptions']} announced disruptions (drain, eviction, autoscaler taint, ...)",
            f"{d['steps_recomputed']['max']} steps computed again, interruption "
            f"{_s(d['interruption_s']['median'])} s median")


def hook_cost(r: Results) -> tuple[str, str]:
    return ("the hook's cost per step of a stock script",
            f"{r['fence']['hook_cpu']['percent_of_a_stock_step']} %")


def tf_hook_cost(r: Results) -> tuple[str, str]:
    d = r["e2e_stock_tf"]["hook_cost_per_step"]
    runs = ", ".join(f"{x}" for x in d["percent_of_a_stock_step_runs"])
    return ("the hook's cost per step of the stock TensorFlow script (the seeds' shape)",
            f"{d['percent_of_a_stock_step']} % (worst of {runs}: {d['signals_us_per_step']} us "
            f"of a {d['stock_step_ms']} ms step)")


def tf_resumed(r: Results) -> tuple[str, str]:
    d = r["e2e_stock_tf"]
    kill, hang, stuck = (d[k] for k in ("resumed_after_kill_s", "resumed_after_hang_s",
                                         "resumed_after_stuck_s"))
    faults = len(r["e2e_stock_tf_details"]["job"]["faults"])
    return ("the stock TensorFlow script (the seeds' shape, sidecar mode): resumed after a "
            "SIGKILL / a frozen process or partition / a deadlocked main thread",
            f"{_s(kill['median'])} / {_s(hang['median'])} / {_s(stuck['median'])} s median, "
            f"{_s(kill['max'])} / {_s(hang['max'])} / {_s(stuck['max'])} s max; "
            f"{d['horovodrun_restarts']} horovodrun restarts, {d['steps_recomputed']} steps "
            f"computed again over {faults} faults")


def soak(r: Results) -> tuple[str, str]:
    d, runs = r["soak"], r["soak_details"]
    seeds = ", ".join(map(str, d["seeds"]))
    restarts = [reason for run in runs for reason in run["horovodrun_restarts"]]
    reasons = ", ".join(sorted(set(restarts)))
    exits = ", ".join(sorted({str(run["exit_code"]) for run in runs}))
    stock = "false_verdicts" in d  # the soak of the stock script, sidecar mode (issue 40)
    return (f"fault soak, {d['faults'] // len(runs)} random faults per seed "
            + ("(the stock script without a checkpoint, sidecar mode, the shipped defaults; "
               if stock else "(")
            + f"seed{'s' if len(runs) > 1 else ''} {seeds})",
            f"ok: {str(d['ok']).lower()}: {d['violations']} violations, {len(restarts)} "
            f"horovodrun restarts{f' ({reasons})' if reasons else ''}, "
            + (f"at most {d['recomputed_max']} steps computed again per fault (a launcher exit "
               f"excepted: the script starts over), {d['false_verdicts']} false verdicts, "
               if stock else "")
            + f"exit {exits}, longest interval without a step {d['longest_gap_s']} s")


def _suite(name: str) -> Callable[[Results], tuple[str, str]]:
    def row(r: Results) -> tuple[str, str]:
        d = r["suite"][name]
        busy = d.get("busy_core_s")
        cpu = "" if busy is None else (
            f"; the machine busy {busy / 60:.1f} core-min, {d['cpu_share']:.0%} of its "
            f"{d['machine']['cpus']} cores")
        return (SUITE_WHAT[name],
                f"{d['wall_s'] / 60:.1f} min, exit {d['exit_code']}: {d['passed']} passed, "
                f"{d['failed']} failed, {d['errors']} errors{cpu} ({d['when'][:10]}, "
                f"{d['commit']})")
    return row


SUITE_WHAT = {"make_test": "`make test` (`python -m bench.suite`)",
              "ci_empty_cache": "`.ci/run` in a clean clone, empty caches "
                                "(`python -m bench.suite --ci-only`)"}

# README's Results table, in order: (the block the row needs, its "what" while that block is
# missing, the row).
ROWS: Sequence[tuple[tuple[str, ...], str, Callable[[Results], tuple[str, str]]]] = (
    (("discovery_latency_ms",), "discovery file updated after a change (kwok)", discovery_top),
    (("discovery_latency_ms", "1000"), "the same at 1,000 workers", discovery_1000),
    (("discovery_latency_ms",), "supervisor at scale: RSS, idle CPU, startup", footprint),
    (("replacement_latency_ms",), "failure -> replacement pod created", replacement),
    (("replacement_latency_ms_10000",),
     "at 10,000 workers (kwok): failure -> replacement created; a pass with nothing changed; "
     "Event writes a minute", scale_10000),
    (("baseline_poll_details",), "host list kept against a list poller", poller),
    (("configmap_path_latency_ms",),
     "against mpi-operator's ConfigMap volume (worker deleted -> host list)", configmap),
    (("e2e_details",),
     "real training on real nodes, resumed after SIGKILL / force delete / frozen node",
     e2e_resumed),
    (("e2e_details",), "fault -> back at full size", e2e_full_size),
    (("e2e_details",), "steps computed again", e2e_rerun),
    (("e2e", "goodput_tool_vs_steps_diff_max"),
     "goodput the supervisor reports vs rank 0's printed steps (the demo's faults)", goodput),
    (("status",), "`status` at scale (kwok)", status),
    (("e2e_stock", "resumed_after_hang_s"),
     "stock script (imports nothing of ours): resumed after a frozen process, partition or "
     "silent node", stock_hang),
    (("e2e_stock", "resumed_after_stuck_s"),
     "stock script: resumed after a deadlocked main thread", stock_stuck),
    (("e2e_stock_details",), "horovodrun restarts over the stock-script faults", stock_restarts),
    (("sidecar",),
     "sidecar mode (your image as it is): resumed after a SIGKILL / a frozen process", sidecar),
    (("podstart",), PODSTART_WHAT, podstart),
    (("e2e_sequences",), "faults in the middle of recoveries", sequences),
    (("disruptions",), "announced disruptions (drain, eviction, autoscaler taint, ...)",
     disruptions),
    (("fence",), "the hook's cost per step of a stock script", hook_cost),
    (("e2e_stock_tf", "hook_cost_per_step"),
     "the hook's cost per step of the stock TensorFlow script (the seeds' shape)", tf_hook_cost),
    (("e2e_stock_tf", "resumed_after_kill_s"),
     "the stock TensorFlow script (the seeds' shape, sidecar mode): resumed after a SIGKILL / a "
     "frozen process or partition / a deadlocked main thread", tf_resumed),
    (("stragglers",), STRAGGLERS_WHAT, stragglers),
    (("stragglers", "cases", "link"), LINK_WHAT.format(rate="a token bucket"), stragglers_link),
    (("soak",), "fault soak, random faults per seed", soak),
    (("suite", "make_test"), SUITE_WHAT["make_test"], _suite("make_test")),
    (("suite", "ci_empty_cache"), SUITE_WHAT["ci_empty_cache"], _suite("ci_empty_cache")),
)


def _has(r: Any, path: Sequence[str]) -> bool:
    for key in path:
        if not isinstance(r, Mapping) or r.get(key) is None:
            return False
        r = r[key]
    return True


def results_rows(r: Results) -> list[tuple[str, str]]:
    """README's Results table as (what, measured) pairs."""
    return [row(r) if _has(r, needs) else (missing, NOT_RECORDED) for needs, missing, row in ROWS]


def _demo_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def demo_rows(r: Results) -> list[tuple[str, str, str, str]]:
    """The demo's table (fault, detected, resumed, full size) as `make demo` printed it."""
    if not _has(r, ("demo",)):
        return []
    return [(f["fault"], _demo_s(f["detected_s"]), _demo_s(f["resumed_s"]),
             _demo_s(f["full_size_s"])) for f in r["demo"]["faults"]]


def demo_caption(r: Results) -> str:
    """The sentence before the demo's table: which run it is, or that none is recorded."""
    if not _has(r, ("demo",)):
        return f"A run's table: {NOT_RECORDED} (`make demo` writes its `demo` block)."
    d = r["demo"]
    minutes, seconds = divmod(round(d["wall_s"]), 60)
    return (f"The run recorded in `bench/results.json` (`demo`: {d['when'][:10]}, {d['commit']}, "
            f"{minutes} min {seconds} s, exit {d['exit_code']}):")


def markdown(rows: Sequence[Sequence[str]]) -> str:
    return "\n".join("| " + " | ".join(cells) + " |" for cells in rows)


def main() -> int:
    r = store.load()
    print(markdown(results_rows(r)), end="\n\n")
    print(demo_caption(r))
    print(markdown(demo_rows(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
