"""What `elastic-supervisor status` asks the API server for (cli.job_status through the real
Kubernetes client, its HTTP layer faked), and the Events the recorder writes (kube.event_body):
at 1,000 workers a namespace holds thousands of Events, most of them the kubelet's and the
scheduler's, so the supervisor's are selected by the API server, not after the transfer."""

from __future__ import annotations

import ast
import gc
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from supervisor import cli, eventseries, kube
from supervisor.decide import fleet
from supervisor.model import EventSpec

ROOT = Path(__file__).resolve().parents[2]
NS, JOB = "team-a", "job1"
SUPERVISOR_EVENT = {"reportingController": kube.REPORTING_CONTROLLER, "type": "Warning",
                    "reason": "WorkerRestarting", "note": "worker job1-w0-1: ExitCode 1",
                    "eventTime": "2026-11-27T08:00:00.000000Z"}


class Response:
    def __init__(self, body: Any) -> None:
        self.data, self.status = json.dumps(body).encode(), 200

    def getheaders(self) -> dict[str, str]:
        return {}


class FakeApi(client.ApiClient):
    """The client with its HTTP requests answered from `bodies` (path -> body; absent: 404)
    and recorded as (method, path, query)."""

    def __init__(self, bodies: dict[str, Any]) -> None:
        super().__init__(client.Configuration(host="https://api.test"))
        self.bodies = bodies
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.collecting: list[bool] = []  # whether the cyclic collector ran, at each request
        self.lock = threading.Lock()

    def request(self, method: str, url: str, query_params: Any = None, *args: Any,
                **kw: Any) -> Response:
        path = urlsplit(url).path
        with self.lock:
            self.requests.append((method, path, dict(query_params or ())))
            self.collecting.append(gc.isenabled())
        if path not in self.bodies:
            e = ApiException(status=404, reason="Not Found")
            e.body = b"{}"
            raise e
        return Response(self.bodies[path])


def cluster() -> FakeApi:
    """A job of one worker with a state, no scale request, one supervisor Event."""
    state = {"desiredWorkers": 1, "restartLimit": 100, "ledger": {"total": 2}}
    return FakeApi({
        f"/api/v1/namespaces/{NS}/pods": {"items": [{
            "metadata": {"name": "job1-w0-1", "labels": {}}, "status": {"phase": "Running"}}]},
        f"/api/v1/namespaces/{NS}/configmaps/{fleet.state_name(JOB)}": {
            "metadata": {"resourceVersion": "7"}, "data": {"state.json": json.dumps(state)}},
        f"/apis/events.k8s.io/v1/namespaces/{NS}/events": {"items": [SUPERVISOR_EVENT]},
    })


def test_status_reads_the_workers_state_scale_and_only_the_supervisors_events() -> None:
    api = cluster()
    s = cli.job_status(api, JOB, NS)
    # Made at once, in any order.
    assert sorted((m, p, {k: v for k, v in q.items() if k != "timeoutSeconds"})
                  for m, p, q in api.requests) == [
        ("GET", f"/api/v1/namespaces/{NS}/configmaps/job1-supervisor-scale", {}),
        ("GET", f"/api/v1/namespaces/{NS}/configmaps/job1-supervisor-state", {}),
        ("GET", f"/api/v1/namespaces/{NS}/pods",
         {"labelSelector": "elastic-supervisor/job=job1,elastic-supervisor/role=worker"}),
        ("GET", f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
         {"fieldSelector": "reportingController=elastic-supervisor.io/supervisor"}),
    ]
    assert (s["listed"], s["restarts"], s["requested"]) == (
        1, {"used": 2, "limit": 100, "left": 98}, None)
    assert [d["reason"] for d in s["decisions"]] == ["WorkerRestarting"]


