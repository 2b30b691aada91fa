"""Small helpers shared by tests (no fixtures here: those live in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# node-monitor grace period of the session's control plane, seconds.
NODE_GRACE_S = 8
# ... of the session's cluster with real nodes (its kubelets renew their Leases every 10 s).
CLUSTER_NODE_GRACE_S = 20


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.1,
             what: str = "condition") -> T:
    """Poll `predicate` until it returns a truthy value and return it; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Log:
    """A structlog-shaped logger that keeps (level, event, fields) for each line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))
