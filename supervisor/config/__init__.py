"""Configuration: environment variables -> one typed, frozen `Config`, parsed once at start.

Owns the table of `SUPERVISOR_*` variables: each one's name, default, meaning, parser (with the
precise one-line error for a bad value) and the `Config` field it fills. Parsing, `explain`
(`effective_values`, with where each value came from) and the variables' reference
(`reference`, written to docs/env-vars.md by `make docs`) are loops over that table; only the
settings that depend on each other get a step of their own after the loop. Every problem is
collected and reported at once, in the table's order; the CLI exits 2 on any.
Never reads anything but the mapping it is given (plus the in-cluster namespace file and the
kubeconfig's namespace, passed in by the caller), never talks to the cluster.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import reduce
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.parsers import OWNED_OPTIONS, owned_option
from supervisor.config.values import (
    BAKED_DISCOVERY_FILE,
    PREFIX,
    SHARED_DIR,
    CleanPodPolicy,
    Config,
    ConfigError,
    LogFormat,
    LogLevel,
    Mode,
    SshHostKeys,
    packaged_discovery_script,
)
from supervisor.config.variables import DEFAULT_SELECTOR, KNOWN, REFERENCE_HEADER, VARIABLES, Var
from supervisor.decide.hostlist import HostMode
from supervisor.decide.policy import (
    Policy,
    PolicyError,
    env_rules,
    file_budget_fields,
    policy_from_document,
)
from supervisor.workers import TemplateError, validate_template

__all__ = [  # the package's API: its modules' names the rest of the code imports from here
    "BAKED_DISCOVERY_FILE", "DEFAULT_SELECTOR", "INCARNATION_DIGITS", "KNOWN", "OWNED_OPTIONS",
    "PREFIX", "SHARED_DIR", "VARIABLES", "CleanPodPolicy", "Config", "ConfigError", "HostMode",
    "LogFormat", "LogLevel", "Mode", "SshHostKeys", "Var", "effective_values",
    "known_hosts_path", "owned_option", "packaged_discovery_script", "parse_config",
    "reference",
]


def parse_config(
    env: Mapping[str, str],
    *,
    pod_namespace: str | None = None,
    kubeconfig_namespace: str | None = None,
    read_text: Callable[[Path], str] = Path.read_text,
) -> Config:
    """Return the Config for `env`, or raise ConfigError listing every problem (one line each).

    `pod_namespace` is the in-cluster service account's namespace (if any) and
    `kubeconfig_namespace` the current kubeconfig context's; they only feed the NAMESPACE default.
    `read_text` reads the policy file and the worker template (both checked here, once).
    """
    unknown = []
    for name in sorted(k for k in env if k.startswith(PREFIX) and k not in KNOWN):
        guess = difflib.get_close_matches(name, sorted(KNOWN), n=1)
        hint = f" (did you mean {guess[0]}?)" if guess else ""
        unknown.append(f"{name}: unknown variable{hint}; see `elastic-supervisor explain`")

    problems: list[str] = []
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}  # variable (no prefix) -> its value; None: unset or bad
    for v in VARIABLES:
        full, raw = PREFIX + v.name, env.get(PREFIX + v.name) or v.default
        values[v.name] = None
        if raw is None:
            continue
        sources[full] = "env" if env.get(full) else "default"
        try:
            values[v.name] = v.parse(raw, read_text) if v.reads else v.parse(raw)
        except ValueError as e:
            problems.append(f"{full}={raw!r}: expected {e}")

    # After the loop, what no variable's own text decides, so no parser can: defaults taken
    # from another variable or from outside the environment (NAMESPACE; WORKER_SELECTOR; NP,
    # MIN_NP, MAX_NP from WORKERS x SLOTS_PER_WORKER or from each other; the discovery paths
    # from MODE and SHARED_DIR; POD_NAME from HOSTNAME), checks across variables (MIN_NP <= NP
    # <= MAX_NP, sidecar paths, STALENESS above RESYNC, JOB_NAME's room in pod names), and the
    # two files whose contents meet other variables: the policy (its budgets and rules may not
    # repeat the variables') and the worker template (checked against WORKER_SELECTOR and
    # WORKER_CONTAINER).
    job = values["JOB_NAME"]
    if job is None and f"{PREFIX}JOB_NAME" not in sources:
        problems.append(f"{PREFIX}JOB_NAME: required (a DNS label naming the training job)")

    if values["NAMESPACE"] is None and f"{PREFIX}NAMESPACE" not in sources:
        for origin, candidate in (("service account", pod_namespace),
                                  ("kubeconfig", kubeconfig_namespace)):
            if candidate:
                values["NAMESPACE"] = candidate
                sources[f"{PREFIX}NAMESPACE"] = f"derived: {origin}"
                break
        else:
            problems.append(f"{PREFIX}NAMESPACE: not set and no in-cluster or kubeconfig "
                            "namespace found; set it")

    selector = values["WORKER_SELECTOR"]
    if selector is None and f"{PREFIX}WORKER_SELECTOR" not in sources and job:
        selector = values["WORKER_SELECTOR"] = DEFAULT_SELECTOR.format(job=job)
        sources[f"{PREFIX}WORKER_SELECTOR"] = "derived: JOB_NAME"

    slots = values["SLOTS_PER_WORKER"]
    for np_name, w_name in (("NP", "WORKERS"), ("MIN_NP", "MIN_WORKERS"),
                            ("MAX_NP", "MAX_WORKERS")):
        if env.get(PREFIX + np_name) and env.get(PREFIX + w_name):
            problems.append(f"{PREFIX}{np_name} and {PREFIX}{w_name}: give one of them, not both")
            values[np_name] = None
        elif values[w_name] is not None and slots is not None:
            values[np_name] = values[w_name] * slots
            sources[PREFIX + np_name] = f"derived: {w_name} x SLOTS_PER_WORKER"
    np_, min_np, max_np = values["NP"], values["MIN_NP"], values["MAX_NP"]
    if np_ is None and f"{PREFIX}NP" not in sources and f"{PREFIX}WORKERS" not in sources:
        if min_np is not None:
            np_ = min_np
            sources[f"{PREFIX}NP"] = "derived: MIN_NP"
        else:
            problems.append(f"{PREFIX}NP: required (or {PREFIX}WORKERS, or {PREFIX}MIN_NP)")
    if np_ is not None:
        if min_np is None and f"{PREFIX}MIN_NP" not in sources:
            min_np = np_
            sources[f"{PREFIX}MIN_NP"] = "derived: NP"
        if max_np is None and f"{PREFIX}MAX_NP" not in sources:
            max_np = np_
            sources[f"{PREFIX}MAX_NP"] = "derived: NP"
    if None not in (np_, min_np, max_np) and not (min_np <= np_ <= max_np):
        problems.append(f"{PREFIX}MIN_NP={min_np}, {PREFIX}NP={np_}, {PREFIX}MAX_NP={max_np}: "
                        "expected MIN_NP <= NP <= MAX_NP")
    values.update(NP=np_, MIN_NP=min_np, MAX_NP=max_np)

    shared = values["SHARED_DIR"]
    sidecar = values["MODE"] == Mode.SIDECAR and isinstance(shared, Path)
    if values["DISCOVERY_FILE"] is None and f"{PREFIX}DISCOVERY_FILE" not in sources:
        values["DISCOVERY_FILE"] = shared / "hosts" if sidecar else Path(BAKED_DISCOVERY_FILE)
        sources[f"{PREFIX}DISCOVERY_FILE"] = ("derived: SHARED_DIR" if sidecar
                                              else "default")
    if values["DISCOVERY_SCRIPT"] is None and f"{PREFIX}DISCOVERY_SCRIPT" not in sources:
        values["DISCOVERY_SCRIPT"] = (shared / "discover_hosts.sh" if sidecar
                                   else packaged_discovery_script())
        sources[f"{PREFIX}DISCOVERY_SCRIPT"] = ("derived: SHARED_DIR" if sidecar
                                                else "derived: packaged script")
    if sidecar:
        for var in ("DISCOVERY_FILE", "DISCOVERY_SCRIPT"):
            path = values[var]
            if isinstance(path, Path) and not path.is_relative_to(shared):
                problems.append(f"{PREFIX}{var}={str(path)!r}: in sidecar mode expected a path "
                                f"under {PREFIX}SHARED_DIR ({shared}), which the training "
                                "container mounts too (or leave it unset)")

    staleness, resync = values["STALENESS_SECONDS"], values["RESYNC_SECONDS"]
    if isinstance(staleness, float) and isinstance(resync, float) and staleness <= resync:
        problems.append(f"{PREFIX}STALENESS_SECONDS={staleness:g} <= {PREFIX}RESYNC_SECONDS="
                        f"{resync:g}: expected the staleness bound above the resync period (it "
                        "is checked on each tick)")
    if values["POD_NAME"] is None and f"{PREFIX}POD_NAME" not in sources and pod_namespace and (
            env.get("HOSTNAME")):
        values["POD_NAME"] = env["HOSTNAME"]
        sources[f"{PREFIX}POD_NAME"] = "derived: HOSTNAME"

    policy = _policy(env, values, sources, read_text, problems)
    if isinstance(job, str) and isinstance(max_np, int) and isinstance(slots, int):
        _check_pod_names(job, max_np, slots, env, problems)

    template_file, template = values["WORKER_TEMPLATE"], None
    if template_file is not None and selector is not None:
        doc = _load_yaml(PREFIX + "WORKER_TEMPLATE", template_file, read_text, problems)
        if doc is not None:
            try:
                template = validate_template(doc, _selector_pairs(selector))
            except TemplateError as e:
                problems += [f"{PREFIX}WORKER_TEMPLATE={str(template_file)!r}: {p}"
                             for p in e.problems]
    _ssh_host_keys(values, sources, problems)
    container = values["WORKER_CONTAINER"]
    if isinstance(container, str) and template is not None:
        names = [c.get("name") for c in template["spec"]["containers"]]
        if container not in names:
            problems.append(f"{PREFIX}WORKER_CONTAINER={container!r}: not a container of the "
                            f"worker template (its containers: {', '.join(names)})")

    # Unknown variables first, then in the table's order of the variable each line starts with.
    order = {PREFIX + v.name: i for i, v in enumerate(VARIABLES)}
    problems.sort(key=lambda p: order.get(re.split(r"[=:\s]", p, maxsplit=1)[0], len(order)))
    if unknown or problems:
        raise ConfigError(unknown + problems)
    return Config(**{v.field: values[v.name] for v in VARIABLES if v.field and "." not in v.field},
                  policy=policy, worker_template=template, sources=dict(sources))


def _ssh_host_keys(values: dict[str, Any], sources: dict[str, str],
                   problems: list[str]) -> None:
    """SSH_HOST_KEYS: its default from SSH_KNOWN_HOSTS_FILE and WORKER_TEMPLATE, and what
    each mode needs."""
    mode, known = values["SSH_HOST_KEYS"], values["SSH_KNOWN_HOSTS_FILE"]
    full, known_var = f"{PREFIX}SSH_HOST_KEYS", f"{PREFIX}SSH_KNOWN_HOSTS_FILE"
    if mode is None and full not in sources:
        if known is not None or known_var in sources:
            mode, how = SshHostKeys.JOB, "derived: SSH_KNOWN_HOSTS_FILE"
        elif values["WORKER_TEMPLATE"] is not None:
            mode, how = SshHostKeys.WORKER, "derived: WORKER_TEMPLATE"
        else:
            mode, how = SshHostKeys.UNCHECKED, "default"
        values["SSH_HOST_KEYS"], sources[full] = mode, how
    if mode == SshHostKeys.JOB and known_var not in sources:
        problems.append(f"{full}=job: needs {known_var} (the known_hosts line of the job's "
                        "host key)")
    if mode in (SshHostKeys.WORKER, SshHostKeys.UNCHECKED) and known_var in sources:
        problems.append(f"{full}={mode}: {known_var} is set too; expected {full}=job with it, "
                        "or no known_hosts file")
    if mode == SshHostKeys.WORKER and values["WORKER_TEMPLATE"] is None:
        problems.append(f"{full}=worker: needs {PREFIX}WORKER_TEMPLATE (the supervisor makes "
                        "each worker's key when it creates the pod); expected job or unchecked "
                        "without one")


def known_hosts_path(cfg: Config) -> Path | None:
    """The known_hosts file the driver's ssh checks: the one the supervisor writes beside the
    discovery file (SSH_HOST_KEYS=worker), the job's (job), or None (unchecked)."""
    if cfg.ssh_host_keys == SshHostKeys.WORKER:
        return cfg.discovery_file.with_name(cfg.discovery_file.name + ".known_hosts")
    return cfg.ssh_known_hosts_file if cfg.ssh_host_keys == SshHostKeys.JOB else None


