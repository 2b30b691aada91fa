"""The cleanup at a supervisor's exit when its Job cannot be read (issue 39, item 4): a
transient API error is retried for a few seconds; a Job still unread, or a permanent error,
keeps the workers (`cleanup.kept`, Event WorkersKept): deleting them could end a job the Job
retries. Only a Job that is gone (404) is no Job; a success needs no Job to end the job.

cleanup.clean_up runs with the real client (kube.make_api_client from a kubeconfig) against a
loopback HTTP stand-in of the three API paths it uses, which answers the Job GET with scripted
statuses (the Status bodies a kube-apiserver sends) and records every call."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor import kube
from supervisor.cleanup import clean_up
from supervisor.config import parse_config
from supervisor.model import EventSpec
from tests.helpers import Log

NS, JOB = "team-a", "elastic-train"
OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "u1"}
JOB_PATH = f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
STATE_PATH = f"/api/v1/namespaces/{NS}/configmaps/{JOB}-supervisor-state"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


UNAVAILABLE = (503, status(503, "ServiceUnavailable", "the server is currently unable to "
                                                       "handle the request"))
FORBIDDEN = (403, status(403, "Forbidden", f'jobs.batch "{JOB}" is forbidden: User '
                         f'"system:serviceaccount:{NS}:elastic-supervisor" cannot get resource '
                         f'"jobs" in API group "batch" in the namespace "{NS}"'))
GONE = (404, status(404, "NotFound", f'jobs.batch "{JOB}" not found'))


def job(failed: int) -> tuple[int, dict[str, Any]]:
    """The launcher's Job, as read: backoffLimit 2, `failed` attempts failed before."""
    return 200, {"apiVersion": "batch/v1", "kind": "Job",
                 "metadata": {"name": JOB, "namespace": NS, "uid": "u1"},
                 "spec": {"backoffLimit": 2, "podFailurePolicy": {"rules": [
                     {"action": "FailJob", "onExitCodes": {"containerName": "launcher",
                                                           "operator": "In",
                                                           "values": [2, 4, 5, 6, 8, 9]}}]}},
                 "status": {"active": 1, **({"failed": failed} if failed else {})}}


@dataclass
class StandIn:
    """Answers the Job GET from `job_answers` (the last one repeats), a state that is not there
    yet, and the workers' deletecollection; keeps (method, path) of every call."""

    job_answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def answer(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        self.calls.append((method, path))
        base = path.split("?", 1)[0]
        if method == "GET" and base == JOB_PATH:
            return self.job_answers.pop(0) if len(self.job_answers) > 1 else self.job_answers[0]
        if method == "GET" and base == STATE_PATH:
            return 404, status(404, "NotFound", "configmaps not found")
        if method == "DELETE" and base == PODS_PATH:
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                {"metadata": {"name": f"{JOB}-w0-1"}}, {"metadata": {"name": f"{JOB}-w1-1"}}]}
        return 500, status(500, "InternalError", f"the stand-in has no {method} {base}")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[StandIn, Any]]:
    api_side = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            code, body = api_side.answer(self.command, self.path)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_DELETE = _reply

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    api = kube.make_api_client(str(kubeconfig))
    try:
        yield api_side, api
    finally:
        api.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


CFG = parse_config({"SUPERVISOR_JOB_NAME": JOB, "SUPERVISOR_NAMESPACE": NS,
                    "SUPERVISOR_NP": "2", "SUPERVISOR_API_TIMEOUT_SECONDS": "5"})
DELETE = ("DELETE", PODS_PATH)


def exit_with(standin: tuple[StandIn, Any], code: int, answers: list[tuple[int, dict]]
              ) -> tuple[list[tuple[str, str]], Log, list[EventSpec]]:
    api_side, api = standin
    api_side.job_answers = answers
    log, events = Log(), []
    clean_up(CFG, api, kube.StateStore(api, NS, f"{JOB}-supervisor-state", OWNER), code,
             owner=OWNER, log=log, events=events.append, read_budget_s=0.6)
    return [(m, p.split("?", 1)[0]) for m, p in api_side.calls], log, events


@pytest.mark.parametrize(("answers", "code"), [
    pytest.param([UNAVAILABLE], 1, id="503 for the whole retry budget"),
    pytest.param([FORBIDDEN], 1, id="403: our permission to read the Job is missing"),
    pytest.param([UNAVAILABLE, FORBIDDEN], 143, id="503, then 403: SIGTERM of a preempted pod"),
])
def test_a_job_that_cannot_be_read_keeps_the_workers(standin: tuple[StandIn, Any],
                                                     answers: list, code: int) -> None:
    calls, log, events = exit_with(standin, code, answers)
    assert DELETE not in calls and ("GET", STATE_PATH) not in calls, "nothing marked or deleted"
    kept = [f for lvl, ev, f in log.lines if ev == "cleanup.kept"]
    assert len(kept) == 1 and kept[0]["job"] == JOB and kept[0]["code"] == code
    assert [(e.type, e.reason, e.action) for e in events] == [
        ("Warning", "WorkersKept", "Cleanup")]
    note = events[0].note
    assert note.startswith(f"exit {code}: Job {JOB} could not be read, so whether another "
                           "launcher follows is unknown (")
    assert note.endswith("the workers are kept (SUPERVISOR_CLEAN_POD_POLICY=Running not "
                         "applied): the next launcher adopts them; if none follows, delete "
                         f"them with kubectl delete pods -l 'elastic-supervisor/job={JOB},"
                         "elastic-supervisor/slot'")


def test_a_transient_error_is_retried_then_the_jobs_word_decides(
        standin: tuple[StandIn, Any]) -> None:
    calls, log, events = exit_with(standin, 1, [UNAVAILABLE, UNAVAILABLE, job(failed=0)])
    assert calls.count(("GET", JOB_PATH)) == 3
    assert [ev for _, ev, _ in log.lines] == ["cleanup.api_retrying", "cleanup.api_retrying",
                                              "cleanup.skipped"], "retries left: adopted"
    assert DELETE not in calls and events == []


@pytest.mark.parametrize(("code", "answers"), [
    pytest.param(1, [UNAVAILABLE, job(failed=2)], id="503, then the Job's last attempt"),
    pytest.param(6, [job(failed=0)], id="FailJob code 6"),
    pytest.param(1, [GONE], id="the Job is gone (404): no launcher follows"),
    pytest.param(0, [UNAVAILABLE], id="a success: terminal whatever the Job says, not read"),
])
def test_a_confirmed_terminal_exit_deletes_the_workers(standin: tuple[StandIn, Any], code: int,
                                                       answers: list) -> None:
    calls, log, events = exit_with(standin, code, answers)
    assert DELETE in calls and log.lines[-1][1] == "cleanup.done"
    assert [e.reason for e in events] == ["WorkersCleanedUp"]
    if code == 0:
        assert ("GET", JOB_PATH) not in calls, "a success needs no word from the Job"
