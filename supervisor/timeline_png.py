"""The `timeline` picture drawn: `render` draws a timeline.Plan with matplotlib (imported when
called: the `demo` extra) and writes into the PNG's text chunks what the figure shows, read back
from it after drawing (tick labels, label texts and their extents), so a test checks the
picture, not the plan (`read_png_text`).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from supervisor.decide.incidents import PHASES
from supervisor.timeline import OPEN, Plan

METADATA_KEY = "elastic-supervisor.timeline"  # the PNG text chunk with what was drawn
EXTRA = "pip install 'elastic-supervisor[demo]'"


class RendererMissing(Exception):
    """matplotlib is not installed; the message says how to install it."""


COLOURS = {  # the stretch ending in each phase
    "detected": "#e377c2", "fenced": "#d62728", "resumed": "#ff7f0e", "created": "#e6c200",
    "scheduled": "#8c564b",
    "started": "#9467bd", "joined": "#17becf", "full": "#2ca02c", OPEN: "#9e9e9e",
}
WORLD, DESIRED = "#1f4e79", "#333333"


@dataclass(frozen=True)
class Drawn:
    """What the figure shows, read back from it after drawing (kept in the PNG)."""

    world_ticks: tuple[str, ...]  # the world panel's y tick labels
    labels: tuple[str, ...]  # the incident labels
    boxes: tuple[tuple[float, float, float, float], ...]  # their extents (pixels x0 y0 x1 y1)
    squeezed: tuple[str, ...]  # the real lengths written on squeezed stretches

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def renderer_missing() -> str | None:
    """Why `render` cannot run here (one line), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"the timeline needs matplotlib, which is not installed: {EXTRA}"
    return None


