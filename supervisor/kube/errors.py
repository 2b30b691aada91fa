"""ADAPTER: the Kubernetes client's errors mapped to our own `KubeError`s: an RBAC denial of our
own verbs (`Forbidden`) is permanent, an admission refusal of an object (`Refused`: quota,
LimitRange, PodSecurity) is not; and the client timeouts every call but a watch has."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from kubernetes.client.rest import ApiException

# ---- errors -------------------------------------------------------------------------------------

class KubeError(Exception):
    """An API call failed. `retryable` says whether trying again later can help."""

    retryable = True

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = message  # the API's own words (e.g. for an Event note)


class Forbidden(KubeError):
    """403 from the authorizer: the supervisor's own permission is missing. Permanent."""

    retryable = False


class Refused(KubeError):
    """403 from admission: the request was allowed, this object was not (ResourceQuota
    exceeded, LimitRange, PodSecurity, a webhook). Freed quota or a relabelled namespace can
    admit it later: wait and retry, never fail the job for it. `detail` is the API's reason."""


class Gone(KubeError):
    """410: the resourceVersion is too old; relist."""


class NotFound(KubeError):
    retryable = False


class Damaged(KubeError):
    """An object we keep holds what we cannot read (hand-edited, truncated): permanent until
    someone fixes or deletes it; never reset in its place."""

    retryable = False


class Conflict(KubeError):
    """409: someone else wrote first (optimistic concurrency, or a quota being updated)."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: an object of that name is there (a create already done)."""


# The authorizer's denial: 'User "system:serviceaccount:ns:sa" cannot create resource "pods"
# in API group "" in the namespace "ns"'. OwnerReferencesPermissionEnforcement's: "cannot set
# blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on" /
# "cannot set an ownerRef on a resource you can't delete": also our own permission.
_DENIED = re.compile(r'\bcannot \w+ resource "|\bcannot set (blockOwnerDeletion|an ownerRef)\b')


def map_error(e: Exception, what: str) -> KubeError:
    """Return our error for a client exception raised while doing `what`."""
    if isinstance(e, ApiException):
        status = e.status
        reason, why = _status(e)
        err: KubeError
        if status == 403 and not _DENIED.search(reason):
            err = Refused(f"{what}: refused by admission: {reason}", 403)
        elif status == 403:
            err = Forbidden(f"{what}: forbidden: {reason}", 403)
        elif status == 410:
            err = Gone(f"{what}: resourceVersion expired (410 Gone)", 410)
        elif status == 404:
            err = NotFound(f"{what}: not found: {reason}", 404)
        elif status == 409 and why == "AlreadyExists":
            err = AlreadyExists(f"{what}: already exists: {reason}", 409)
        elif status == 409:
            err = Conflict(f"{what}: conflict: {reason}", 409)
        else:
            err = KubeError(f"{what}: HTTP {status}: {reason}", status)
            err.retryable = status in (429,) or (status or 0) >= 500 or status == 0
        err.detail = reason
        return err
    err = KubeError(f"{what}: {type(e).__name__}: {e}")
    err.detail = f"{type(e).__name__}: {e}"
    return err


def _status(e: ApiException) -> tuple[str, str]:
    """Return the Status message (else the HTTP reason) and the Status reason of `e`."""
    try:
        body = json.loads(e.body or "{}")
        return body.get("message") or e.reason or "", body.get("reason") or ""
    except (ValueError, AttributeError):
        return str(e.reason), ""


def request_timeout(timeout_s: float) -> tuple[float, float]:
    """The client's (connect, read) timeout for a call that may take `timeout_s` seconds."""
    return min(5.0, timeout_s), timeout_s


class NotLeading(KubeError):
    """A write not sent: the leader's renew deadline is (about to be) passed. Retried once
    leadership is back; a standby may own the job by then."""


# Below this much time left before the renew deadline a write is not started at all.
MIN_WINDOW_S = 0.2


def write_timeout(timeout: tuple[float, float], window: Callable[[], float] | None,
                  what: str) -> tuple[float, float]:
    """The (connect, read) timeout of a write: its own, cut to what is left of the leader's
    renew deadline (`window`: seconds), so that a write started just before it cannot land
    after a standby took the job over (the connection is closed at the deadline, and a request
    it still held is never sent). NotLeading when too little is left to start one."""
    if window is None:
        return timeout
    left = window()
    if left < MIN_WINDOW_S:
        raise NotLeading(f"{what}: not sent, {max(0.0, left):.1f}s left before the leader's "
                         "renew deadline")
    return min(timeout[0], left), min(timeout[1], left)


