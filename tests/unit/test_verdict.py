"""plan.on_verdict: hang.assess's verdict and the driver's reports of failed processes turned
into failures of the usual path and restarts of horovodrun (captured pod shape, fake clock)."""

from __future__ import annotations

import pytest

from supervisor.classify import Cause
from supervisor.hang import Broken, Hung, Stall, Stuck, Verdict
from supervisor.plan import EXITED_GRACE_S, on_verdict
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
    pytest.param(Verdict(stuck=Stuck(HOST, 2, 16.0)), "RendezvousStuck", id="stuck"),
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
