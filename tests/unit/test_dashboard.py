"""The Grafana dashboard (manifests/grafana/) asks only for what the supervisor exports.

Every panel target's and template variable's PromQL is tokenized; each elastic_supervisor_*
name must be a sample name of a family in make_metrics().registry (a counter's `_total`, a
gauge's own name, a histogram's `_bucket`, `_sum`, `_count`), each label it is matched on,
grouped by or shown in a legend must be one of the family's labels (or `le`, or the scrape's
`namespace` and `pod`), and each `$variable` must be defined. The issue 26 metrics must all be
on a panel. The layout is checked too: valid JSON, unique panel ids, panels on the 24-column
grid that do not overlap, every query on the `${DS_PROMETHEUS}` data source input. Doctored
dashboards prove each check can fail.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from supervisor.metrics import make_metrics

GRAFANA = Path(__file__).resolve().parents[2] / "manifests" / "grafana"
DASHBOARD = GRAFANA / "elastic-supervisor-dashboard.json"
PREFIX = "elastic_supervisor_"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# The labels a Prometheus scrape of the launcher pod adds (a PodMonitor, or the usual
# kubernetes-pods job) that the dashboard relies on to pick a job.
SCRAPE_LABELS = frozenset({"namespace", "pod"})
BUILTIN_VARIABLES = frozenset({"__rate_interval", "__interval", "__range"})
# The sample names each family type exposes (prometheus_client's text format).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
# Issue 26's metrics (the data contract): each on at least one panel.
ISSUE_26_FAMILIES = {f"{PREFIX}{name}" for name in (
    "training_steps", "steps_recomputed", "training_step_rate", "world_size",
    "world_size_desired", "goodput_ratio", "productive_worker_seconds", "lost_worker_seconds",
    "incidents", "incident_phase_seconds")}
# And the existing ones the issue's dashboard shows.
SHOWN_FAMILIES = ISSUE_26_FAMILIES | {f"{PREFIX}{name}" for name in (
    "worker_failures", "horovodrun_restarts", "discovery_latency_seconds",
    "replacement_latency_seconds", "restart_budget_left", "watch_last_event_age_seconds")}
# Both goodputs: at the size asked for and training at all.
SHOWN_MATCHERS = {(f"{PREFIX}goodput_ratio", "of", "full"),
                  (f"{PREFIX}goodput_ratio", "of", "any")}

TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_:][A-Za-z0-9_:]*|\[[^\]]*\]|\S')
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: frozenset[str]


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard, where it is and how its series are named."""

    where: str
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Parsed:
    metrics: tuple[str, ...]  # elastic_supervisor_* sample names, in order
    matchers: tuple[tuple[str, str, str], ...]  # (sample name, label, value)
    grouping: frozenset[str]  # labels of every by (...) / without (...)


def exported() -> dict[str, Family]:
    """Return each sample name the supervisor's registry exposes -> its family."""
    metrics = make_metrics()
    labels = {m.describe()[0].name: frozenset(m._labelnames)
              for m in (getattr(metrics, f.name) for f in fields(metrics))
              if isinstance(m, MetricWrapperBase)}
    names: dict[str, Family] = {}
    for family in metrics.registry.collect():
        for suffix in SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            names[family.name + suffix] = Family(family.name, family.type,
                                                 labels[family.name] | extra)
    return names


