"""What the loop says (reports.Reports). Its one-time warnings about the hook (warnings): a
problem the hook reports is one HookProblem Event, and a framework it does not fence yet is one
HookFrameworkUnfenced Event per framework and run, whatever the number of hosts and ticks. And
the workers that joined or left the host list (membership)."""

from __future__ import annotations

from supervisor.config import parse_config
from supervisor.decide.hang import Verdict
from supervisor.decide.hostlist import Rendered
from supervisor.decide.memory import hang_settings
from supervisor.metrics import make_metrics
from supervisor.model import EventSpec
from supervisor.observe import Unusable
from supervisor.reports import Reports
from tests.helpers import Log


def reports(events: list[EventSpec] | None = None) -> tuple[Reports, Log]:
    """A Reports of a two-process job, with the log it writes (and `events` its Events)."""
    cfg = parse_config({"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n",
                        "SUPERVISOR_NP": "2"})
    log = Log()
    return Reports(cfg, log=log, metrics=make_metrics(),
                   events=print if events is None else events.append, channel=None,
                   hang_settings=hang_settings(cfg)), log


def test_an_unfenced_framework_is_said_once_per_run_and_apart_from_other_problems() -> None:
    events: list[EventSpec] = []
    loop, log = reports(events)
    verdict = Verdict(problems=(("10.0.0.1", "Horovod 0.27.0 is not 0.28.x: not patched"),),
                      unfenced=(("10.0.0.1", "horovod.mxnet"),
                                ("10.0.0.2", "horovod.mxnet")))
    for _ in range(3):  # three ticks
        loop.warnings(verdict, driver=object(), running_s=5.0)
    assert [(e.type, e.reason) for e in events] == [("Warning", "HookProblem"),
                                                     ("Warning", "HookFrameworkUnfenced")]
    assert events[1].note.startswith(
        "training processes on 2 host(s) ['10.0.0.1', '10.0.0.2'] use horovod.mxnet, "
        "which the hook does not fence (only horovod.torch and horovod.tensorflow): "
    ), events[1].note
    assert ("warning", "hook.framework_unfenced", {
        "framework": "horovod.mxnet", "hosts": ["10.0.0.1", "10.0.0.2"]}) in log.lines
    loop.new_run()  # a new run of horovodrun says it again
    loop.warnings(verdict, driver=object(), running_s=5.0)
    assert [e.reason for e in events[2:]] == ["HookProblem", "HookFrameworkUnfenced"]


def test_a_silent_process_not_yet_hung_is_said_once_per_silence_with_why() -> None:
    loop, log = reports()
    early = Verdict(busy=(("10.0.0.1", 7, 3.44, "R"),),
                    unconfirmed=(("10.0.0.2", 8, 3.01, 0.04),))
    for _ in range(3):  # three ticks of the same silences
        loop.warnings(early, driver=object(), running_s=5.0)
    assert [x for x in log.lines if x[1].startswith("worker.silent")] == [
        ("info", "worker.silent_but_running",
         {"host": "10.0.0.1", "pid": 7, "silent_s": 3.4, "state": "R"}),
        ("info", "worker.silent_unconfirmed",
         {"host": "10.0.0.2", "pid": 8, "silent_s": 3.0, "peer_waited_s": 0.0})]
    loop.warnings(Verdict(), driver=object(), running_s=5.0)  # they spoke again
    loop.warnings(early, driver=object(), running_s=5.0)
    assert len([x for x in log.lines if x[1].startswith("worker.silent")]) == 4


def test_the_membership_report_says_the_hosts_added_and_removed_and_nothing_when_the_same(
        ) -> None:
    """reports.Reports.membership: one workers.changed line (and a WorkersChanged Event while
    horovodrun runs) naming the hosts added and removed; a new host list with the same hosts
    says only the pods whose reason to be left out changed."""
    events: list[EventSpec] = []
    loop, log = reports(events)
    first = Rendered(lines=("10.0.0.1:1", "10.0.0.2:1"),
                     hosts={"10.0.0.1": "w-0", "10.0.0.2": "w-1"}, left_out={})
    loop.membership(None, first, running=False)
    assert [x[1:] for x in log.lines] == [("workers.changed", {
        "added": ["10.0.0.1", "10.0.0.2"], "removed": [], "usable": 2, "left_out": {}})]
    assert events == [], "no Event before horovodrun runs"
    later = Rendered(lines=("10.0.0.2:1", "10.0.0.3:1"),
                     hosts={"10.0.0.3": "w-2", "10.0.0.2": "w-1"},
                     left_out={"w-0": Unusable.FOUND_FAILED})
    loop.membership(first, later, running=True)
    assert log.lines[-2:] == [
        ("info", "workers.unusable", {"changed": {"w-0": "FoundFailed"}, "more": 0,
                                      "unusable": 1}),
        ("info", "workers.changed", {"added": ["10.0.0.3"], "removed": ["10.0.0.1"],
                                     "usable": 2, "left_out": {"w-0": "FoundFailed"}})]
    assert [e.note for e in events] == [
        "usable workers 2; added ['10.0.0.3']; removed ['10.0.0.1']"]
    said = len(log.lines)
    loop.membership(later, Rendered(lines=later.lines, hosts=dict(later.hosts),
                                    left_out=dict(later.left_out)), running=True)
    assert len(log.lines) == said and len(events) == 1, "the same hosts: nothing to say"
