"""PURE: restart policy. First-match rules decide what a failure leads to; budgets limit it.

Rules mirror CCE's faultTolerantPolicy (so users can move their YAML) in the spirit of the Job
podFailurePolicy: each rule matches exit codes ("129,101,128-255", optionally one container) or
causes (exceptionalEvent "nodeNotReady,PodForceDeleted", ...) and has an action: Restart
(replace the pod), Ignore (drop the worker; the job goes on smaller within min-np) or FailJob
(stop horovodrun, exit with the documented code). CCE's restartPolicy values ExitCode /
OnNodeFail / OnNodeFailWithExitCode mean Restart; our `action` field says it directly.
With no rules configured: Restart on NodeNotReady, PodForceDeleted, Evicted, Preempted,
PodDeleted, Hung and NotStarted, and on exit codes 128-255; Ignore other exit codes.

Budgets (the `Ledger`, a frozen value the caller persists): a job-wide restart limit, an
optional per-slot limit, an optional sliding-window rate limit, and exponential backoff between
replacements of the same slot. Disruptions can be made free of the budget; a pod that never
started (NotStarted) is always free: the script never ran. Time is passed in
(wall-clock seconds, since the ledger is persisted).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from supervisor.decide.classify import DISRUPTIONS, NEVER_COUNTED, Cause, Failure


class Action(StrEnum):
    RESTART = "Restart"
    IGNORE = "Ignore"
    FAIL_JOB = "FailJob"


class PolicyError(Exception):
    """Invalid rules or budgets; `problems` holds one line each, naming the rule and field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


CODES_TERM = re.compile(r"^\s*(\d{1,3})\s*(?:-\s*(\d{1,3})\s*)?$")
CCE_RESTART_POLICIES = {"ExitCode", "OnNodeFail", "OnNodeFailWithExitCode"}
EVENTS = {c.value.lower(): c for c in Cause if c is not Cause.EXIT_CODE}


def parse_codes(text: str) -> tuple[tuple[int, int], ...]:
    """Parse "129,101,128-255" into inclusive ranges; raise ValueError naming what is wrong."""
    ranges = []
    for term in str(text).split(","):
        m = CODES_TERM.match(term)
        if not m:
            raise ValueError(f"{term.strip()!r} is not N or N-M")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if not (0 <= lo <= hi <= 255):
            raise ValueError(f"{term.strip()!r} is outside 0-255 or reversed")
        ranges.append((lo, hi))
    return tuple(ranges)


def parse_events(text: str) -> frozenset[Cause]:
    """Parse "nodeNotReady,PodForceDeleted" (any case) into causes."""
    out = set()
    for term in str(text).split(","):
        key = term.strip().lower()
        if key not in EVENTS:
            raise ValueError(f"{term.strip()!r} is not one of "
                             + "|".join(sorted(c.value for c in EVENTS.values())))
        out.add(EVENTS[key])
    return frozenset(out)


@dataclass(frozen=True)
class Rule:
    """One rule; exactly one of exit_codes / causes is set."""

    name: str  # "faultTolerantPolicy[2]" or "default: ..." (cited in logs and Events)
    action: Action
    exit_codes: tuple[tuple[int, int], ...] | None = None
    container: str | None = None
    causes: frozenset[Cause] | None = None
    not_in: bool = False  # operator NotIn: the exit codes NOT listed match

    def what(self) -> str:
        """What the rule matches, as text: "Evicted,NodeNotReady", "137,128-255",
        "not 0,1" (NotIn)."""
        if self.causes is not None:
            return ",".join(sorted(self.causes))
        codes = ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in self.exit_codes or ())
        return f"not {codes}" if self.not_in else codes

    def matches(self, f: Failure) -> bool:
        if self.causes is not None:
            return f.cause in self.causes
        if f.cause is not Cause.EXIT_CODE or f.exit_code is None or self.exit_codes is None:
            return False
        if self.container is not None and f.container != self.container:
            return False
        return any(lo <= f.exit_code <= hi for lo, hi in self.exit_codes) is not self.not_in


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("default: node loss, force delete, eviction, preemption, deletion, hang",
         Action.RESTART,
         causes=frozenset({Cause.NODE_NOT_READY, Cause.POD_FORCE_DELETED, Cause.EVICTED,
                           Cause.PREEMPTED, Cause.POD_DELETED, Cause.HUNG})),
    Rule("default: never started", Action.RESTART, causes=frozenset({Cause.NOT_STARTED})),
    Rule("default: exit codes 128-255 (killed by a signal)", Action.RESTART,
         exit_codes=((128, 255),)),
    Rule("default: other exit codes", Action.IGNORE, exit_codes=((0, 127),)),
)


