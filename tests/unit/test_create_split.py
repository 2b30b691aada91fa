"""Where a create's time went (outcomes.create_split), from the times its ActionDone carries."""

from __future__ import annotations

import pytest

from supervisor.model import ActionDone
from supervisor.outcomes import create_split


def done(**kw: float | None) -> ActionDone:
    return ActionDone("create", "job1-w3-2", at=kw.pop("at", 10.5), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("d", "seen", "expected"), [
    pytest.param(done(started_at=10.1, began_at=10.25, pod_at=10.4), 10.0,
                 {"pass_ms": 100.0, "queued_ms": 150.0, "pod_ms": 150.0, "secret_ms": 100.0},
                 id="a replacement: the pass, behind the save, the pod, its Secret"),
    pytest.param(done(started_at=10.1, began_at=10.25, pod_at=10.4), None,
                 {"queued_ms": 150.0, "pod_ms": 150.0, "secret_ms": 100.0},
                 id="not a replacement (a scale-out): no failure to count from"),
    pytest.param(done(started_at=10.1, began_at=10.1, pod_at=10.5), 10.0,
                 {"pass_ms": 100.0, "queued_ms": 0.0, "pod_ms": 400.0, "secret_ms": 0.0},
                 id="no host keys: nothing after the pod"),
    pytest.param(done(started_at=10.1), 10.0, {"pass_ms": 100.0},
                 id="an outcome without the actuator's times: only what is known"),
])
def test_a_creates_time_is_split_where_it_went(d: ActionDone, seen: float | None,
                                               expected: dict[str, float]) -> None:
    assert create_split(d, seen) == pytest.approx(expected)
