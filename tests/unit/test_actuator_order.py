"""Which queued operation may run next (supervisor.actuator.runnable): per-object order, state
saves before the pod operations submitted after them, backoff, and nothing else waiting."""

from __future__ import annotations

import pytest

from supervisor.actuator import Pending, runnable
from supervisor.decide.script import CreatePod, DeletePod, KeepBudget, SaveState


def create(name: str) -> CreatePod:
    return CreatePod({"metadata": {"name": name}})


def delete(name: str) -> DeletePod:
    return DeletePod(name, "uid-" + name, 0)


SAVE = SaveState({"n": 1})
BUDGET = KeepBudget({"metadata": {"name": "job1-supervisor-workers"}})


def queue(*ops: object, running: tuple[int, ...] = (),
          backoff: dict[int, float] | None = None) -> list[Pending]:
    """Pending operations numbered from 1 in submission order."""
    items = [Pending(i, op, 0.0) for i, op in enumerate(ops, 1)]  # type: ignore[arg-type]
    for p in items:
        p.running = p.seq in running
        p.not_before = (backoff or {}).get(p.seq, 0.0)
    return items


CASES = {
    "first in order": (queue(create("a"), delete("b")), 1),
    "a create in backoff does not hold a later delete":
        (queue(create("a"), delete("b"), backoff={1: 5.0}), 2),
    "a running create does not hold another pod":
        (queue(create("a"), create("b"), running=(1,)), 2),
    "one object's operations in order": (queue(create("a"), delete("a"), running=(1,)), None),
    "a backing-off object holds its own later operation":
        (queue(create("a"), delete("a"), backoff={1: 5.0}), None),
    "a pod waits for the state saved before it": (queue(SAVE, create("a"), running=(1,)), None),
    "a state save in backoff holds the pods after it":
        (queue(SAVE, create("a"), delete("b"), backoff={1: 5.0}), None),
    "a pod submitted before the save is not held": (queue(delete("b"), SAVE, running=(2,)), 1),
    "a save does not wait for pods": (queue(create("a"), SAVE, running=(1,)), 2),
    "backoff over": (queue(create("a"), backoff={1: 0.5}), 1),
    "the budget waits for the state saved before it": (queue(SAVE, BUDGET, running=(1,)), None),
    "a budget in backoff holds no pod": (queue(BUDGET, create("a"), backoff={1: 5.0}), 2),
    "the budget's updates in order": (queue(BUDGET, BUDGET, running=(1,)), None),
    "nothing": ([], None),
}


@pytest.mark.parametrize("name", CASES)
def test_runnable(name: str) -> None:
    items, expected = CASES[name]
    got = runnable(items, now=1.0)
    assert (got.seq if got is not None else None) == expected