@dataclass(frozen=True)
class Budgets:
    """Restart budgets. Counts are restarts (replacement pods); seconds for times."""

    restart_limit: int = 100  # job-wide
    per_slot_limit: int | None = None  # None: no per-slot limit
    rate_limit: int | None = None  # at most this many restarts ...
    rate_window_s: float = 600.0  # ... within this sliding window
    backoff_initial_s: float = 1.0  # wait before a slot's second replacement, doubling ...
    backoff_max_s: float = 60.0  # ... up to this
    backoff_reset_s: float = 600.0  # a slot that ran this long since its last replacement
    # node loss, eviction, preemption, force delete, Hung: not counted, no backoff
    disruptions_free: bool = True


@dataclass(frozen=True)
class Policy:
    """The configured rules (DEFAULT_RULES always apply after them) and the budgets."""

    rules: tuple[Rule, ...] = ()
    budgets: Budgets = field(default_factory=Budgets)


@dataclass(frozen=True)
class Ledger:
    """What has been spent; persisted by the caller so a restarted supervisor continues.

    Times are wall-clock epoch seconds: the ledger outlives the process (and maybe the node).
    """

    total: int = 0
    per_slot: Mapping[str, int] = field(default_factory=dict)
    recent: tuple[float, ...] = ()  # times of counted restarts, for the rate window
    last_replaced: Mapping[str, float] = field(default_factory=dict)
    streak: Mapping[str, int] = field(default_factory=dict)  # consecutive, for backoff
    horovodrun_restarts: int = 0  # against HOROVODRUN_RESTART_LIMIT, over launcher attempts


@dataclass(frozen=True)
class Decision:
    action: Action
    rule: str
    delay_s: float = 0.0  # wait this long before creating the replacement (backoff)
    counted: bool = False  # consumes the restart budget
    refused: str | None = None  # a Restart the budgets refused, and why
    ledger: Ledger = field(default_factory=Ledger)


def match(rules: tuple[Rule, ...], f: Failure) -> Rule:
    """Return the first rule matching `f`; the defaults apply after the configured rules."""
    for rule in (*rules, *DEFAULT_RULES):
        if rule.matches(f):
            return rule
    raise AssertionError("the default rules match every failure")  # pragma: no cover


