"""A write's client timeout ends at the leader's renew deadline (kube.write_timeout)."""

from __future__ import annotations

import pytest

from supervisor.kube import MIN_WINDOW_S, NotLeading, write_timeout


@pytest.mark.parametrize(("left", "timeout"), [
    (None, (5.0, 30.0)),  # no leader election: the write's own timeout
    (40.0, (5.0, 30.0)),
    (12.0, (5.0, 12.0)),
    (2.5, (2.5, 2.5)),
    (MIN_WINDOW_S, (MIN_WINDOW_S, MIN_WINDOW_S)),
])
def test_the_timeout_is_cut_to_what_is_left(left: float | None,
                                            timeout: tuple[float, float]) -> None:
    window = None if left is None else (lambda: left)
    assert write_timeout((5.0, 30.0), window, "create pod ns/w") == timeout


@pytest.mark.parametrize("left", [0.0, -3.0, MIN_WINDOW_S / 2])
def test_no_write_starts_with_too_little_left(left: float) -> None:
    with pytest.raises(NotLeading, match=r"^create pod ns/w: not sent, \d\.\ds left"):
        write_timeout((5.0, 30.0), lambda: left, "create pod ns/w")
    assert NotLeading("x").retryable