def test_the_status_command_reads_with_the_collector_paused_and_restores_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = cluster()
    monkeypatch.setattr(kube, "make_api_client", lambda: api)
    args = cli.build_parser().parse_args(["status", "--job", JOB, "-n", NS, "--output", "json"])
    assert gc.isenabled()
    assert cli.operate_command(args) == 0
    assert json.loads(capsys.readouterr().out)["listed"] == 1
    assert api.collecting == [False] * 4
    assert gc.isenabled()


def test_events_listed_without_a_controller_are_all_of_the_namespace() -> None:
    api = FakeApi({f"/apis/events.k8s.io/v1/namespaces/{NS}/events": {"items": []}})
    assert kube.list_events(api, NS) == []
    assert "fieldSelector" not in api.requests[0][2]


@pytest.mark.parametrize(("argv", "namespace"), [
    pytest.param(["status", "--job", JOB, "-n", NS], NS, id="-n as kubectl's"),
    pytest.param(["status", "--job", JOB, "--namespace", NS], NS, id="--namespace"),
    pytest.param(["scale", "--job", JOB, "-n", NS, "--add", "1"], NS, id="scale -n"),
    pytest.param(["status", "--job", JOB], None, id="none: the kubeconfig's, later"),
])
def test_the_namespace_is_given_as_kubectl_takes_it(argv: list[str], namespace: str | None
                                                    ) -> None:
    assert cli.build_parser().parse_args(argv).namespace == namespace


@pytest.mark.parametrize(("write", "series"), [
    pytest.param(eventseries.Write(EventSpec("Warning", "WorkerHung", "Detect", "x" * 2000),
                                   "launcher-0.abc"), None, id="a new Event, note cut at 1 KiB"),
    pytest.param(eventseries.Write(EventSpec("Normal", "WorkersChanged", "Discovery", "3 hosts"),
                                   "launcher-0.def", 4), 4, id="a series: its count"),
])
def test_the_recorder_writes_events_k8s_io_v1_events_and_series(
        write: eventseries.Write, series: int | None) -> None:
    when = "2026-11-27T08:00:00.123456Z"
    regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": "launcher-0"}
    body = kube.event_body(NS, write, when, instance="i" * 200, regarding=regarding)
    assert body == {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": write.name, "namespace": NS}, "eventTime": when,
        "type": write.spec.type, "reason": write.spec.reason, "action": write.spec.action,
        "note": write.spec.note[:1024], "reportingController": kube.REPORTING_CONTROLLER,
        "reportingInstance": "i" * 128, "regarding": regarding}
    assert write.create is (series is None)
    assert kube.series_patch(write, when) == {"series": {"count": write.count,
                                                         "lastObservedTime": when}}



def source(module: str) -> Path:
    """The file of `module` (a package's __init__.py)."""
    path = ROOT / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def module_imports(module: str) -> set[str]:
    """The modules `module` (supervisor.*) imports when it is imported: its top-level imports,
    not those inside functions."""
    tree = ast.parse(source(module).read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            if node.module.startswith("supervisor"):  # a module of a package is one too
                out |= {f"{node.module}.{a.name}" for a in node.names
                        if source(f"{node.module}.{a.name}").exists()}
    return out


def test_the_status_command_imports_none_of_the_supervisor_proper() -> None:
    # `status` is waited for: the loop, metrics, logs, process control and the hook channel
    # (a fifth of its second at 1,000 workers) are imported for `run` and `explain` only.
    loaded, todo = set(), ["supervisor.cli"]
    while todo:
        m = todo.pop()
        if m not in loaded:
            loaded.add(m)
            if m.startswith("supervisor.") and source(m).exists():
                todo += module_imports(m)
    assert {"supervisor.kube", "supervisor.operate", "kubernetes"} <= loaded
    assert not loaded & {"supervisor.runner", "supervisor.loop", "supervisor.metrics",
                         "supervisor.logs", "supervisor.proc", "supervisor.channel",
                         "prometheus_client", "structlog", "psutil", "watchfiles"}
    assert "supervisor.loop" in module_imports("supervisor.runner")
