"""`make bench`: run the benchmarks and write bench/results.json and bench/out/scale.png, then
print a table.

Keys not measured stay null (never invented); the blocks other code writes (`suite`:
bench/suite.py, `demo`: `make demo`) are kept as stored (bench/store.py).
`--only NAME` runs one benchmark and keeps the others' stored numbers (`--only plot` only
redraws the PNG from results.json).
"""

from __future__ import annotations

import argparse
import sys

from bench import (
    configmap_path,
    discovery,
    disruptions,
    e2e,
    e2e_sequences,
    e2e_stock,
    e2e_stock_tf,
    fence,
    plot,
    podstart,
    replacement,
    sidecar,
    soak,
    status,
    store,
    stragglers,
    tf_hook,
    versus,
)


def blank() -> dict[str, object]:
    """Every key `make bench` writes, null until a benchmark measures it."""
    return {
        "when": store.now(),
        "machine": store.machine(),
        "discovery_latency_ms": None,
        "discovery_details": None,
        "baseline_poll_latency_ms": None,
        "baseline_poll_api_requests_per_min": None,
        "speedup_vs_poll_p99": None,
        "baseline_poll_details": None,
        "replacement_latency_ms": None,
        "replacement_latency_ms_10000": None,
        **{f"pass_ms_idle_{n}": None for n in replacement.SIZES},
        **{f"{key}_{n}": None for n in discovery.SIZES
           for key in ("supervisor_rss_mb", "supervisor_cpu_percent_idle", "startup_s",
                       "events_per_min")},
        "supervisor_rss_mb_per_1000_workers": None,
        "e2e": {"resume_after_kill_s": None, "resume_after_freeze_s": None,
                "full_size_after_replacement_s": None, "steps_rerun_max": None},
        "e2e_details": None,
        "e2e_stock": {"resumed_after_hang_s": None, "resumed_after_sigkill_s": None,
                      "resumed_after_stuck_s": None, "longest_interval_without_a_step_s": None,
                      "steps_rerun_max": None, "horovodrun_restarts": None},
        "e2e_stock_details": None,
        # bench/tf_hook.py writes hook_cost_per_step, bench/e2e_stock_tf.py the rest
        "e2e_stock_tf": {"hook_cost_per_step": None, "resumed_after_kill_s": None,
                         "resumed_after_hang_s": None, "resumed_after_stuck_s": None,
                         "horovodrun_restarts": None, "steps_recomputed": None},
        "e2e_stock_tf_details": None,
        "e2e_sequences": None,
        "e2e_sequences_details": None,
        "fence": None,
        "disruptions": None,
        "disruptions_details": None,
        "configmap_path_latency_ms": None,
        "soak": None,
        "soak_details": None,
        "status": None,
        "sidecar": None,
        "sidecar_details": None,
        "podstart": None,
        "podstart_details": None,
        "stragglers": None,
        "stragglers_details": None,
    }


