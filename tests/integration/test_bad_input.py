"""Bad input found at start: one line naming the thing and what is accepted, exit 2, before
any worker is created (a real supervisor process with a worker template, on the real control
plane) and without touching a file that is not the supervisor's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.model import ExitCode
from tests.integration.harness import Job
from tests.integration.managed import (  # noqa: F401 (job and supervisor fixtures)
    job_fixture,
    supervisor_fixture,
)

HOSTS = "127.0.0.1 localhost\n"  # somebody's file, not a host list the supervisor wrote


def a_directory(tmp: Path) -> dict[str, str]:
    (tmp / "edl" / "hostfile").mkdir(parents=True)
    return {}


def a_foreign_file(tmp: Path) -> dict[str, str]:
    (tmp / "edl").mkdir()
    (tmp / "edl" / "hostfile").write_text(HOSTS)
    return {}


def hostname_template(tmp: Path) -> dict[str, str]:
    doc = json.loads((tmp / "worker.json").read_text())
    doc["spec"]["hostname"] = "worker"
    (tmp / "hostname.json").write_text(json.dumps(doc))
    return {"SUPERVISOR_WORKER_TEMPLATE": str(tmp / "hostname.json")}


def on_failure_template(tmp: Path) -> dict[str, str]:
    doc = json.loads((tmp / "worker.json").read_text())
    doc["spec"]["restartPolicy"] = "OnFailure"
    (tmp / "onfailure.json").write_text(json.dumps(doc))
    return {"SUPERVISOR_WORKER_TEMPLATE": str(tmp / "onfailure.json")}


CASES: dict[str, tuple[Callable[[Path], dict[str, str]], str]] = {
    "horovodrun not on PATH": (
        lambda tmp: {"SUPERVISOR_HOROVODRUN": "horovodrun-nowhere"},
        "SUPERVISOR_HOROVODRUN='horovodrun-nowhere': not found on PATH; expected the "
        "horovodrun executable (a name on PATH or an absolute path)"),
    "horovodrun path missing": (
        lambda tmp: {"SUPERVISOR_HOROVODRUN": str(tmp / "bin" / "horovodrun")},
        "SUPERVISOR_HOROVODRUN='{tmp}/bin/horovodrun': not an executable file; expected the "
        "horovodrun executable (a name on PATH or an absolute path)"),
    "discovery file is a directory": (
        a_directory,
        "SUPERVISOR_DISCOVERY_FILE='{tmp}/edl/hostfile': is a directory; expected a file "
        "path in a writable directory (an emptyDir)"),
    "discovery directory not writable": (
        lambda tmp: {"SUPERVISOR_DISCOVERY_FILE": "/sys/kernel/hostfile"},
        "SUPERVISOR_DISCOVERY_FILE='/sys/kernel/hostfile': its directory cannot be written "
        "([Errno 13] Permission denied); expected a file path in a writable directory "
        "(an emptyDir)"),
    "discovery file is someone else's": (
        a_foreign_file,
        "SUPERVISOR_DISCOVERY_FILE='{tmp}/edl/hostfile': exists and is not a host list the "
        "supervisor wrote (line 1: '127.0.0.1 localhost'); refusing to replace it: point it "
        "at a file of its own (an emptyDir)"),
    "job name too long for pod names": (
        lambda tmp: {"SUPERVISOR_JOB_NAME": "j" * 60},
        "SUPERVISOR_JOB_NAME='" + "j" * 60 + "': expected at most 53 characters: worker pods "
        "are named <job>-w<slot>-<incarnation>, at most 63 characters, for up to 2 workers"),
    "template sets a hostname": (
        hostname_template,
        "SUPERVISOR_WORKER_TEMPLATE='{tmp}/hostname.json': template.spec.hostname: must be "
        "empty (every worker would get the same host name)"),
    "template restartPolicy not Never": (
        on_failure_template,
        "SUPERVISOR_WORKER_TEMPLATE='{tmp}/onfailure.json': template.spec.restartPolicy: "
        "'OnFailure': expected Never (the supervisor replaces failed workers itself; a kubelet "
        "restarting one in place would give its slot a second, unplanned life)"),
    "resync out of range": (
        lambda tmp: {"SUPERVISOR_RESYNC_SECONDS": "0.0001"},
        "SUPERVISOR_RESYNC_SECONDS='0.0001': expected a number of seconds from 0.05 to 60"),
    "staleness out of range": (
        lambda tmp: {"SUPERVISOR_STALENESS_SECONDS": "0.1"},
        "SUPERVISOR_STALENESS_SECONDS='0.1': expected a number of seconds from 1 to 3600"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2_before_any_worker(
        job: Job, supervisor, tmp_path: Path, case: str) -> None:
    job.node("n1")
    setup, line = CASES[case]
    job.template(tmp_path / "worker.json")
    env = setup(tmp_path)
    sup = supervisor(**env)
    assert sup.wait_exit(20) == ExitCode.CONFIG, sup.output()
    assert sup.output().splitlines() == [
        "elastic-supervisor: " + line.replace("{tmp}", str(tmp_path))]
    assert job.pods() == {}
    if case == "discovery file is someone else's":
        assert (tmp_path / "edl" / "hostfile").read_text() == HOSTS
