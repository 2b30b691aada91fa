"""PURE: worker creates that admission refused, and when to try each again.

A ResourceQuota that is full, a LimitRange or a namespace enforcing PodSecurity refuse a worker
pod with a 403 that is not about the supervisor's own permissions: waiting can help (quota is
freed, the namespace is relabelled), failing the job cannot. The loop keeps one `Refusal` per
pod name; the pod is not created again before `retry_at` (exponential backoff, 1 s
doubling to 30 s), and the job trains on within MIN_NP meanwhile. Times are monotonic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class Refusal:
    attempts: int  # creates refused so far
    retry_at: float  # not before this (monotonic seconds)
    reason: str  # the API's words, from the last refusal


def refused(previous: Refusal | None, reason: str, now: float) -> Refusal:
    """Return the record after one more refusal at `now`."""
    attempts = (previous.attempts if previous is not None else 0) + 1
    delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (attempts - 1))
    return Refusal(attempts, now + delay, reason)


def waiting(blocked: Mapping[str, Refusal], now: float) -> set[str]:
    """Return the pod names not to create yet."""
    return {name for name, r in blocked.items() if r.retry_at > now}