def merge(results: dict[str, object], measured: dict[str, object]) -> None:
    """Put `measured`'s blocks into `results`, each key by key: two benchmarks write one block
    (e2e_stock_tf), and a run of one keeps what the other stored."""
    for key, block in measured.items():
        old = results.get(key)
        if isinstance(old, dict) and isinstance(block, dict):
            results[key] = {**old, **block}
        else:
            results[key] = block


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--sizes", default=",".join(map(str, discovery.SIZES)),
                        help="worker counts for the discovery benchmark (default %(default)s)")
    parser.add_argument("--only", choices=("discovery", "replacement", "baseline", "e2e",
                                           "e2e_stock", "e2e_sequences", "fence", "configmap",
                                           "disruptions", "status", "sidecar", "soak", "plot",
                                           "tf_hook", "podstart", "e2e_stock_tf",
                                           "stragglers"),
                        help="run one benchmark; keys of the others keep their stored values "
                             "(soak and e2e_sequences run only when named: ~15 min per seed, "
                             "~25 min)")
    parser.add_argument("--replacement-sizes",
                        default=",".join(map(str, replacement.SIZES)),
                        help="worker counts of the replacement benchmark (default %(default)s)")
    parser.add_argument("--seeds", default="1",
                        help="seeds of the fault soak, comma-separated (default %(default)s)")
    parser.add_argument("--baseline-workers", type=int, default=versus.Plan.workers,
                        help="worker count of the poller comparison (default %(default)s)")
    parser.add_argument("--baseline-changes", type=int, default=versus.Plan.per_sampled_kind,
                        help="changes of each kind both see, in the poller comparison "
                             "(default %(default)s)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    results = blank()
    stored = store.load()
    # The blocks other code writes (`suite`, `demo`) are kept by every run; a benchmark's keys
    # only by a run of another one.
    results.update({k: v for k, v in stored.items() if k not in results})
    if args.only:
        results.update({k: v for k, v in stored.items() if k in results and k != "when"})
        if args.only == "plot":
            results["when"] = stored.get("when")
    if args.only in (None, "discovery"):
        results.update(discovery.main(sizes))
    if args.only in (None, "replacement"):
        results.update(replacement.main(
            tuple(int(x) for x in args.replacement_sizes.split(","))))
    if args.only in (None, "baseline"):
        results.update(versus.main(versus.Plan.scaled(args.baseline_workers,
                                                      args.baseline_changes)))
    if args.only in (None, "e2e"):
        results.update(e2e.main())
    if args.only in (None, "e2e_stock"):
        results.update(e2e_stock.main())
    if args.only in (None, "fence"):
        results.update(fence.main())
    if args.only in (None, "tf_hook"):
        merge(results, tf_hook.main())
    if args.only in (None, "e2e_stock_tf"):
        merge(results, e2e_stock_tf.main())
    if args.only in (None, "configmap"):
        results.update(configmap_path.main())
    if args.only in (None, "disruptions"):
        results.update(disruptions.main())
    if args.only in (None, "status"):
        results.update(status.main())
    if args.only in (None, "sidecar"):
        results.update(sidecar.main())
    if args.only in (None, "podstart"):
        results.update(podstart.main())
    if args.only in (None, "stragglers"):
        results.update(stragglers.main())
    if args.only == "e2e_sequences":
        results.update(e2e_sequences.main())
    if args.only == "soak":
        # Adds its seeds' runs to the stored ones (soak.merged): a seed takes ~25 minutes.
        results.update(soak.main(tuple(int(x) for x in args.seeds.split(",")),
                                 stored.get("soak_details") or ()))
    if args.only != "plot":
        print(f"\nwrote {store.write(results)}")
    if results["discovery_details"]:
        print(f"wrote {plot.main(results)}\n")
    print_discovery(results)
    if rl := results["replacement_latency_ms"]:
        print(f"replacement (failure -> new pod) at {rl.get('workers', 50)} workers: p50 "
              f"{rl['p50']} ms, p99 {rl['p99']} ms, max {rl['max']} ms over {rl['n']}")
    print_baseline(results)
    print_e2e(results)
    print_stock(results)
    print_configmap(results)
    print_status(results)
    if results["soak"]:
        print(f"soak: {results['soak']}")
    return 0


def print_discovery(results: dict[str, object]) -> None:
    details = results["discovery_details"]
    if not isinstance(details, dict):
        return
    print(f"{'workers':>8} {'nodes':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'n':>4} "
          f"{'start s':>7} {'RSS MB':>6} {'idle %':>6} {'storm %':>7} {'storm MB':>8} "
          f"{'req/min':>7} {'load':>9}")
    for n, d in details.items():
        r, load = d["latency_ms"], d["load_average_1min"]["samples"]
        print(f"{n:>8} {d['nodes']:>6} {r['p50']:>7} {r['p99']:>7} {r['max']:>7} {r['n']:>4} "
              f"{d['startup_s']:>7} {d['idle']['rss_mb']:>6} {d['idle']['cpu_percent']:>6} "
              f"{d['storm']['cpu_percent']:>7} {d['storm']['rss_mb_peak']:>8} "
              f"{d['api_requests']['per_min']:>7} {min(load):>4}-{max(load):<4}")
    print(f"RSS growth: {results['supervisor_rss_mb_per_1000_workers']} MB per 1000 workers")


def print_baseline(results: dict[str, object]) -> None:
    details = results["baseline_poll_details"]
    if not isinstance(details, dict):
        return
    print(f"\n{'same changes':<34} {'workers':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'samples':>8}")
    for n, d in details.items():
        for who, r in ((f"poller ({d['poll_period_s']:g} s list, phase Running)", d["poller"]),
                       ("supervisor (watch)", d["ours"])):
            print(f"{who:<34} {n:>8} {r['p50']:>8} {r['p99']:>8} {r['max']:>8} {r['n']:>8}")
        unseen = ", ".join(f"{k} {v['never_seen']}/{v['changes']}"
                           for k, v in d["never_seen_by_poller"].items())
        print(f"never seen by the poller (changes kept in its file): {unseen}")
    rates = results["baseline_poll_api_requests_per_min"]
    if isinstance(rates, dict):
        print(f"speedup (poller p99 / supervisor p99): {results['speedup_vs_poll_p99']}x; "
              f"API requests/min: poller {rates['poller']} lists, supervisor reads "
              f"{rates['supervisor_reads']} (all {rates['supervisor']}: Events about the "
              f"{rates['changes_in_window']} changes of the run)")


def print_e2e(results: dict[str, object]) -> None:
    details = results["e2e_details"]
    if not isinstance(details, dict):
        return
    print(f"\n{'fault (real Horovod training)':<40} {'detected':>9} {'resumed':>9} "
          f"{'repl. usable':>12} {'full size':>10}")
    for f in details["faults"]:
        cells = [f"{v:.1f} s" if v is not None else "-" for v in (
            f["detected_s"], f["resumed_s"], f["replacement_usable_s"], f["full_size_s"])]
        print(f"{f['fault']:<40} {cells[0]:>9} {cells[1]:>9} {cells[2]:>12} {cells[3]:>10}")
    print(f"e2e: {results['e2e']}")


def print_stock(results: dict[str, object]) -> None:
    details = results["e2e_stock_details"]
    if isinstance(details, dict):
        print(f"\n{'fault (stock script, defaults)':<40} {'resumed':>9} {'full size':>10} "
              f"{'rerun':>6}")
        for job in details["jobs"]:
            for f in job["faults"]:
                if "skipped" in f:
                    print(f"{f['fault']:<40} skipped: {f['skipped']}")
                    continue
                print(f"{f['fault']:<40} {f['resumed_s']:>7.1f} s {f['full_size_s']:>8.1f} s "
                      f"{max(f['steps_rerun'], default=0):>6}")
        print(f"e2e_stock: {results['e2e_stock']}")
    if isinstance(results["fence"], dict):
        print(f"fence: {results['fence']}")


def print_configmap(results: dict[str, object]) -> None:
    d = results["configmap_path_latency_ms"]
    if not isinstance(d, dict):
        return
    print(f"\n{'worker deleted -> host list without it':<44} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'n':>4}")
    for who, key in ((f"ConfigMap volume (kubelet sync {d['kubelet_sync_frequency_s']} s)",
                      "configmap_volume"), ("supervisor's file", "supervisor_file")):
        r = d[key]
        print(f"{who:<44} {r['p50']:>8} {r['p99']:>8} {r['max']:>8} {r['n']:>4}")


def print_status(results: dict[str, object]) -> None:
    d = results["status"]
    if not isinstance(d, dict):
        return
    what = f"status at {d['workers']} workers, {d['events']['in_namespace']} Events"
    print(f"\n{what:<44} {'median s':>9} {'p90 s':>7} {'max s':>7} {'n':>4}")
    for who, key in (("elastic-supervisor status", "table_s"),
                     ("elastic-supervisor status --output json", "json_s")):
        r = d[key]
        print(f"{who:<44} {r['median']:>9} {r['p90']:>7} {r['max']:>7} {r['n']:>4}")
    print(f"target <= {d['target_s']} s: {'met' if d['target_met'] else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
