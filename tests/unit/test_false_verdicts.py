"""The real-node jobs' count of verdicts that destroyed healthy capacity (localcluster/job.py):
a Hung or stuck verdict, or a quarantine, is false unless the test silenced that pod or node
before it. Records as the supervisor logs them (supervisor/decide/verdicts.py and core.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from localcluster.job import false_verdicts

T0 = 1_790_000_000.0  # any wall time


def at(seconds: float) -> str:
    return dt.datetime.fromtimestamp(T0 + seconds, dt.UTC).isoformat().replace(
        "+00:00", "Z")


HUNG = {"event": "worker.hung", "pod": "job-w1-0", "host": "10.244.1.5", "pid": 41,
        "silent_s": 3.4, "detail": "sent no heartbeat for 3.4s", "timestamp": at(10)}
STUCK = {"event": "worker.stuck", "pod": "job-w0-2", "host": "10.244.2.7", "node": "es-node-2",
         "rank": 0, "still_s": 31.0, "timestamp": at(40)}
QUARANTINED = {"event": "node.quarantined", "node": "es-node-1", "failures": 2, "for_s": 3600,
               "timestamp": at(50)}


@pytest.mark.parametrize(("silenced", "false"), [
    ({}, [HUNG, STUCK, QUARANTINED]),
    ({"job-w1-0": T0 + 6, "job-w0-2": T0 + 9, "es-node-1": T0 + 45}, []),
    # silenced after the verdict: the verdict came first, on a healthy worker
    ({"job-w1-0": T0 + 11, "job-w0-2": T0 + 9, "es-node-1": T0 + 45}, [HUNG]),
    # a pod of the node, not the node: no node evidence for the quarantine
    ({"job-w1-0": T0 + 6, "job-w0-2": T0 + 9}, [QUARANTINED]),
])
def test_a_verdict_is_false_unless_its_pod_or_node_was_silenced_before(
        silenced: dict[str, float], false: list[dict[str, Any]]) -> None:
    other = {"event": "worker.failed", "pod": "job-w1-0", "timestamp": at(12)}
    assert false_verdicts([HUNG, other, STUCK, QUARANTINED], silenced) == false
