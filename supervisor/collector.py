"""ADAPTER: Python's cyclic garbage collector, kept off the failure path.

At 10,000 workers the supervisor holds millions of long-lived objects: the pods and nodes it
watches, the decisions' memory, the renders. CPython's collection of its oldest generation
walks every one of them. Over the 10,000-worker replacement bench (gc.callbacks in the running
supervisor, 2026-12-01), 158 such collections took 100-395 ms each, and none found anything to
free. A failure whose pass met one waited for it: they were the p99 of a replacement.

So what has lived a while is frozen (gc.freeze): moved out of the generations, never walked
again, and still freed by its reference count like any object. At the first pass with nothing
to do, and then every REFREEZE_S at such a pass (MAX_DEFER_S later at the latest), what
survived since the last freeze is collected once, then frozen. The cost: a reference cycle
among frozen objects is never collected. The supervisor's objects are JSON-shaped trees, and a
cycle that formed before a freeze is collected by the collection just before it.

Every collection's pause is kept (gc.callbacks) and handed to the loop's histogram at its next
pass: a callback runs inside whatever allocation triggered the collection, on any thread, so it
only appends to a deque (no lock: a metric's lock held by the interrupted thread would deadlock).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REFREEZE_S = 60.0  # what survived since the last freeze is frozen this often
MAX_DEFER_S = 30.0  # ... at a pass with nothing to do, if one comes within this long


@dataclass(frozen=True)
class Frozen:
    """One collection and freeze: how long it took, and how many objects are frozen now."""

    took_s: float
    frozen: int


class Collector:
    """Installed by the runner for one run (`install` ... `uninstall`); `tick` after each pass."""

    def __init__(self, observe: Callable[[int, float], None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.observe, self.clock = observe, clock  # observe(generation, seconds)
        self.pauses: deque[tuple[int, float]] = deque(maxlen=4096)
        self.began = 0.0
        self.due = 0.0  # loop time of the next freeze (0: at the first pass with nothing to do)

    def install(self) -> None:
        gc.callbacks.append(self._timed)

    def uninstall(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
        gc.unfreeze()  # back into the oldest generation: collectable again

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.began = self.clock()
        else:
            self.pauses.append((int(info["generation"]), self.clock() - self.began))

    def tick(self, now: float, idle: bool) -> Frozen | None:
        """After a pass at loop time `now` (`idle`: it had nothing to do): hand the pauses
        kept to `observe`, and freeze what survived when the time has come."""
        frozen = None
        if now >= self.due and (idle or now >= self.due + MAX_DEFER_S):
            began = self.clock()
            gc.collect()
            gc.freeze()
            self.due = now + REFREEZE_S
            frozen = Frozen(self.clock() - began, gc.get_freeze_count())
        while self.pauses:
            self.observe(*self.pauses.popleft())
        return frozen
