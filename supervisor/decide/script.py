"""PURE: the script's operations, what a decision asks the adapters to do, in order: the
actuator's writes (SaveState, CreatePod, DeletePod, KeepBudget: supervisor/actuator.py runs them,
in order per object, retrying the transient failures) and the loop's (Fence, KillSsh,
RestartHorovodrun, CreateWorker, KeepMinAvailable, FailJob)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.decide import fleet


@dataclass(frozen=True)
class SaveState:
    state: Mapping[str, Any]


@dataclass(frozen=True)
class CreatePod:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str | None
    grace_s: int | None


@dataclass(frozen=True)
class KeepBudget:
    """Create or update the workers' PodDisruptionBudget: not fatal when refused (the job
    trains without it; the loop says so)."""

    body: Mapping[str, Any]


Op = SaveState | CreatePod | DeletePod | KeepBudget


@dataclass(frozen=True)
class Fence:
    """Tell the hook in every training process: these hosts are gone (the driver skips them,
    survivors stalled on them leave their collective)."""

    hosts: frozenset[str]


@dataclass(frozen=True)
class KillSsh:
    """Kill horovodrun's ssh clients to these hosts (host -> the failed pod): a frozen worker
    never closes them, and Horovod waits on them."""

    pods: Mapping[str, str]


@dataclass(frozen=True)
class RestartHorovodrun:
    """Tell the training processes to exit, kill horovodrun's tree, start again at the gate."""

    reason: str  # the Event's reason: TrainingStalled, RendezvousBroken, RendezvousStuck
    why: str
    restart: int  # this restart's number (1-based)


@dataclass(frozen=True)
class CreateWorker:
    create: fleet.Create
    lost_nodes: tuple[str, ...]  # nodes down or silent: the replacement avoids them
    suspect_nodes: tuple[str, ...]  # nodes where a worker hung lately: preferred against
    ahead_of: str | None = None  # placed ahead of this worker's move (move_ahead)


@dataclass(frozen=True)
class KeepMinAvailable:
    """Keep the workers' PodDisruptionBudget at `min_available` (workers.disruption_budget;
    the loop hands the actuator its manifest: script.KeepBudget)."""

    min_available: int


@dataclass(frozen=True)
class FailJob:
    code: int
    reason: str
    event: bool  # post the JobFailing Event (a decision's own Event may have said it)
