"""What a policy reload reports as changed, and what the watcher posts when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, parse_config
from supervisor.decide.classify import Cause
from supervisor.decide.policy import Action, Budgets, Policy, Rule
from supervisor.model import PolicyChanged
from supervisor.reload import PolicyWatcher, summary

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


# A standby parses the policy at its start and may lead hours later (issue 39, item 5): the
# watcher then starts from what the file holds, not from the text it finds at leadership.
ENV = {"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a", "SUPERVISOR_NP": "2"}
AT_START = """\
faultTolerantPolicy:
- exitCodes: 137
  restartPolicy: ExitCode
  restartScope: Pod
restartLimit: 3
"""
EDITED = AT_START.replace("137", "137,143").replace("restartLimit: 3", "restartLimit: 9")


def problems_of(e: Exception) -> tuple[str, ...]:
    return tuple(e.problems) if isinstance(e, ConfigError) else (f"{type(e).__name__}: {e}",)


@pytest.mark.parametrize(("now", "posted"), [
    pytest.param(EDITED, "the edited policy", id="edited while it stood by: taken"),
    pytest.param(AT_START, None, id="unchanged: nothing to say"),
    pytest.param("faultTolerantPolicy: [\n", "problems",
                 id="broken while it stood by: rejected, the start's policy kept"),
])
def test_a_standby_that_becomes_leader_reads_the_policy_file_again(
        tmp_path: Path, now: str, posted: str | None) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(AT_START)
    env = {**ENV, "SUPERVISOR_POLICY_FILE": str(path)}
    at_start = parse_config(env).policy  # the standby's own start
    path.write_text(now)  # the ConfigMap edited while it waited for the Lease
    got: list[PolicyChanged] = []
    watcher = PolicyWatcher(path, parse=lambda: parse_config(env).policy, sink=got.append,
                            clock=lambda: 5.0, problems_of=problems_of,
                            current=at_start).start()
    try:
        if posted is None:
            assert got == []
        elif posted == "problems":
            assert len(got) == 1 and got[0].policy is None
            assert got[0].problems[0].startswith(f"SUPERVISOR_POLICY_FILE={str(path)!r}: not "
                                                 "valid YAML at line 2")
        else:
            assert got == [PolicyChanged(5.0, parse_config(env).policy)]
            assert summary(at_start, got[0].policy) == {
                "rules_added": ["Restart 137,143"], "rules_removed": ["Restart 137"],
                "rules_reordered": False, "budgets_changed": {"restart_limit": [3, 9]}}
    finally:
        watcher.stop()
