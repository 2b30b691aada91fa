"""What a policy reload reports as changed."""

from __future__ import annotations

from supervisor.classify import Cause
from supervisor.policy import Action, Budgets, Policy, Rule
from supervisor.reload import summary

KILL = Rule("r0", Action.RESTART, exit_codes=((137, 137), (143, 143)))
FAIL = Rule("r1", Action.FAIL_JOB, exit_codes=((3, 3),), container="worker")
LOST = Rule("r2", Action.IGNORE, causes=frozenset({Cause.NODE_NOT_READY, Cause.EVICTED}))


def test_nothing_changed() -> None:
    p = Policy(rules=(KILL,))
    assert summary(p, p) == {"rules_added": [], "rules_removed": [], "rules_reordered": False,
                             "budgets_changed": {}}


def test_rules_added_removed_and_budgets() -> None:
    old = Policy(rules=(KILL, LOST), budgets=Budgets(restart_limit=5))
    new = Policy(rules=(FAIL, KILL), budgets=Budgets(restart_limit=7, disruptions_free=False))
    assert summary(old, new) == {
        "rules_added": ["FailJob 3 [worker]"],
        "rules_removed": ["Ignore Evicted,NodeNotReady"],
        "rules_reordered": False,
        "budgets_changed": {"restart_limit": [5, 7], "disruptions_free": [True, False]}}


def test_reordering_is_a_change_of_its_own() -> None:
    assert summary(Policy(rules=(KILL, FAIL)), Policy(rules=(FAIL, KILL)))["rules_reordered"]
