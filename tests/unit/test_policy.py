"""Policy: rule parsing (CCE faultTolerantPolicy shape), first-match, defaults, budgets and
backoff on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.decide.classify import Cause, Failure
from supervisor.decide.policy import (
    Action,
    Budgets,
    Ledger,
    Policy,
    PolicyError,
    decide,
    env_rules,
    ledger_from_dict,
    ledger_to_dict,
    match,
    parse_codes,
    policy_from_document,
)


def failure(cause: Cause = Cause.EXIT_CODE, code: int | None = 137,
            container: str | None = "worker") -> Failure:
    return Failure(cause, "job1-worker-0-x", "uid", "node-a",
                   code if cause is Cause.EXIT_CODE else None,
                   container if cause is Cause.EXIT_CODE else None)


# The YAML from the Baidu CCE seed (trainer and launcher replica specs), as users would move it.
CCE = """
restartLimit: 100
faultTolerantPolicy:
  - exitCodes: 129,101
    restartPolicy: ExitCode
    restartScope: Pod
  - exceptionalEvent: "nodeNotReady,PodForceDeleted"
    restartPolicy: OnNodeFail
    restartScope: Pod
"""


def test_the_cce_seed_policy_loads_unchanged() -> None:
    p = policy_from_document(yaml.safe_load(CCE))
    assert [(r.name, r.action) for r in p.rules] == [
        ("faultTolerantPolicy[0]", Action.RESTART), ("faultTolerantPolicy[1]", Action.RESTART)]
    assert p.rules[0].exit_codes == ((129, 129), (101, 101))
    assert p.rules[1].causes == {Cause.NODE_NOT_READY, Cause.POD_FORCE_DELETED}
    assert p.budgets.restart_limit == 100


@pytest.mark.parametrize(("f", "rule", "action"), [
    pytest.param(failure(code=101), "faultTolerantPolicy[0]", Action.RESTART,
                 id="listed exit code: the user's rule"),
    pytest.param(failure(Cause.POD_FORCE_DELETED), "faultTolerantPolicy[1]", Action.RESTART,
                 id="listed event: the user's rule"),
    pytest.param(failure(code=137), "default: exit codes 128-255 (killed by a signal)",
                 Action.RESTART, id="unlisted signal exit: default restart"),
    pytest.param(failure(code=1), "default: other exit codes", Action.IGNORE,
                 id="unlisted ordinary exit: default ignore"),
    pytest.param(failure(Cause.EVICTED), "default: node loss, force delete, eviction, "
                 "preemption, deletion, hang", Action.RESTART, id="eviction: default restart"),
    pytest.param(failure(Cause.HUNG), "default: node loss, force delete, eviction, "
                 "preemption, deletion, hang", Action.RESTART, id="hung: default restart"),
])
def test_first_match_then_defaults(f: Failure, rule: str, action: Action) -> None:
    p = policy_from_document(yaml.safe_load(CCE))
    r = match(p.rules, f)
    assert (r.name, r.action) == (rule, action)


def test_order_matters_and_container_names_narrow() -> None:
    p = policy_from_document({"faultTolerantPolicy": [
        {"exitCodes": "137", "containerName": "sidecar", "action": "Ignore"},
        {"exitCodes": "1-127,137", "action": "FailJob"},
        {"exitCodes": "128-255", "action": "Ignore"},
    ]})
    assert match(p.rules, failure(code=137, container="sidecar")).action is Action.IGNORE
    assert match(p.rules, failure(code=137, container="worker")).action is Action.FAIL_JOB
    assert match(p.rules, failure(code=139)).action is Action.IGNORE
    assert match(p.rules, failure(code=3)).action is Action.FAIL_JOB


@pytest.mark.parametrize(("text", "expected"), [
    ("129,101,128-255", ((129, 129), (101, 101), (128, 255))),
    (" 0 - 7 ", ((0, 7),)),
    ("255", ((255, 255),)),
])
def test_parse_codes(text: str, expected: tuple) -> None:
    assert parse_codes(text) == expected


BAD = [
    ({"faultTolerantPolicy": [{"exitCodes": "12-x", "action": "Restart"}]},
     "faultTolerantPolicy[0].exitCodes: '12-x' is not N or N-M"),
    ({"faultTolerantPolicy": [{"exitCodes": "300", "action": "Restart"}]},
     "faultTolerantPolicy[0].exitCodes: '300' is outside 0-255 or reversed"),
    ({"faultTolerantPolicy": [{"exitCodes": "9-3", "action": "Restart"}]},
     "faultTolerantPolicy[0].exitCodes: '9-3' is outside 0-255 or reversed"),
    ({"faultTolerantPolicy": [{"action": "Restart"}, {"exceptionalEvent": "diskFull",
                                                     "action": "Restart"}]},
     "faultTolerantPolicy[0]: expected exactly one of exitCodes, exceptionalEvent"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "action": "Ignore"},
                              {"exceptionalEvent": "diskFull", "action": "Restart"}]},
     "faultTolerantPolicy[1].exceptionalEvent: 'diskFull' is not one of Evicted|Hung|"
     "NodeNotReady|NotStarted|PodDeleted|PodForceDeleted|Preempted"),
    ({"faultTolerantPolicy": [{"exitCodes": "1"}]},
     "faultTolerantPolicy[0]: expected action (Restart|Ignore|FailJob) or restartPolicy"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "action": "Retry"}]},
     "faultTolerantPolicy[0].action: 'Retry': expected one of Restart|Ignore|FailJob"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "restartPolicy": "Always"}]},
     "faultTolerantPolicy[0].restartPolicy: 'Always': expected one of ExitCode|OnNodeFail|"
     "OnNodeFailWithExitCode (or use action)"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "action": "Ignore", "restartScope": "All"}]},
     "faultTolerantPolicy[0].restartScope: 'All': only Pod is supported"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "action": "Ignore", "exitcode": 3}]},
     "faultTolerantPolicy[0].exitcode: unknown field"),
    ({"faultTolerantPolicy": [{"exceptionalEvent": "evicted", "containerName": "w",
                               "action": "Ignore"}]},
     "faultTolerantPolicy[0].containerName: only a container name string, with exitCodes"),
    ({"restartLimit": -1}, "restartLimit: -1: expected an integer >= 0"),
    ({"restartLimit": True}, "restartLimit: True: expected an integer >= 0"),
    ({"restartRate": {"limit": 0, "windowSeconds": 60}},
     "restartRate.limit: 0: expected an integer >= 1"),
    ({"backoff": {"initialSeconds": 0}},
     "backoff.initialSeconds: 0: expected a number of seconds > 0"),
    ({"backoff": {"initialSeconds": 10, "maxSeconds": 5}},
     "backoff: initialSeconds 10 > maxSeconds 5"),
    ({"disruptionsFree": "yes"}, "disruptionsFree: 'yes': expected true|false"),
    ({"restartlimit": 3}, "restartlimit: unknown field"),
    ([1, 2], "policy: expected a mapping"),
    ({"faultTolerantPolicy": {"exitCodes": "1"}}, "faultTolerantPolicy: expected a list"),
    ({"faultTolerantPolicy": [{"exitCodes": "1", "operator": "Out", "action": "Ignore"}]},
     "faultTolerantPolicy[0].operator: 'Out': expected In|NotIn"),
    ({"faultTolerantPolicy": [{"exceptionalEvent": "evicted", "operator": "NotIn",
                               "action": "Ignore"}]},
     "faultTolerantPolicy[0].operator: only with exitCodes"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[b[1].split(":")[0] + "-" + str(i)
                                                       for i, b in enumerate(BAD)])
def test_validation_names_the_rule_and_field(doc: object, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_document(doc)
    assert err.value.problems[0].startswith(message), err.value.problems


def test_a_rule_with_several_problems_reports_all_of_them() -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_document({"faultTolerantPolicy": [
            {"exitCodes": "1,300", "restartScope": "All", "action": "Retry"}]})
    assert err.value.problems == [
        "faultTolerantPolicy[0].exitCodes: '300' is outside 0-255 or reversed",
        "faultTolerantPolicy[0].restartScope: 'All': only Pod is supported (Horovod elastic "
        "keeps the other workers running)",
        "faultTolerantPolicy[0].action: 'Retry': expected one of Restart|Ignore|FailJob"]


@pytest.mark.parametrize(("code", "action"), [
    (0, Action.IGNORE), (1, Action.IGNORE),  # listed: NotIn does not match
    (3, Action.FAIL_JOB), (137, Action.FAIL_JOB),  # any other code of the worker container
])
def test_not_in_matches_the_exit_codes_not_listed(code: int, action: Action) -> None:
    """podFailurePolicy's onExitCodes operator NotIn: fail the job on every exit code of the
    worker container except the listed ones (here 0 and 1, ignored by the next rule)."""
    p = policy_from_document({"faultTolerantPolicy": [
        {"exitCodes": "0,1", "operator": "NotIn", "containerName": "worker",
         "action": "FailJob"},
        {"exitCodes": "0-1", "action": "Ignore"}]})
    assert p.rules[0].what() == "not 0,1"
    assert match(p.rules, failure(code=code)).action is action
    assert match(p.rules, failure(code=3, container="sidecar")).action is not Action.FAIL_JOB


def test_an_empty_file_means_the_defaults() -> None:
    assert policy_from_document(None) == Policy()
    assert policy_from_document({}) == Policy()


def test_budgets_parse() -> None:
    p = policy_from_document({"restartLimit": 5, "restartLimitPerSlot": 2,
                              "restartRate": {"limit": 3, "windowSeconds": 60},
                              "backoff": {"initialSeconds": 2, "maxSeconds": 30},
                              "disruptionsFree": True})
    assert p.budgets == Budgets(restart_limit=5, per_slot_limit=2, rate_limit=3,
                                rate_window_s=60.0, backoff_initial_s=2.0, backoff_max_s=30.0,
                                disruptions_free=True)


def run(policy: Policy, events: list[tuple[float, str, Failure]]) -> list[tuple]:
    """Decide a sequence of (time, slot, failure); return (action, delay, refused) each."""
    ledger, out = Ledger(), []
    for now, slot, f in events:
        d = decide(policy, f, slot, ledger, now)
        ledger = d.ledger
        out.append((d.action, round(d.delay_s, 3), d.refused))
    return out


def test_job_wide_limit_then_refused() -> None:
    p = Policy(budgets=Budgets(restart_limit=2, backoff_initial_s=1))
    got = run(p, [(0, "s0", failure()), (10, "s1", failure()), (20, "s2", failure())])
    assert got == [(Action.RESTART, 0.0, None), (Action.RESTART, 0.0, None),
                   (Action.IGNORE, 0.0, "restart limit 2 reached")]


def test_backoff_doubles_per_slot_and_is_capped_then_resets() -> None:
    p = Policy(budgets=Budgets(backoff_initial_s=1, backoff_max_s=4, backoff_reset_s=600))
    t = [0.0, 0.2, 1.5, 3.0, 7.0, 700.0]
    got = run(p, [(x, "s0", failure()) for x in t])
    # 1st at once; 2nd 1 s after the 1st; 3rd 2 s after the 2nd; 4th 4 s; capped at 4 s; a slot
    # that ran 600 s since its last replacement starts over.
    assert [g[1] for g in got] == [0.0, 0.8, 1.5, 4.0, 4.0, 0.0]
    assert all(g[0] is Action.RESTART for g in got)


def test_backoff_is_per_slot() -> None:
    p = Policy(budgets=Budgets(backoff_initial_s=1))
    got = run(p, [(0, "s0", failure()), (0.1, "s1", failure()), (0.2, "s0", failure())])
    assert [g[1] for g in got] == [0.0, 0.0, 0.8]


def test_per_slot_limit_and_rate_window() -> None:
    p = Policy(budgets=Budgets(per_slot_limit=1, rate_limit=2, rate_window_s=60,
                               backoff_initial_s=0.001))
    got = run(p, [(0, "s0", failure()), (1, "s0", failure()), (2, "s1", failure()),
                  (3, "s2", failure()), (70, "s2", failure())])
    assert [g[2] for g in got] == [None, "per-slot restart limit 1 reached for s0", None,
                                   "rate limit 2 restarts per 60s reached", None]


def test_disruptions_can_be_free_of_the_budget() -> None:
    p = Policy(budgets=Budgets(restart_limit=1, disruptions_free=True))
    got = run(p, [(0, "s0", failure(Cause.NODE_NOT_READY)), (10, "s1", failure(Cause.EVICTED)),
                  (20, "s2", failure()), (30, "s3", failure())])
    assert [(g[0], g[2]) for g in got] == [(Action.RESTART, None), (Action.RESTART, None),
                                           (Action.RESTART, None),
                                           (Action.IGNORE, "restart limit 1 reached")]


def test_disruptions_are_free_by_default_and_have_no_backoff() -> None:
    """A slot whose worker the infrastructure took again and again is replaced at once each
    time; its streak is not extended, so a later crash of the script starts the backoff over."""
    p = Policy(budgets=Budgets(restart_limit=1, backoff_initial_s=5))
    got = run(p, [(0, "s0", failure(Cause.HUNG)), (1, "s0", failure(Cause.NODE_NOT_READY)),
                  (2, "s0", failure(Cause.POD_FORCE_DELETED)), (3, "s0", failure()),
                  (4, "s0", failure())])
    assert got == [(Action.RESTART, 0.0, None)] * 4 + [
        (Action.IGNORE, 0.0, "restart limit 1 reached")]
    counted = Policy(budgets=Budgets(restart_limit=1, disruptions_free=False))
    assert run(counted, [(0, "s0", failure(Cause.HUNG)), (1, "s1", failure(Cause.EVICTED))])[
        1] == (Action.IGNORE, 0.0, "restart limit 1 reached")


def test_a_pod_that_never_started_is_replaced_free_even_where_disruptions_count() -> None:
    """The script never ran: no budget, no backoff, whatever disruptionsFree says."""
    counted = Policy(budgets=Budgets(restart_limit=1, disruptions_free=False,
                                     backoff_initial_s=5))
    got = run(counted, [(0, "s0", failure()), (1, "s0", failure(Cause.NOT_STARTED)),
                        (2, "s0", failure(Cause.NOT_STARTED))])
    assert got[1:] == [(Action.RESTART, 0.0, None)] * 2
    assert match((), failure(Cause.NOT_STARTED)).name == "default: never started"


def test_restart_events_that_predate_not_started_keep_its_default() -> None:
    """SUPERVISOR_RESTART_EVENTS=NodeNotReady drops the other listed causes, not a pod that
    never started (the script never ran); listing it, or a file rule, decides otherwise."""
    rules = env_rules(None, None, frozenset({Cause.NODE_NOT_READY}))
    assert match(rules, failure(Cause.EVICTED)).action is Action.IGNORE
    assert match(rules, failure(Cause.NOT_STARTED)).name == "default: never started"
    doc = {"faultTolerantPolicy": [{"exceptionalEvent": "notStarted", "action": "FailJob"}]}
    assert match(policy_from_document(doc).rules,
                 failure(Cause.NOT_STARTED)).action is Action.FAIL_JOB


SHIPPED = Path(__file__).parents[2] / "manifests" / "base" / "files" / "policy.yaml"


def test_the_shipped_policy_stops_a_crash_loop_and_lets_a_burst_of_faults_through() -> None:
    """Slot s0's script segfaults on every replacement (139): it is stopped after its 5
    replacements. Meanwhile, within four minutes, five independent faults elsewhere: a node
    lost, a replacement SIGKILLed while it joins (137, counted), a frozen and a partitioned
    worker (Hung), an eviction, all replaced; so is a later OOM kill on a sixth slot."""
    p = policy_from_document(yaml.safe_load(SHIPPED.read_text()))
    loop = [(t, "s0", failure(code=139)) for t in (0, 3, 9, 22, 45, 90)]
    burst = [(20, "s1", failure(Cause.NODE_NOT_READY)), (25, "s1", failure(code=137)),
             (90, "s2", failure(Cause.HUNG)), (160, "s3", failure(Cause.HUNG)),
             (230, "s4", failure(Cause.EVICTED)), (235, "s5", failure(code=137))]
    events = sorted(loop + burst, key=lambda e: e[0])
    got = dict(zip([(t, s) for t, s, _ in events], run(p, events), strict=True))
    assert [got[(t, s)][0] for t, s, _ in burst] == [Action.RESTART] * len(burst)
    assert [got[(t, "s0")][0] for t, _, _ in loop] == [Action.RESTART] * 5 + [Action.IGNORE]
    assert got[(90, "s0")][2] == "per-slot restart limit 5 reached for s0"
    assert got[(3, "s0")][1] == 2.0, "the crash loop waits for its backoff (5 s)"
    assert got[(25, "s1")][1] == 0, "a replacement after a disruption does not"


def test_ignore_and_failjob_do_not_touch_the_ledger() -> None:
    p = policy_from_document({"faultTolerantPolicy": [{"exitCodes": "2", "action": "FailJob"}]})
    d = decide(p, failure(code=2), "s0", Ledger(), 0.0)
    assert (d.action, d.rule, d.ledger) == (Action.FAIL_JOB, "faultTolerantPolicy[0]", Ledger())
    d = decide(p, failure(code=1), "s0", Ledger(), 0.0)
    assert (d.action, d.ledger) == (Action.IGNORE, Ledger())


def test_the_ledger_survives_a_json_round_trip() -> None:
    import json

    p = Policy(budgets=Budgets(backoff_initial_s=1))
    ledger = Ledger()
    for now, slot in ((1_700_000_000.0, "0"), (1_700_000_000.5, "0"), (1_700_000_010.0, "1")):
        ledger = decide(p, failure(), slot, ledger, now).ledger
    stored = json.loads(json.dumps(ledger_to_dict(ledger)))
    assert ledger_from_dict(stored) == ledger
    assert stored["total"] == 3 and stored["perSlot"] == {"0": 2, "1": 1}


@pytest.mark.parametrize(("data", "message"), [
    (None, "expected a mapping with version 1"),
    ({"version": 2}, "expected a mapping with version 1"),
    ({"version": 1, "total": -1}, "total: expected an integer >= 0"),
    ({"version": 1, "perSlot": {"0": "two"}}, "perSlot: expected a mapping of slot to a count"),
    ({"version": 1, "recent": "yesterday"}, "recent: expected a list of times"),
    ({"version": 1, "lastReplaced": {"0": True}},
     "lastReplaced: expected a mapping of slot to a time"),
])
def test_a_damaged_ledger_is_an_error_not_a_reset(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ledger_from_dict(data)
