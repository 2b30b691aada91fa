"""PURE: frozen value types shared by the loop and the adapters (no I/O, no client imports).

Triggers are what the loop consumes from its queue: watch events and reflector news
(put there by the reflector threads), the child's exit (child-waiter thread), signals (main
thread's handlers), a lost leader Lease (the elector's thread). EventSpec is a Kubernetes Event
to post; ExitCode lists the supervisor's own, documented exit codes (horovodrun's own code is
passed through otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from supervisor.observe import EventType, Kind


class JsonText(str):
    """A value already written as JSON the way `json.dumps(value, sort_keys=True)` writes it:
    the state's encoder (kube.encode_state) puts it in as it is. The fleet's slots are stored
    so, from a text kept per slot (fleet.stored_slots): at 10,000 slots encoding them all again
    took ~12 ms of every save before a create, with the loop waiting on the interpreter's
    lock meanwhile."""


class ExitCode(IntEnum):
    """Exit codes of `elastic-supervisor` itself (docs/operating.md). Others are horovodrun's."""

    OK = 0
    CONFIG = 2  # bad configuration (also horovodrun's own argument errors)
    START_TIMEOUT = 3  # MIN_NP usable slots never showed up within START_TIMEOUT_SECONDS
    KUBE_FATAL = 4  # the Kubernetes API refused us for good (403, no credentials)
    POLICY_FAILED = 5  # a FailJob rule matched a worker failure
    WORKERS_LOST = 6  # too few workers left to reach MIN_NP (dropped, restart limits used up)
    LEADERSHIP_LOST = 7  # another launcher holds the leader Lease: horovodrun stopped at once
    HOOK_REFUSED = 8  # horovodrun's driver could not be hardened (elastic_supervisor_hook)
    STALLED = 9  # horovodrun needed restarting more than HOROVODRUN_RESTART_LIMIT times
    INTERNAL = 70  # a bug: an unexpected exception in the supervisor


@dataclass(frozen=True)
class WatchEvent:
    kind: Kind
    type: EventType
    obj: Mapping[str, Any]
    at: float  # monotonic time of receipt
    relist: bool = False  # synthesised by a relist diff, not seen on a watch


@dataclass(frozen=True)
class SourceState:
    """A reflector's own news: synced (a list completed) / connected / broken (and why)."""

    kind: Kind
    at: float
    synced: bool | None = None
    broken: bool | None = None
    reason: str = ""
    relisted: bool = False
    fatal: bool = False  # the reflector gave up (permanent API error, or crashed)
    crashed: bool = False  # ... because of a bug (unexpected exception)


@dataclass(frozen=True)
class ChildExited:
    code: int
    pid: int | None = None  # which child (a restarted horovodrun's predecessor is ignored)


@dataclass(frozen=True)
class SignalReceived:
    signum: int


@dataclass(frozen=True)
class ActionDone:
    """The outcome of one change the actuator made (or could not make) to the cluster."""

    what: str  # save | create | delete
    name: str  # the pod name, or "state"
    at: float  # monotonic
    started_at: float | None = None
    error: str | None = None  # None: done
    fatal: bool = False  # the run cannot go on (403, another writer, a bug)
    retrying: bool = False  # a retryable error; the actuator keeps trying
    refused: bool = False  # admission refused the pod (quota, PodSecurity): not retried here
    note: str = ""  # e.g. "already exists"
    began_at: float | None = None  # monotonic: its first try began (set when done)
    pod_at: float | None = None  # monotonic: a create's pod call returned (before its Secret)


@dataclass(frozen=True)
class LeadershipLost:
    """Another launcher holds the leader Lease: it may drive the workers now."""

    reason: str


@dataclass(frozen=True)
class LeadershipPaused:
    """The leader Lease could not be renewed in time (the API unreachable): nothing is written
    until it is renewed again; training goes on."""

    reason: str


@dataclass(frozen=True)
class LeadershipResumed:
    """The leader Lease was renewed again after `paused_s` seconds paused."""

    paused_s: float


@dataclass(frozen=True)
class PolicyChanged:
    """The policy file changed: the new policy (a supervisor.decide.policy.Policy), or why not."""

    at: float
    policy: Any | None  # None: rejected, `problems` say why
    problems: tuple[str, ...] = ()


Trigger = (WatchEvent | SourceState | ChildExited | SignalReceived | ActionDone
           | PolicyChanged | LeadershipLost | LeadershipPaused | LeadershipResumed)


@dataclass(frozen=True)
class EventSpec:
    """One Kubernetes Event to post: type Normal|Warning, reason, action, note (<= 1 kB)."""

    type: str
    reason: str
    action: str
    note: str
