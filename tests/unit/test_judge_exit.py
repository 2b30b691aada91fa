"""memory.judge_exit: horovodrun's exit seen while the leader Lease cannot be renewed is held, not
judged (a standby's training processes may have ended this run: on real nodes the cut-off
leader exited 1, a Job backoffLimit failure for a takeover); judged once the Lease is renewed.
The loop finishes with LEADERSHIP_LOST if the Lease is lost meanwhile
(tests/integration/test_leader.py runs it against the real control plane)."""

from __future__ import annotations

import pytest

from supervisor.decide.memory import judge_exit


@pytest.mark.parametrize(("held", "exited", "paused", "expected"), [
    pytest.param(None, None, False, (None, None), id="running, leading: nothing"),
    pytest.param(None, 1, False, (None, 1), id="an exit while leading: judged now"),
    pytest.param(None, 0, False, (None, 0), id="the end of training: judged now"),
    pytest.param(None, 1, True, (1, None), id="an exit while cut off from the Lease: held"),
    pytest.param(None, 0, True, (0, None), id="even a 0: whose job it was is not known yet"),
    pytest.param(1, None, True, (1, None), id="still cut off: still held"),
    pytest.param(1, None, False, (None, 1), id="the Lease renewed again: judged as any exit"),
    pytest.param(None, None, True, (None, None), id="cut off, horovodrun running: nothing"),
])
def test_an_exit_is_held_while_the_lease_cannot_be_renewed(
        held: int | None, exited: int | None, paused: bool,
        expected: tuple[int | None, int | None]) -> None:
    assert judge_exit(held, exited, paused=paused) == expected
