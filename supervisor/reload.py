"""ADAPTER + PURE: hot reload of the policy file.

`PolicyWatcher` watches the policy file's directory with watchfiles (a ConfigMap volume update
is an atomic swap of the `..data` symlink, so the file's own path never sees a write: any change
in the directory triggers a re-read) and hands the loop a `PolicyChanged` carrying the new
policy or the problems that reject it. `parse` re-runs the same configuration parsing as the
start (env conflicts included), so a reload accepts exactly what a restart would.
`summary` describes what changed, for the log line and the Event.

A supervisor parses the policy at its start, but a standby may lead long after: `start()` first
parses the file as it is then and posts it when it differs from the policy in force (`current`),
or its problems when it no longer parses, before any trigger of the loop that it starts with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import watchfiles

from supervisor.decide.policy import Policy, Rule
from supervisor.model import PolicyChanged


def _rule_text(rule: Rule) -> str:
    return f"{rule.action.value} {rule.what()}" + (f" [{rule.container}]" if rule.container
                                                    else "")


def summary(old: Policy, new: Policy) -> dict[str, object]:
    """What changed between two policies: rules added / removed (as text), budgets changed."""
    before = [_rule_text(r) for r in old.rules]
    after = [_rule_text(r) for r in new.rules]
    budgets = {f.name: [getattr(old.budgets, f.name), getattr(new.budgets, f.name)]
               for f in fields(old.budgets)
               if getattr(old.budgets, f.name) != getattr(new.budgets, f.name)}
    return {"rules_added": [r for r in after if r not in before],
            "rules_removed": [r for r in before if r not in after],
            "rules_reordered": sorted(before) == sorted(after) and before != after,
            "budgets_changed": budgets}


class PolicyWatcher:
    """Calls `parse()` whenever the policy file's directory changes and its text differs from
    the last seen; posts the outcome to `sink`. One daemon thread; `stop()` ends it.
    `current`: the policy in force, checked against the file by `start()`."""

    def __init__(self, path: Path, *, parse: Callable[[], Policy],
                 sink: Callable[[PolicyChanged], None], clock: Callable[[], float],
                 problems_of: Callable[[Exception], tuple[str, ...]],
                 current: Policy, debounce_ms: int = 50) -> None:
        self.path, self.parse, self.sink, self.clock = path, parse, sink, clock
        self.problems_of, self.current, self.debounce_ms = problems_of, current, debounce_ms
        self._last = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-watcher", daemon=True)

    def start(self) -> PolicyWatcher:
        """Post the file's policy now if it is not the one in force (in the caller's thread:
        it reaches the loop first), then watch."""
        self._post(unless=self.current)
        self._thread.start()
        return self

    def _post(self, unless: Policy | None = None) -> None:
        """Parse the file; post the policy (unless it is `unless`) or why it is rejected."""
        try:
            policy = self.parse()
        except Exception as e:  # the parser's own errors, or an unreadable file
            self.sink(PolicyChanged(self.clock(), None, self.problems_of(e)))
            return
        if policy != unless:
            self.sink(PolicyChanged(self.clock(), policy))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _read(self) -> str | None:
        try:
            return self.path.read_text()
        except OSError:
            return None

    def _run(self) -> None:
        for _changes in watchfiles.watch(self.path.parent, stop_event=self._stop,
                                         debounce=self.debounce_ms, step=20,
                                         rust_timeout=500, yield_on_timeout=False,
                                         raise_interrupt=False):
            text = self._read()
            if text == self._last:
                continue
            self._last = text
            self._post()