def render(p: Plan, path: Path, dpi: int = 100) -> Drawn:
    """Draw `p` into the PNG `path` (matplotlib's Agg, no display) and return what it shows;
    raise RendererMissing without matplotlib."""
    if (missing := renderer_missing()) is not None:
        raise RendererMissing(missing)
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (an extra)
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415
    from matplotlib.ticker import NullLocator  # noqa: PLC0415

    strip_in, world_in, rate_in, top_in, bottom_in = 0.3 * max(p.rows, 1) + 0.1, 2.4, 1.5, 0.8, 0.6
    height = strip_in + world_in + rate_in + top_in + bottom_in + 0.2
    fig = Figure(figsize=(12, height))
    FigureCanvasAgg(fig)
    strip, world, rate = fig.subplots(3, 1, sharex=True, gridspec_kw={
        "height_ratios": [strip_in, world_in, rate_in], "hspace": 0.08})
    fig.subplots_adjust(left=0.06, right=0.79, top=1 - top_in / height,
                        bottom=bottom_in / height)
    fig.suptitle(p.title, fontsize=10)
    end = max(p.axis.end, 1.0)
    for ax in (strip, world, rate):
        ax.set_xlim(0, end)
        for sq in p.squeezed:
            ax.axvspan(sq.x0, sq.x1, facecolor="#f2f2f2", edgecolor="#c8c8c8", hatch="//",
                       linewidth=0)
    for ax in (world, rate):
        for a, b in p.unobserved:
            ax.axvspan(a, b, fill=False, edgecolor="#d0d0d0", hatch="xx", linewidth=0)
        for inc in p.incidents:
            ax.axvline(inc.x, color="#555555", linestyle=":", linewidth=0.7)
            for sp in inc.spans:
                ax.axvspan(sp.x0, sp.x1, color=COLOURS[sp.phase], alpha=0.18, linewidth=0)

    strip.set_ylim(max(p.rows, 1), 0)
    strip.set_yticks([])
    strip.tick_params(axis="x", length=0)
    for side in ("left", "right", "top"):
        strip.spines[side].set_visible(False)
    for inc in p.incidents:
        for sp in inc.spans:
            strip.broken_barh([(sp.x0, sp.x1 - sp.x0)], (inc.row + 0.62, 0.3),
                              facecolors=COLOURS[sp.phase],
                              hatch="///" if sp.phase == OPEN else None, linewidth=0)
        strip.plot([inc.x], [inc.row + 0.77], marker="|", color="black", markersize=8)
        strip.text(inc.label_x, inc.row + 0.58, inc.label, fontsize=8, va="bottom",
                   ha="left", gid="incident-label")

    for s in p.world:
        world.plot(s.xs, s.ys, drawstyle="steps-post", color=WORLD, linewidth=1.8,
                   marker="o" if len(s.xs) == 1 else None, markersize=3)
    world.plot(p.desired.xs, p.desired.ys, drawstyle="steps-post", color=DESIRED,
               linestyle="--", linewidth=1)
    world.set_yticks(p.world_ticks, [str(t) for t in p.world_ticks])
    world.yaxis.set_minor_locator(NullLocator())
    world.set_ylim(-0.05 * p.world_ticks[-1], p.world_top)
    world.set_ylabel("world size (processes)")
    world.grid(axis="y", alpha=0.3)

    for s in p.rate:
        rate.plot(s.xs, s.ys, drawstyle="steps-post", color="#444444", linewidth=1)
    rate.set_ylim(0, p.rate_top)
    rate.set_ylabel("steps / s")
    for warning, colour in ((True, "#c62828"), (False, "#757575")):
        xs = [m.x for m in p.events if m.warning is warning]
        if xs:
            rate.plot(xs, [0.06] * len(xs), "|", color=colour, markersize=9,
                      transform=rate.get_xaxis_transform())
    for sq in (sq for sq in p.squeezed if sq.text):
        rate.text((sq.x0 + sq.x1) / 2, 0.5, sq.text, fontsize=7, ha="center",
                  va="center", transform=rate.get_xaxis_transform(), gid="squeezed",
                  color="#444444", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    rate.set_xticks([t.x for t in p.x_ticks], [t.label for t in p.x_ticks])
    rate.xaxis.set_minor_locator(NullLocator())
    rate.set_xlabel(p.x_label, fontsize=9)

    shown = {sp.phase for inc in p.incidents for sp in inc.spans}
    handles: list[Any] = [Line2D([], [], color=WORLD, linewidth=1.8, label="world size"),
                          Line2D([], [], color=DESIRED, linestyle="--", label="desired size")]
    handles += [Patch(facecolor=COLOURS[ph], label=f"incident: until {ph}")
                for ph in PHASES if ph in shown]
    if OPEN in shown:
        handles.append(Patch(facecolor=COLOURS[OPEN], hatch="///",
                             label="incident: open (not yet full)"))
    if p.unobserved:
        handles.append(Patch(fill=False, edgecolor="#b0b0b0", hatch="xx",
                             label="not observed (no sample)"))
    if p.squeezed:
        handles.append(Patch(facecolor="#f2f2f2", edgecolor="#c8c8c8", hatch="//",
                             label="quiet stretch, squeezed"))
    for warning, colour, what in ((True, "#c62828", "Warning"), (False, "#757575", "Normal")):
        if any(m.warning is warning for m in p.events):
            handles.append(Line2D([], [], marker="|", linestyle="", color=colour,
                                  markersize=9, label=f"supervisor Event ({what})"))
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.8, 0.5), fontsize=8,
               frameon=False)

    canvas = fig.canvas
    canvas.draw()
    renderer = canvas.get_renderer()  # type: ignore[attr-defined]
    texts = [t for t in strip.texts if t.get_gid() == "incident-label"]
    drawn = Drawn(
        world_ticks=tuple(t.get_text() for t in world.get_yticklabels()),
        labels=tuple(t.get_text() for t in texts),
        boxes=tuple(_box(t.get_window_extent(renderer).extents) for t in texts),
        squeezed=tuple(t.get_text() for t in rate.texts if t.get_gid() == "squeezed"),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={
        "Title": p.title.replace("\n", "; "), "Software": "elastic-supervisor timeline",
        METADATA_KEY: drawn.to_json()})
    return drawn


def _box(extents: Sequence[float]) -> tuple[float, float, float, float]:
    x0, y0, x1, y1 = (round(float(v), 1) for v in extents)
    return x0, y0, x1, y1


def read_png_text(path: Path) -> dict[str, str]:
    """The text chunks (tEXt, zTXt, iTXt) of the PNG `path`: keyword -> text."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    out, i = {}, 8
    while i + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        body = data[i + 8:i + 8 + length]
        i += 12 + length
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed
                                          else text).decode("utf-8")
        elif kind == b"IEND":
            break
    return out