def parse(expr: str) -> Parsed:
    """Return the supervisor's sample names, their label matchers and the grouping labels."""
    tokens = TOKEN.findall(expr)
    metrics: list[str] = []
    matchers: list[tuple[str, str, str]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith(PREFIX):
            metrics.append(token)
            if i + 1 < len(tokens) and tokens[i + 1] == "{":
                i += 2
                while tokens[i] != "}":
                    label, j = tokens[i], i + 1
                    while not tokens[j].startswith('"'):  # =, !=, =~, !~
                        j += 1
                    matchers.append((token, label, tokens[j][1:-1]))
                    i = j + 1 + (tokens[j + 1] == ",")
        elif token in ("by", "without") and i + 1 < len(tokens) and tokens[i + 1] == "(":
            i += 2
            while tokens[i] != ")":
                if tokens[i] != ",":
                    grouping.add(tokens[i])
                i += 1
        i += 1
    return Parsed(tuple(metrics), tuple(matchers), frozenset(grouping))


def queries(dashboard: dict[str, Any]) -> Iterator[Query]:
    """Yield every PromQL expression: the panels' targets and the query variables'."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield Query(f"panel {panel['title']!r} target {target['refId']}", target["expr"],
                        target.get("legendFormat", ""))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            yield Query(f"variable {var['name']}",
                        query["query"] if isinstance(query, dict) else query)


def metric_problems(dashboard: dict[str, Any], names: dict[str, Family]) -> list[str]:
    """Return what the dashboard's queries ask for that the registry does not export."""
    problems = []
    defined = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARIABLES
    for q in queries(dashboard):
        parsed = parse(q.expr)
        if not parsed.metrics:
            problems.append(f"{q.where}: no {PREFIX}* metric in {q.expr!r}")
        known = [names[m] for m in parsed.metrics if m in names]
        problems += [f"{q.where}: {m} is not exported (not a sample name of "
                     "supervisor.metrics.make_metrics()'s registry)"
                     for m in parsed.metrics if m not in names]
        problems += [f"{q.where}: {m} has no label {label!r} (its labels: "
                     f"{sorted(names[m].labels)}, scrape: {sorted(SCRAPE_LABELS)})"
                     for m, label, _ in parsed.matchers
                     if m in names and label not in names[m].labels | SCRAPE_LABELS]
        labels = SCRAPE_LABELS.union(*(f.labels for f in known))
        problems += [f"{q.where}: grouped by {label!r}, which none of its metrics has"
                     for label in sorted(parsed.grouping - labels)]
        # A legend names the labels the aggregation keeps: those of its by (...).
        problems += [f"{q.where}: legend {{{{{label}}}}} is not a label it groups by "
                     f"({sorted(parsed.grouping)})"
                     for label in LEGEND_LABEL.findall(q.legend)
                     if label not in parsed.grouping]
        problems += [f"{q.where}: ${var} is not a variable of the dashboard ({sorted(defined)})"
                     for var in VARIABLE.findall(q.expr) if var not in defined]
    return problems


def layout_problems(dashboard: dict[str, Any]) -> list[str]:
    """Return duplicate panel ids, panels off the 24-column grid or overlapping, and panels
    or targets not on the ${DS_PROMETHEUS} data source."""
    problems = []
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    problems += [f"panel id {i} is used {ids.count(i)} times"
                 for i in sorted(set(ids)) if ids.count(i) > 1]
    boxes = []
    for p in panels:
        g = p["gridPos"]
        if g["x"] < 0 or g["y"] < 0 or g["w"] <= 0 or g["h"] <= 0 or g["x"] + g["w"] > 24:
            problems.append(f"panel {p['title']!r}: gridPos {g} is off the 24-column grid")
        boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for n, (a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        problems += [f"panels {a!r} and {b!r} overlap" for b, bx0, by0, bx1, by1 in boxes[n + 1:]
                     if ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1]
    for p in panels:
        if p["type"] == "row":
            continue
        sources = [p.get("datasource"), *(t.get("datasource") for t in p["targets"])]
        if any(s != DATASOURCE for s in sources):
            problems.append(f"panel {p['title']!r}: data source {sources}, not {DATASOURCE}")
    return problems


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


@pytest.fixture(scope="module")
def names() -> dict[str, Family]:
    return exported()


def test_every_query_asks_for_exported_metrics_and_labels(
        dashboard: dict[str, Any], names: dict[str, Family]) -> None:
    assert metric_problems(dashboard, names) == []


def test_the_issue_26_metrics_and_the_supervisors_health_are_all_on_panels(
        dashboard: dict[str, Any], names: dict[str, Family]) -> None:
    parsed = [parse(q.expr) for q in queries(dashboard) if not q.where.startswith("variable")]
    used = {names[m].name for p in parsed for m in p.metrics if m in names}
    assert SHOWN_FAMILIES - used == set()
    assert SHOWN_MATCHERS - {m for p in parsed for m in p.matchers} == set()
    missing = ISSUE_26_FAMILIES - {f.name for f in names.values()}
    assert missing == set(), "supervisor/metrics.py lacks issue 26's metrics"


def test_the_layout_is_valid_and_every_query_uses_the_data_source_input(
        dashboard: dict[str, Any]) -> None:
    assert layout_problems(dashboard) == []
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    # Provisioned by file (the ConfigMap), the input is not substituted: the variable of the
    # same name resolves ${DS_PROMETHEUS} instead.
    assert {"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus"}.items() <= \
        dashboard["templating"]["list"][0].items()


def test_the_kustomization_makes_the_sidecars_configmap_of_the_dashboard() -> None:
    kustomization = yaml.safe_load((GRAFANA / "kustomization.yaml").read_text())
    assert kustomization["generatorOptions"]["labels"] == {"grafana_dashboard": "1"}
    [generator] = kustomization["configMapGenerator"]
    assert [GRAFANA / f.split("=")[-1] for f in generator["files"]] == [DASHBOARD]


def target_of(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    target: dict[str, Any] = next(
        p for p in dashboard["panels"] if p["title"] == title)["targets"][0]
    return target


@pytest.mark.parametrize(("title", "change", "problem"), [
    ("Step rate", ("training_step_rate", "training_step_rates"),
     "elastic_supervisor_training_step_rates is not exported"),
    ("Step rate", ("training_step_rate{", "training_step_rate_bucket{"),
     "elastic_supervisor_training_step_rate_bucket is not exported"),
    ("Steps in range", ("training_steps_total", "training_steps"),
     "elastic_supervisor_training_steps is not exported"),
    ("Incidents by cause", ("kind=~", "phase=~"),
     "elastic_supervisor_incidents_total has no label 'phase'"),
    ("Incidents by cause", ("by (cause, kind)", "by (reason, kind)"),
     "grouped by 'reason', which none of its metrics has"),
    ("Worker failures by cause / action", ("{{action}}", "{{why}}"),
     "legend {{why}} is not a label it groups by"),
    ("Goodput", ("$namespace", "$namspace"), "$namspace is not a variable"),
], ids=["a misspelt metric", "a bucket of a gauge", "a counter without _total",
        "a matcher on a label the family lacks", "grouping by a label no metric has",
        "a legend label the aggregation drops", "an undefined variable"])
def test_a_doctored_query_is_caught(dashboard: dict[str, Any], names: dict[str, Family],
                                    title: str, change: tuple[str, str], problem: str) -> None:
    doctored = copy.deepcopy(dashboard)
    for field in ("expr", "legendFormat"):
        target = target_of(doctored, title)
        target[field] = target[field].replace(*change)
    assert target_of(doctored, title) != target_of(dashboard, title)
    assert [p for p in metric_problems(doctored, names) if problem in p] != []


def test_a_missing_issue_26_metric_is_caught(dashboard: dict[str, Any],
                                             names: dict[str, Family]) -> None:
    without = {n: f for n, f in names.items() if f.name != f"{PREFIX}world_size_desired"}
    assert [p for p in metric_problems(dashboard, without)
            if "elastic_supervisor_world_size_desired is not exported" in p] != []


@pytest.mark.parametrize(("change", "problem"), [
    (lambda ps: ps[2].update(id=ps[1]["id"]), "is used 2 times"),
    (lambda ps: ps[2]["gridPos"].update(x=ps[1]["gridPos"]["x"] + 1), "overlap"),
    (lambda ps: ps[2]["gridPos"].update(x=20, w=6), "off the 24-column grid"),
    (lambda ps: ps[2]["targets"][0].update(datasource={"uid": "prometheus"}), "data source"),
], ids=["a duplicate id", "overlapping panels", "a panel past the grid's edge",
        "a target on a data source of its own"])
def test_a_doctored_layout_is_caught(dashboard: dict[str, Any], change: Any,
                                     problem: str) -> None:
    doctored = copy.deepcopy(dashboard)
    change(doctored["panels"])
    assert [p for p in layout_problems(doctored) if problem in p] != []
