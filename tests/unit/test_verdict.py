"""verdicts.on_verdict: hang.assess's verdict and the driver's reports of failed processes turned
into failures of the usual path and restarts of horovodrun (captured pod shape, fake clock)."""

from __future__ import annotations

import pytest

from supervisor.decide.classify import Cause
from supervisor.decide.hang import Broken, Hung, RendezvousStuck, Stall, Stuck, Verdict
from supervisor.decide.verdicts import EXITED_GRACE_S, on_verdict
from tests.unit import shapes

NOW = 500.0
HOST, OTHER = "10.1.0.10", "10.1.0.11"
POD = shapes.pod("w-0", ip=HOST, node="node-a")
PODS = {"w-0": POD, "w-1": shapes.pod("w-1", ip=OTHER, node="node-b")}
LISTED = {HOST: "w-0", OTHER: "w-1"}
HUNG = Hung(HOST, 7, 3.4, "silent")


@pytest.mark.parametrize(("verdict", "exited", "failed", "expected"), [
    pytest.param(Verdict(hung=(HUNG,)), {}, frozenset(), [("w-0", Cause.HUNG, None)],
                 id="a hung worker: a Hung failure"),
    pytest.param(Verdict(hung=(HUNG,)), {}, frozenset({"uid-w-0"}), [],
                 id="already failed: not twice"),
    pytest.param(Verdict(hung=(Hung("10.9.9.9", 7, 3.4, "silent"),)), {}, frozenset(), [],
                 id="its host is not published: nothing"),
    pytest.param(Verdict(), {OTHER: (137, NOW - EXITED_GRACE_S)}, frozenset(),
                 [("w-1", Cause.EXIT_CODE, 137)],
                 id="the driver saw its process exit 137, the pod runs on: ExitCode 137"),
    pytest.param(Verdict(), {OTHER: (137, NOW - 1.0)}, frozenset(), [],
                 id="within the grace: the pod's own status may say it first"),
    pytest.param(Verdict(hung=(Hung(OTHER, 8, 3.1, "silent"),)),
                 {OTHER: (137, NOW - 5.0)}, frozenset(), [("w-1", Cause.HUNG, None)],
                 id="hung and exited: one failure"),
])
def test_failures_found_by_the_hook(verdict: Verdict, exited: dict[str, tuple[int, float]],
                                    failed: frozenset[str],
                                    expected: list[tuple[str, Cause, int | None]]) -> None:
    d = on_verdict(verdict, LISTED, PODS, failed, exited, stall_timeout_s=1800, now=NOW)
    assert [(f.pod, f.cause, f.exit_code) for f, _ in d.failures] == expected
    assert [f.node for f, _ in d.failures] == [PODS[p]["spec"]["nodeName"]
                                                for p, _, _ in expected]
    assert [n.k8s.reason for n in d.notes if n.k8s] == [
        "WorkerHung" if c is Cause.HUNG else "WorkerProcessExited" for _, c, _ in expected]
    assert d.restart is None


@pytest.mark.parametrize(("verdict", "reason"), [
    pytest.param(Verdict(broken=Broken(HOST, 1)), "RendezvousBroken", id="broken"),
    pytest.param(Verdict(rendezvous_stuck=RendezvousStuck(HOST, 2, 16.0)), "RendezvousStuck",
                 id="stuck"),
    pytest.param(Verdict(stall=Stall(1900.0, 2)), "TrainingStalled", id="stalled"),
    pytest.param(Verdict(broken=Broken(HOST, 1), stall=Stall(1900.0, 2)),
                 "RendezvousBroken", id="broken before stalled"),
    pytest.param(Verdict(), None, id="nothing"),
])
def test_restarts_of_horovodrun(verdict: Verdict, reason: str | None) -> None:
    d = on_verdict(verdict, LISTED, PODS, frozenset(), {}, stall_timeout_s=1800, now=NOW)
    assert (d.restart[0] if d.restart else None) == reason
    if reason == "RendezvousStuck":
        assert d.restart is not None and d.restart[1].startswith(
            "all 2 host(s) of horovodrun's world waited in its rendezvous for 16s after worker "
            f"{HOST} failed")


STUCK = Stuck(OTHER, 8, 1, 21.0, 20.0, 1, 20.5, ("train.py:88 step", "train.py:120 <module>"),
              "process 8 (rank 1): its main thread has not moved for 21s (...)")


def test_a_stuck_worker_is_a_hung_failure_with_its_own_event() -> None:
    d = on_verdict(Verdict(stuck=(STUCK,)), LISTED, PODS, frozenset(), {},
                   stall_timeout_s=1800, now=NOW)
    assert [(f.pod, f.cause, f.node, f.detail) for f, _ in d.failures] == [
        ("w-1", Cause.HUNG, "node-b", STUCK.detail)]
    (note,) = d.notes
    assert note.event == "worker.stuck" and note.k8s is not None
    assert note.k8s.reason == "WorkerStuck"
    assert note.k8s.note == f"worker w-1 ({OTHER}, node node-b): {STUCK.detail}"
    assert note.fields["where"] == list(STUCK.where) and note.fields["rank"] == 1
    both = on_verdict(Verdict(hung=(Hung(OTHER, 8, 3.1, "silent"),), stuck=(STUCK,)), LISTED,
                      PODS, frozenset(), {}, stall_timeout_s=1800, now=NOW)
    assert len(both.failures) == 1, "one failure per pod"