# Digits kept free for a slot's incarnation in its pod name (a million replacements).
INCARNATION_DIGITS = 6


def _check_pod_names(job: str, max_np: int, slots: int, env: Mapping[str, str],
                     problems: list[str]) -> None:
    """Add a problem if the longest worker pod name of `job` would exceed 63 characters.

    Slot numbers stay below twice the most workers (a scale-out while a scale-in is still
    retiring slots adds new ones); pod names are never truncated, which could make two jobs
    share names.
    """
    workers = max(1, max_np // slots)
    room = 63 - len(f"-w{2 * workers}-") - INCARNATION_DIGITS
    if len(job) > room:
        raw = env.get(PREFIX + "JOB_NAME")
        problems.append(f"{PREFIX}JOB_NAME={raw!r}: expected at most {room} characters: "
                        "worker pods are named <job>-w<slot>-<incarnation>, at most 63 "
                        f"characters, for up to {workers} workers")


def _load_yaml(var: str, path: Path, read_text: Callable[[Path], str],
               problems: list[str]) -> Any:
    """Return the YAML document in `path`, or None after adding one problem line."""
    try:
        text = read_text(path)
    except OSError as e:
        problems.append(f"{var}={str(path)!r}: cannot read: {e.strerror or e}")
        return None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problems.append(f"{var}={str(path)!r}: not valid YAML{where}: "
                        f"{getattr(e, 'problem', None) or e}")
        return None
    if doc is None:
        problems.append(f"{var}={str(path)!r}: the file is empty")
    return doc


def _policy(env: Mapping[str, str], values: Mapping[str, Any], sources: dict[str, str],
            read_text: Callable[[Path], str], problems: list[str]) -> Policy:
    """Return the effective policy from POLICY_FILE and/or the simple variables."""
    var, path = PREFIX + "POLICY_FILE", values["POLICY_FILE"]
    doc, from_file = None, Policy()
    if path is not None:
        for name in ("RESTART_EXIT_CODES", "FAIL_EXIT_CODES", "RESTART_EVENTS"):
            if env.get(PREFIX + name):
                problems.append(f"{PREFIX}{name} and {var}: rules come from one place; move "
                                f"this one into the file's faultTolerantPolicy")
        doc = _load_yaml(var, path, read_text, problems)
        if doc is not None:
            try:
                from_file = policy_from_document(doc)
            except PolicyError as e:
                problems += [f"{var}={str(path)!r}: {p}" for p in e.problems]
    in_file = file_budget_fields(doc)
    budgets: dict[str, object] = {}
    for v in VARIABLES:
        parent, _, attr = (v.field or "").rpartition(".")
        if parent != "policy.budgets":
            continue
        if attr in in_file:
            if env.get(PREFIX + v.name):
                problems.append(f"{PREFIX}{v.name} and {var}: both set this budget; keep one")
            sources[PREFIX + v.name] = "derived: POLICY_FILE"
            budgets[attr] = getattr(from_file.budgets, attr)
        elif values[v.name] is not None:
            budgets[attr] = values[v.name]
    merged = replace(from_file.budgets, **budgets)
    if merged.backoff_initial_s > merged.backoff_max_s:
        problems.append(f"{PREFIX}BACKOFF_INITIAL_SECONDS={merged.backoff_initial_s:g} > "
                        f"{PREFIX}BACKOFF_MAX_SECONDS={merged.backoff_max_s:g}: expected "
                        "initial <= max")
    rules = from_file.rules + env_rules(values["RESTART_EXIT_CODES"], values["FAIL_EXIT_CODES"],
                                        values["RESTART_EVENTS"])
    return Policy(rules=rules, budgets=merged)


def _selector_pairs(selector: str) -> dict[str, str]:
    """Return the key=value terms of a selector (what a created pod's labels must carry)."""
    pairs = {}
    for term in selector.split(","):
        if "!=" in term or "=" not in term:
            continue
        key, _, value = term.replace("==", "=").partition("=")
        pairs[key.strip()] = value.strip()
    return pairs


def effective_values(cfg: Config) -> list[tuple[str, str, str]]:
    """Return (variable, effective value, source) rows for `explain`, one per field-filling
    variable, in the table's order."""
    return [(PREFIX + v.name, _text(v.show(reduce(getattr, v.field.split("."), cfg))),
             cfg.sources.get(PREFIX + v.name, "unset")) for v in VARIABLES if v.field]


def _text(value: object) -> str:
    """A value as `explain` shows it: unset empty, true|false, names sorted (or none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "none"
    return str(value)


def reference() -> str:
    """Return docs/env-vars.md: a Markdown table of every variable, its default and meaning."""
    rows = (f"| `{PREFIX}{v.name}` | {f'`{v.default}`' if v.default else '-'} | {v.meaning} |\n"
            for v in VARIABLES)
    return REFERENCE_HEADER + "".join(rows)
