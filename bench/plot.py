"""The cost curve of discovery, 10 to 10,000 workers: bench/out/scale.png from results.json.

Three log-log panels against the worker count: p99 discovery latency (with p50 and max, and
the p99 of a node whose workers all go at once), the
supervisor's RSS (idle, and peak under the storm) and its startup time to the first complete
file; each with the issue's targets drawn as red marks (p99 <= 60 ms at 1,000 and <= 100 ms
at 10,000; RSS <= 150 MB and startup <= 10 s at 10,000).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out" / "scale.png"
TARGETS = {
    "latency": [(1000, 60.0), (10000, 100.0)],
    "rss": [(10000, 150.0)],
    "startup": [(10000, 10.0)],
}


def main(results: dict[str, Any], out: Path = OUT) -> Path:
    """Draw the PNG from the `discovery_details` of `results`; return its path."""
    import matplotlib  # noqa: PLC0415 (the demo extra; only `make bench` needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    details = results["discovery_details"]
    ns = sorted(int(n) for n in details)
    d = [details[str(n)] for n in ns]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    panels = [
        ("latency", "discovery latency (ms)\nAPI write -> file renamed", [
            ("p99", [x["latency_ms"]["p99"] for x in d], "o-"),
            ("p50", [x["latency_ms"]["p50"] for x in d], "s--"),
            ("max", [x["latency_ms"]["max"] for x in d], "^:"),
            ("p99, a node's workers at once", [x["node_drained_ms"]["p99"] for x in d],
             "d-.")]),
        ("rss", "supervisor RSS (MB)", [
            ("idle", [x["idle"]["rss_mb"] for x in d], "o-"),
            ("peak under 50 changes/s", [x["storm"]["rss_mb_peak"] for x in d], "s--")]),
        ("startup", "startup (s)\nprocess start -> first complete file", [
            ("startup", [x["startup_s"] for x in d], "o-")]),
    ]
    for ax, (key, title, series) in zip(axes, panels, strict=True):
        for label, ys, style in series:
            ax.plot(ns, ys, style, label=label)
        tx, ty = zip(*TARGETS[key], strict=True)
        ax.plot(tx, ty, "rv", markersize=10, label="target (at most)")
        for x, y in TARGETS[key]:
            ax.hlines(y, x / 1.6, x * 1.6, colors="r", linewidth=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(plain if axis is ax.yaxis else FuncFormatter(
                lambda v, _: ""))
        ax.set_xlabel("workers")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    when = str(results.get("when", ""))[:10]
    machine = results.get("machine") or {}
    fig.suptitle(f"elastic-supervisor at scale on kwok nodes ({when}, {machine.get('cpus')} "
                 f"cores shared with the API server, etcd and kwok)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