def decide(policy: Policy, f: Failure, slot: str, ledger: Ledger, now: float) -> Decision:
    """Return what to do about failure `f` of worker slot `slot`, and the ledger after it."""
    rule = match(policy.rules, f)
    if rule.action is not Action.RESTART:
        return Decision(rule.action, rule.name, ledger=ledger)
    b = policy.budgets
    counted = f.cause not in NEVER_COUNTED and not (b.disruptions_free
                                                    and f.cause in DISRUPTIONS)
    recent = tuple(t for t in ledger.recent if now - t < b.rate_window_s)
    used_slot = ledger.per_slot.get(slot, 0)
    refused = None
    if counted and ledger.total >= b.restart_limit:
        refused = f"restart limit {b.restart_limit} reached"
    elif counted and b.per_slot_limit is not None and used_slot >= b.per_slot_limit:
        refused = f"per-slot restart limit {b.per_slot_limit} reached for {slot}"
    elif counted and b.rate_limit is not None and len(recent) >= b.rate_limit:
        refused = f"rate limit {b.rate_limit} restarts per {b.rate_window_s:g}s reached"
    if refused is not None:
        return Decision(Action.IGNORE, rule.name, refused=refused,
                        ledger=replace(ledger, recent=recent))
    if not counted:  # the infrastructure's doing: replaced at once, the slot's streak kept
        return Decision(Action.RESTART, rule.name, ledger=replace(ledger, recent=recent))
    last = ledger.last_replaced.get(slot)
    streak = ledger.streak.get(slot, 0)
    if last is None or now - last >= b.backoff_reset_s:
        streak, delay = 0, 0.0
    else:
        wait = min(b.backoff_max_s, b.backoff_initial_s * 2 ** max(0, streak - 1))
        delay = max(0.0, last + wait - now)
    new = Ledger(
        total=ledger.total + 1,
        per_slot={**ledger.per_slot, slot: used_slot + 1},
        recent=(*recent, now),
        last_replaced={**ledger.last_replaced, slot: now + delay},
        streak={**ledger.streak, slot: streak + 1},
    )
    return Decision(Action.RESTART, rule.name, delay_s=delay, counted=True, ledger=new)


def env_rules(restart_codes: tuple[tuple[int, int], ...] | None,
              fail_codes: tuple[tuple[int, int], ...] | None,
              restart_events: frozenset[Cause] | None) -> tuple[Rule, ...]:
    """Rules for the simple env-var form; each set variable replaces its part of the defaults.

    FAIL_EXIT_CODES come first. RESTART_EXIT_CODES: those codes Restart, every other code is
    Ignored. RESTART_EVENTS: those causes Restart, every other cause is Ignored but
    NotStarted, which keeps its default unless listed (the variable predates it, and a pod that
    never started says nothing of the script).
    """
    rules: list[Rule] = []
    if fail_codes:
        rules.append(Rule("SUPERVISOR_FAIL_EXIT_CODES", Action.FAIL_JOB, exit_codes=fail_codes))
    if restart_codes is not None:
        rules.append(Rule("SUPERVISOR_RESTART_EXIT_CODES", Action.RESTART,
                          exit_codes=restart_codes))
        rules.append(Rule("SUPERVISOR_RESTART_EXIT_CODES: other exit codes", Action.IGNORE,
                          exit_codes=((0, 255),)))
    if restart_events is not None:
        rules.append(Rule("SUPERVISOR_RESTART_EVENTS", Action.RESTART, causes=restart_events))
        rules.append(Rule("SUPERVISOR_RESTART_EVENTS: other events", Action.IGNORE,
                          causes=frozenset(EVENTS.values()) - restart_events
                          - NEVER_COUNTED))
    return tuple(rules)


# Budget fields a policy file can set, by its YAML key (for the env/file conflict check).
BUDGET_KEYS = {"restartLimit": "restart_limit", "restartLimitPerSlot": "per_slot_limit",
               "disruptionsFree": "disruptions_free"}
BACKOFF_KEYS = {"initialSeconds": "backoff_initial_s", "maxSeconds": "backoff_max_s"}


def file_budget_fields(doc: Any) -> set[str]:
    """Return the Budgets field names a loaded policy document sets explicitly."""
    if not isinstance(doc, dict):
        return set()
    out = {attr for key, attr in BUDGET_KEYS.items() if key in doc}
    if isinstance(doc.get("backoff"), dict):
        out |= {attr for key, attr in BACKOFF_KEYS.items() if key in doc["backoff"]}
    return out


# ---- the YAML policy file (already loaded into Python objects) ---------------------------------

_TOP = {"faultTolerantPolicy", "restartLimit", "restartLimitPerSlot", "restartRate", "backoff",
        "disruptionsFree"}
