"""PURE: the script's operations, what a decision asks the actuator to do (supervisor/actuator.py
runs them, in order per object, retrying the transient failures)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