_RULE = {"exitCodes", "operator", "containerName", "exceptionalEvent", "restartPolicy",
         "restartScope", "action"}


def _int(v: Any, where: str, lo: int, problems: list[str]) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        problems.append(f"{where}: {v!r}: expected an integer >= {lo}")
        return None
    return v


def _secs(v: Any, where: str, problems: list[str]) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        problems.append(f"{where}: {v!r}: expected a number of seconds > 0")
        return None
    return float(v)


def _rule(i: int, raw: Any, problems: list[str]) -> Rule | None:
    where = f"faultTolerantPolicy[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with exitCodes or exceptionalEvent")
        return None
    for key in sorted(set(raw) - _RULE):
        problems.append(f"{where}.{key}: unknown field; expected one of {', '.join(sorted(_RULE))}")
    has_codes, has_events = "exitCodes" in raw, "exceptionalEvent" in raw
    # Every problem of the rule is reported, not only the first one.
    before = len(problems)
    if has_codes == has_events:
        problems.append(f"{where}: expected exactly one of exitCodes, exceptionalEvent")
    codes = causes = None
    try:
        if has_codes and not has_events:
            codes = parse_codes(raw["exitCodes"])
        elif has_events and not has_codes:
            causes = parse_events(raw["exceptionalEvent"])
    except ValueError as e:
        field_name = "exitCodes" if has_codes else "exceptionalEvent"
        problems.append(f"{where}.{field_name}: {e}")
    operator = raw.get("operator", "In")
    if operator not in ("In", "NotIn"):
        problems.append(f"{where}.operator: {operator!r}: expected In|NotIn")
    elif "operator" in raw and not has_codes:
        problems.append(f"{where}.operator: only with exitCodes")
    container = raw.get("containerName")
    if container is not None and (has_events or not isinstance(container, str)):
        problems.append(f"{where}.containerName: only a container name string, with exitCodes")
    scope = raw.get("restartScope", "Pod")
    if scope != "Pod":
        problems.append(f"{where}.restartScope: {scope!r}: only Pod is supported (Horovod "
                        "elastic keeps the other workers running)")
    action: Action | None = None
    if "action" in raw:
        try:
            action = Action(raw["action"])
        except ValueError:
            problems.append(f"{where}.action: {raw['action']!r}: expected one of "
                            + "|".join(a.value for a in Action))
    elif "restartPolicy" in raw:
        if raw["restartPolicy"] in CCE_RESTART_POLICIES:
            action = Action.RESTART
        else:
            problems.append(f"{where}.restartPolicy: {raw['restartPolicy']!r}: expected one of "
                            + "|".join(sorted(CCE_RESTART_POLICIES)) + " (or use action)")
    else:
        problems.append(f"{where}: expected action (Restart|Ignore|FailJob) or restartPolicy")
    if action is None or len(problems) > before:
        return None
    return Rule(where, action, exit_codes=codes, container=container if has_codes else None,
                causes=causes, not_in=operator == "NotIn")


def policy_from_document(doc: Any) -> Policy:
    """Build a Policy from a loaded YAML document; raise PolicyError listing every problem."""
    problems: list[str] = []
    if doc is None:
        return Policy()
    if not isinstance(doc, dict):
        raise PolicyError(["policy: expected a mapping with faultTolerantPolicy and budgets"])
    for key in sorted(set(doc) - _TOP):
        problems.append(f"{key}: unknown field; expected one of {', '.join(sorted(_TOP))}")
    raw_rules = doc.get("faultTolerantPolicy", [])
    if not isinstance(raw_rules, list):
        problems.append("faultTolerantPolicy: expected a list of rules")
        raw_rules = []
    rules = [r for i, raw in enumerate(raw_rules) if (r := _rule(i, raw, problems))]
    b = Budgets()
    kw: dict[str, Any] = {}
    if "restartLimit" in doc:
        kw["restart_limit"] = _int(doc["restartLimit"], "restartLimit", 0, problems)
    if "restartLimitPerSlot" in doc:
        kw["per_slot_limit"] = _int(doc["restartLimitPerSlot"], "restartLimitPerSlot", 0,
                                    problems)
    if "restartRate" in doc:
        rate = doc["restartRate"]
        if not isinstance(rate, dict) or set(rate) - {"limit", "windowSeconds"}:
            problems.append("restartRate: expected {limit: N, windowSeconds: S}")
        else:
            kw["rate_limit"] = _int(rate.get("limit"), "restartRate.limit", 1, problems)
            if "windowSeconds" in rate:
                kw["rate_window_s"] = _secs(rate["windowSeconds"], "restartRate.windowSeconds",
                                            problems)
    if "backoff" in doc:
        bo = doc["backoff"]
        if not isinstance(bo, dict) or set(bo) - {"initialSeconds", "maxSeconds"}:
            problems.append("backoff: expected {initialSeconds: S, maxSeconds: S}")
        else:
            for key, attr in (("initialSeconds", "backoff_initial_s"),
                              ("maxSeconds", "backoff_max_s")):
                if key in bo:
                    kw[attr] = _secs(bo[key], f"backoff.{key}", problems)
    if "disruptionsFree" in doc:
        if isinstance(doc["disruptionsFree"], bool):
            kw["disruptions_free"] = doc["disruptionsFree"]
        else:
            problems.append(f"disruptionsFree: {doc['disruptionsFree']!r}: expected true|false")
    if problems:
        raise PolicyError(problems)
    budgets = replace(b, **kw)
    if budgets.backoff_initial_s > budgets.backoff_max_s:
        raise PolicyError([f"backoff: initialSeconds {budgets.backoff_initial_s:g} > "
                           f"maxSeconds {budgets.backoff_max_s:g}"])
    return Policy(rules=tuple(rules), budgets=budgets)


# ---- persistence --------------------------------------------------------------------------------

LEDGER_VERSION = 1


def ledger_to_dict(ledger: Ledger) -> dict[str, Any]:
    """Return the ledger as JSON-ready data (for the state ConfigMap)."""
    return {"version": LEDGER_VERSION, "total": ledger.total, "perSlot": dict(ledger.per_slot),
            "recent": list(ledger.recent), "lastReplaced": dict(ledger.last_replaced),
            "streak": dict(ledger.streak), "horovodrunRestarts": ledger.horovodrun_restarts}


def ledger_from_dict(data: Any) -> Ledger:
    """Return the ledger stored as `data`; raise ValueError saying what is wrong.

    A damaged state is an error, never silently replaced by an empty ledger: that would
    reset the restart budgets.
    """
    if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
        raise ValueError(f"expected a mapping with version {LEDGER_VERSION}")

    def counts(key: str, kinds: tuple[type, ...], what: str) -> dict[str, Any]:
        v = data.get(key, {})
        if not isinstance(v, dict) or not all(
                isinstance(k, str) and isinstance(x, kinds) and not isinstance(x, bool)
                for k, x in v.items()):
            raise ValueError(f"{key}: expected a mapping of slot to {what}")
        return v

    total = data.get("total", 0)
    recent = data.get("recent", [])
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise ValueError("total: expected an integer >= 0")
    if not isinstance(recent, list) or not all(isinstance(t, int | float) for t in recent):
        raise ValueError("recent: expected a list of times")
    restarts = data.get("horovodrunRestarts", 0)  # absent in a state written before it
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
        raise ValueError("horovodrunRestarts: expected an integer >= 0")
    last = {k: float(v) for k, v in counts("lastReplaced", (int, float), "a time").items()}
    return Ledger(total=total, per_slot=counts("perSlot", (int,), "a count"),
                  recent=tuple(map(float, recent)), last_replaced=last,
                  streak=counts("streak", (int,), "a count"), horovodrun_restarts=restarts)
