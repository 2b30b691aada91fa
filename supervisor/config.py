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
import math
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import reduce
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from supervisor.decide import disruption
from supervisor.decide.hostlist import HostMode
from supervisor.decide.policy import (
    Policy,
    PolicyError,
    Rule,
    env_rules,
    file_budget_fields,
    parse_codes,
    parse_events,
    policy_from_document,
)
from supervisor.hook.elastic_supervisor_hook import wire
from supervisor.workers import DNS_LABEL, TemplateError, validate_template

PREFIX = "SUPERVISOR_"
BAKED_DISCOVERY_FILE = "/etc/edl/hostfile"
SHARED_DIR = Path("/opt/elastic-supervisor")  # sidecar mode: SUPERVISOR_SHARED_DIR's default
# A label selector of key=value / key!=value / key / !key terms, comma separated.
SELECTOR_TERM = re.compile(r"^!?[A-Za-z0-9./_-]+((=|==|!=)[A-Za-z0-9._-]*)?$")


class LogFormat(StrEnum):
    JSON = "json"
    CONSOLE = "console"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class CleanPodPolicy(StrEnum):
    """Which worker pods go when the run ends (mpi-operator's cleanPodPolicy names)."""

    RUNNING = "Running"  # the workers still Running or Pending: none is left running sshd
    ALL = "All"  # every worker pod, finished ones too
    NONE = "None"  # none


class Mode(StrEnum):
    """Where the supervisor runs (docs/configuration.md)."""

    BAKED = "baked"  # in the launcher's image, horovodrun's parent (`run -- CMD`)
    SIDECAR = "sidecar"  # a native sidecar; horovodrun in the user's container, under es-run


class SshHostKeys(StrEnum):
    """Which ssh host keys the driver's ssh accepts from the workers (supervisor/hostkeys.py)."""

    WORKER = "worker"  # each worker its own key, made by the supervisor, pinned to its address
    JOB = "job"  # the job's one key, in SSH_KNOWN_HOSTS_FILE (every worker can read it)
    UNCHECKED = "unchecked"  # Horovod's own StrictHostKeyChecking=no


def packaged_discovery_script() -> Path:
    """Return the path of the discover_hosts.sh shipped inside the package."""
    return Path(str(resources.files("supervisor").joinpath("data/discover_hosts.sh")))


@dataclass(frozen=True)
class Config:
    """Effective settings. Durations are seconds; `None` means "not passed to horovodrun"."""

    job_name: str
    namespace: str
    worker_selector: str
    slots_per_worker: int
    np: int
    min_np: int
    max_np: int
    discovery_file: Path
    discovery_script: Path
    host_mode: HostMode
    staleness_s: float
    start_timeout_s: float
    shutdown_grace_s: float
    horovodrun: str
    ssh_port: int | None
    ssh_identity_file: Path | None
    network_interface: str | None
    gloo_timeout_s: int | None
    extra_args: tuple[str, ...]
    watch_read_timeout_s: float
    resync_s: float
    log_format: LogFormat
    log_level: LogLevel
    metrics_port: int
    pod_name: str | None
    fence_port: int = 0
    hook_key_file: tuple[Path, bytes] | None = None  # (path, the key it holds)
    ssh_known_hosts_file: Path | None = None  # the workers' pinned host key(s)
    ssh_host_keys: SshHostKeys = SshHostKeys.UNCHECKED
    # Failure handling: the effective rules and budgets, the worker pod template (validated;
    # None: the supervisor does not create workers, so Restart decisions cannot be carried
    # out) and how long a node must be down before its workers count as lost.
    policy: Policy = field(default_factory=Policy)
    policy_file: Path | None = None
    worker_template: Mapping[str, Any] | None = None
    worker_template_file: Path | None = None
    node_grace_s: float = 10.0
    node_lease_s: float | None = None  # None: node Leases are not watched
    node_disruption_threshold: float | None = 0.55  # None: no disruption brake
    scale_out_timeout_s: float = 600.0
    # A bound worker pod that has not started after this long is acted on (starts.py);
    # None: never.
    worker_start_timeout_s: float | None = 600.0
    scale_in_timeout_s: float = 60.0
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    api_timeout_s: float = 30.0  # client timeout of every API call but watches
    leader_lease_s: float = 60.0  # the leader Lease's duration
    worker_hook: bool = True
    worker_container: str | None = None  # None: the worker pod's first container
    heartbeat_timeout_s: float = 3.0
    stall_timeout_s: float = 1800.0
    stuck_s: float | None = None  # None: auto (hang.stuck_threshold)
    horovodrun_restart_limit: int = 3
    # Nodes announced to go (disruption.py): their workers leave gracefully.
    node_drain_taints: frozenset[str] = frozenset(disruption.DEFAULT_DRAIN_TAINTS)
    node_bad_conditions: frozenset[str] = frozenset(disruption.DEFAULT_BAD_CONDITIONS)
    quarantine_failures: int = 2  # 0: no quarantine
    quarantine_window_s: float = 1800.0
    quarantine_s: float = 3600.0
    mode: Mode = Mode.BAKED
    shared_dir: Path = SHARED_DIR  # sidecar mode: the emptyDir both containers mount
    # variable name -> "env" | "default" | "derived: ..." (for `explain`)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


class ConfigError(Exception):
    """One or more bad variables; `problems` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# ---- parsers: (raw string) -> value, raising ValueError("accepted: ...") ------------------------

def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    accepted = f"an integer >= {lo}" if hi is None else f"an integer {lo}..{hi}"

    def parse(raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise ValueError(accepted) from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(accepted)
        return value

    return parse


def _seconds(lo: float, *, allow_zero: bool = False) -> Callable[[str], float]:
    accepted = f"a number of seconds > {lo}" if not allow_zero else "a number of seconds >= 0"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if math.isnan(value) or math.isinf(value):
            raise ValueError(accepted)
        if (value < 0) if allow_zero else (value <= lo):
            raise ValueError(accepted)
        return value

    return parse


def _seconds_in(lo: float, hi: float) -> Callable[[str], float]:
    accepted = f"a number of seconds from {lo:g} to {hi:g}"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if not lo <= value <= hi:  # also refuses nan
            raise ValueError(accepted)
        return value

    return parse


def _at_least(lo: float, why: str) -> Callable[[str], float]:
    accepted = f"a number of seconds >= {lo:g} ({why})"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if math.isnan(value) or math.isinf(value) or value < lo:
            raise ValueError(accepted)
        return value

    return parse


def _watch_read_timeout(raw: str) -> float:
    value = _seconds(0)(raw)
    if value <= 60:
        raise ValueError("more than 60 seconds (watch bookmarks come about once a minute)")
    return value


def _enum(kind: type[StrEnum], *, fold: bool = True) -> Callable[[str], StrEnum]:
    def parse(raw: str) -> StrEnum:
        try:
            return kind(raw.strip().lower() if fold else raw.strip())
        except ValueError:
            raise ValueError("one of " + "|".join(m.value for m in kind)) from None

    return parse


def _dns_label(raw: str) -> str:
    if not DNS_LABEL.match(raw):
        raise ValueError("a DNS label: lower-case letters, digits and '-', at most 63 characters")
    return raw


def _selector(raw: str) -> str:
    terms = [t.strip() for t in raw.split(",")]
    if not raw.strip() or not all(SELECTOR_TERM.match(t) for t in terms):
        raise ValueError("a label selector like 'key=value,other!=x' (no set-based terms)")
    return ",".join(terms)


def _abs_path(raw: str) -> Path:
    p = Path(raw)
    if not p.is_absolute():
        raise ValueError("an absolute path")
    return p


def _read(read_text: Callable[[Path], str], raw: str, what: str) -> tuple[Path, str]:
    """The absolute path `raw` and its text; ValueError "a readable <what> (why)" if not."""
    path = _abs_path(raw)
    try:
        return path, read_text(path)
    except OSError as e:
        raise ValueError(f"a readable {what} ({e.strerror or e})") from None


def _hook_key(raw: str, read_text: Callable[[Path], str]) -> tuple[Path, bytes]:
    path, text = _read(read_text, raw, "file with the hook's key")
    try:
        return path, wire.parse_key(text, "")
    except ValueError:
        raise ValueError(f"a file with at least {2 * wire.MIN_KEY_BYTES} hex digits (e.g. "
                         "`openssl rand -hex 32`)") from None


# A known_hosts line with a key: [@cert-authority] hosts keytype base64 [comment].
KNOWN_HOST_KEY = re.compile(
    r"(?:@cert-authority\s+)?\S+\s+(?:ssh|ecdsa|sk)-\S+\s+[A-Za-z0-9+/]+=*(?:\s.*)?")


def _known_hosts(raw: str, read_text: Callable[[Path], str]) -> Path:
    path, text = _read(read_text, raw, "known_hosts file")
    if not any(KNOWN_HOST_KEY.fullmatch(line.strip()) for line in text.splitlines()):
        raise ValueError("a known_hosts file with at least one host key line, like "
                         "'* ssh-ed25519 AAAA...' (manifests/ssh-keygen.sh writes one)")
    return path


def _fraction_or_off(raw: str) -> float | None:
    accepted = "a fraction in (0, 1] like 0.55, or off"
    value = raw.strip().lower()
    if value == "off":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(accepted) from None
    if not 0 < number <= 1:  # also refuses nan
        raise ValueError(accepted)
    return number


def _seconds_or(word: str, lo: float) -> Callable[[str], float | None]:
    """Seconds >= `lo`, or `word` (auto, off) for None."""
    number = _at_least(lo, "")
    accepted = f"{word}, or a number of seconds >= {lo:g}"

    def parse(raw: str) -> float | None:
        if raw.strip().lower() == word:
            return None
        try:
            return number(raw)
        except ValueError:
            raise ValueError(accepted) from None

    return parse


def _names(what: str, example: str) -> Callable[[str], frozenset[str]]:
    return lambda raw: disruption.parse_names(raw, what, example)


def _nonempty(raw: str) -> str:
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError("a non-empty word without spaces")
    return raw.strip()


def _codes(raw: str) -> tuple[tuple[int, int], ...]:
    try:
        return parse_codes(raw)
    except ValueError as e:
        raise ValueError(f"exit codes like '137,143,128-255' ({e})") from None


def _events(raw: str) -> frozenset[object]:
    try:
        return parse_events(raw)  # type: ignore[return-value]
    except ValueError as e:
        raise ValueError(f"comma-separated events ({e})") from None


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("true|false")
    return value in ("true", "1", "yes")


def _args(raw: str) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(raw))
    except ValueError as e:
        raise ValueError(f"shell-style words with balanced quotes ({e})") from None
    if repeated := [(w, o) for w in words if (o := owned_option(w)) is not None]:
        raise ValueError("no option the supervisor sets itself (horovodrun takes the last one "
                         "given: it would override the supervisor's); " + "; ".join(
                             f"{w!r} is {o}: set {PREFIX}{OWNED_OPTIONS[o]} instead"
                             for w, o in repeated))
    return words


# horovodrun's options that the supervisor sets itself (supervisor.launch), in every spelling
# horovodrun 0.28 takes, with the variable that sets each. HOROVODRUN_EXTRA_ARGS may not repeat
# one: argparse keeps the last value, so it would silently override the supervisor's.
OWNED_OPTIONS = {
    "-np": "NP", "--num-proc": "NP",
    "--min-np": "MIN_NP", "--min-num-proc": "MIN_NP",
    "--max-np": "MAX_NP", "--max-num-proc": "MAX_NP",
    "--slots-per-host": "SLOTS_PER_WORKER",
    "--host-discovery-script": "DISCOVERY_SCRIPT",
    "-p": "SSH_PORT", "--ssh-port": "SSH_PORT",
    "-i": "SSH_IDENTITY_FILE", "--ssh-identity-file": "SSH_IDENTITY_FILE",
    "--network-interface": "NETWORK_INTERFACE", "--network-interfaces": "NETWORK_INTERFACE",
    "--gloo-timeout-seconds": "GLOO_TIMEOUT_SECONDS",
}
# horovodrun options of their own that begin like one of those (an exact name wins over an
# abbreviation in argparse).
_NOT_OWNED = ("--gloo", "-prefix-timestamp")


def owned_option(word: str) -> str | None:
    """The option of OWNED_OPTIONS that horovodrun's argparse reads `word` as, or None: the
    name, `name=value`, an abbreviation of a long name (`--ssh-p`), a short one with its value
    attached (`-p2222`)."""
    name = word.split("=", 1)[0]
    if not word.startswith("-") or name in _NOT_OWNED:
        return None
    if name in OWNED_OPTIONS:
        return name
    if name.startswith("--") and len(name) > 2:
        hits = [o for o in OWNED_OPTIONS if o.startswith(name)]
        # Abbreviating two of them is ambiguous to argparse: horovodrun refuses it itself.
        return hits[0] if hits and {OWNED_OPTIONS[o] for o in hits} == {
            OWNED_OPTIONS[hits[0]]} else None
    short = name[:2]
    if short in OWNED_OPTIONS and not any(o.startswith(name) for o in _NOT_OWNED):
        return short
    return None


# ---- the variables ------------------------------------------------------------------------------

def _none_is(word: str) -> Callable[[object], object]:
    """`explain`'s value of a variable whose None is spelled `word` (off, auto)."""
    return lambda value: word if value is None else value


def _rule_of(name: str) -> Callable[[tuple[Rule, ...]], str | None]:
    """`explain`'s value of a rules variable: what the rule it made matches (None: it made none)."""
    return lambda rules: next((r.what() for r in rules if r.name == PREFIX + name), None)


@dataclass(frozen=True)
class Var:
    """One variable: everything parsing, `explain` and docs/env-vars.md know of it."""

    name: str  # without the prefix
    default: str | None  # raw default; None = unset / derived
    parse: Callable[..., Any]  # raw -> value, or ValueError("<what is accepted>")
    # The Config field it fills; dotted: a field inside one (policy.budgets.restart_limit);
    # None: folded into another variable (WORKERS into NP), no `explain` row of its own.
    field: str | None
    meaning: str
    show: Callable[[Any], object] = lambda value: value  # the field's value as `explain` shows it
    reads: bool = False  # parse also takes parse_config's read_text (the file it names)


VARIABLES: tuple[Var, ...] = (
    Var("JOB_NAME", None, _dns_label, "job_name",
        "Name of the training job (required). Used in the default worker selector, Events and "
        "logs."),
    Var("NAMESPACE", None, _dns_label, "namespace",
        "Namespace of the worker pods. Default: the pod's own namespace (in-cluster service "
        "account), else the kubeconfig context's namespace."),
    Var("WORKER_SELECTOR", None, _selector, "worker_selector",
        "Label selector of the worker pods. Default: "
        "`elastic-supervisor/job=<JOB_NAME>,elastic-supervisor/role=worker`."),
    Var("SLOTS_PER_WORKER", "1", _int_in(1, 1024), "slots_per_worker",
        "Horovod slots (processes) per worker pod."),
    Var("NP", None, _int_in(1), "np",
        "Slots to start with (horovodrun -np). Or give WORKERS (np = workers x slots). Default: "
        "MIN_NP if set, else required."),
    Var("MIN_NP", None, _int_in(1), "min_np",
        "Fewest slots to keep training with (--min-np). Default: NP."),
    Var("MAX_NP", None, _int_in(1), "max_np",
        "Most slots to scale to (--max-np; always passed). Default: NP."),
    Var("WORKERS", None, _int_in(1), None,
        "Arena form of NP, in worker pods. Not together with NP."),
    Var("MIN_WORKERS", None, _int_in(1), None,
        "Arena form of MIN_NP, in worker pods. Not together with MIN_NP."),
    Var("MAX_WORKERS", None, _int_in(1), None,
        "Arena form of MAX_NP, in worker pods. Not together with MAX_NP."),
    Var("MODE", "baked", _enum(Mode), "mode",
        "`baked`: the supervisor runs horovodrun as its child (`run -- CMD` in the launcher "
        "image). `sidecar`: it runs in a native sidecar of the launcher pod and the training "
        "container runs `SHARED_DIR/bin/es-run CMD` (docs/configuration.md)."),
    Var("SHARED_DIR", str(SHARED_DIR), _abs_path, "shared_dir",
        "Sidecar mode: the emptyDir the supervisor's and the training container mount at this path "
        "(the wrapper, the hook, the discovery file); the workers get the hook at "
        "SHARED_DIR/hook, from a ConfigMap the supervisor makes."),
    Var("DISCOVERY_FILE", None, _abs_path, "discovery_file",
        "Host list written atomically by the supervisor (one `host:slots` per line); put it in an "
        "emptyDir. Default: /etc/edl/hostfile; in sidecar mode SHARED_DIR/hosts."),
    Var("DISCOVERY_SCRIPT", None, _abs_path, "discovery_script",
        "Script horovodrun polls (--host-discovery-script); it only `cat`s DISCOVERY_FILE. "
        "Default: the discover_hosts.sh shipped in the package; in sidecar mode "
        "SHARED_DIR/discover_hosts.sh."),
    Var("HOST_MODE", "ip", _enum(HostMode), "host_mode",
        "How workers are named to Horovod: `ip` (pod IP) or `dns` "
        "(<hostname>.<subdomain>.<namespace>.svc, needs a headless Service)."),
    Var("STALENESS_SECONDS", "60", _seconds_in(1, 3600), "staleness_s",
        "If the watch is broken longer than this, the discovery file is withdrawn so the script "
        "fails instead of printing stale hosts. 1 to 3600, above RESYNC_SECONDS."),
    Var("START_TIMEOUT_SECONDS", "600", _seconds(0), "start_timeout_s",
        "How long to wait for MIN_NP usable slots before giving up (exit 3)."),
    Var("SHUTDOWN_GRACE_SECONDS", "30", _seconds(0, allow_zero=True), "shutdown_grace_s",
        "After forwarding SIGTERM/SIGINT to horovodrun, how long to wait before killing its whole "
        "process tree."),
    Var("HOROVODRUN", "horovodrun", _nonempty, "horovodrun",
        "The horovodrun executable (name on PATH or path)."),
    Var("SSH_PORT", None, _int_in(1, 65535), "ssh_port",
        "ssh port of the workers (horovodrun -p)."),
    Var("SSH_IDENTITY_FILE", None, _abs_path, "ssh_identity_file",
        "Private key for ssh to the workers (horovodrun -i)."),
    Var("SSH_HOST_KEYS", None, _enum(SshHostKeys), "ssh_host_keys",
        "The workers' ssh host keys, which horovodrun's ssh checks strictly: `worker` (each "
        "worker pod its own key, made by the supervisor in a Secret of the pod's own, "
        "`<pod>-ssh`, and pinned to the pod's address: no worker can answer at another's; "
        "needs WORKER_TEMPLATE), `job` (the one key of SSH_KNOWN_HOSTS_FILE) or `unchecked` "
        "(Horovod's own StrictHostKeyChecking=no). Default: `job` with SSH_KNOWN_HOSTS_FILE, "
        "else `worker` with WORKER_TEMPLATE, else `unchecked`."),
    Var("SSH_KNOWN_HOSTS_FILE", None, _known_hosts, "ssh_known_hosts_file",
        "known_hosts file with the job's one ssh host key (SSH_HOST_KEYS=job; every worker's "
        "sshd shows that key, and every worker can read it).", reads=True),
    Var("NETWORK_INTERFACE", None, _nonempty, "network_interface",
        "NIC for Horovod traffic (--network-interface), e.g. eth0. Recommended: without it "
        "horovodrun probes NICs over ssh."),
    Var("GLOO_TIMEOUT_SECONDS", None, _int_in(1), "gloo_timeout_s",
        "Gloo timeout (--gloo-timeout-seconds); Horovod's default is 30. A new worker must finish "
        "hvd.init() within it."),
    Var("HOROVODRUN_EXTRA_ARGS", "", _args, "extra_args",
        "More horovodrun arguments, split like a shell would (quotes) but never run through one; "
        "placed before the training command. An option the supervisor sets itself (-np, --min-np, "
        "--max-np, --slots-per-host, --host-discovery-script, -p, -i, --network-interface, "
        "--gloo-timeout-seconds; any spelling) is refused: set its variable "
        "instead.", show=shlex.join),
    Var("WATCH_READ_TIMEOUT_SECONDS", "90", _watch_read_timeout, "watch_read_timeout_s",
        "Client read timeout of a watch connection: a silently dead connection is noticed after "
        "this long (> 60: bookmarks come each ~60 s)."),
    Var("RESYNC_SECONDS", "1", _seconds_in(0.05, 60), "resync_s",
        "Period of the reconcile tick (staleness checks, reaping) even without events. 0.05 to "
        "60."),
    Var("LOG_FORMAT", "json", _enum(LogFormat), "log_format", "Log format: json or console."),
    Var("LOG_LEVEL", "info", _enum(LogLevel), "log_level",
        "Log level: debug, info, warning or error."),
    Var("METRICS_PORT", "9400", _int_in(0, 65535), "metrics_port",
        "Port of the Prometheus /metrics endpoint; 0 disables it."),
    Var("FENCE_PORT", "0", _int_in(0, 65535), "fence_port",
        "UDP port of the hook channel: heartbeats of the training processes in, the hosts declared "
        "dead out (HMAC-authenticated datagrams, no connections); 0: any free port (the workers "
        "learn it from horovodrun's environment)."),
    Var("HOOK_KEY_FILE", None, _hook_key, "hook_key_file",
        "File with the hook channel's key in hex (at least 32 digits), at the same path on the "
        "launcher and every worker (the job's Secret): the training processes read it there, so "
        "the key is in no environment and on no ssh command line. Unset: a key of the supervisor's "
        "own, handed over in horovodrun's environment (which Horovod writes onto every ssh command "
        "line).", show=lambda key: key and key[0], reads=True),
    Var("POD_NAME", None, _nonempty, "pod_name",
        "The launcher pod's name (downward API), the object Events refer to (without it: the batch "
        "Job named JOB_NAME). Default: HOSTNAME when running in a pod."),
    Var("WORKER_TEMPLATE", None, _abs_path, "worker_template_file",
        "Worker pod template (YAML Pod, e.g. from a ConfigMap). Set: the supervisor creates the "
        "workers and their replacements. Unset: workers are made elsewhere and failed ones are "
        "only dropped."),
    Var("WORKER_CONTAINER", None, _nonempty, "worker_container",
        "The worker pod's training container: its exit is the worker's. Default: the pod's first "
        "container. Another container's exit counts only where a policy rule names it "
        "(containerName); otherwise it is only reported (worker.container_exited, Event "
        "ContainerExited)."),
    Var("POLICY_FILE", None, _abs_path, "policy_file",
        "Restart policy YAML (CCE faultTolerantPolicy form, see docs/failures-and-policies.md). "
        "Not together with the *_EXIT_CODES / RESTART_EVENTS variables."),
    Var("RESTART_EXIT_CODES", None, _codes, "policy.rules",
        "Exit codes that replace the worker, e.g. `137,143,128-255`; every other code drops it. "
        "Default: 128-255 restart, others drop.", show=_rule_of("RESTART_EXIT_CODES")),
    Var("FAIL_EXIT_CODES", None, _codes, "policy.rules",
        "Exit codes that fail the whole job (exit 5), checked "
        "first.", show=_rule_of("FAIL_EXIT_CODES")),
    Var("RESTART_EVENTS", None, _events, "policy.rules",
        "Causes that replace the worker, from NodeNotReady, PodForceDeleted, PodDeleted, Evicted, "
        "Preempted, Hung, NotStarted; the others drop it, except NotStarted (a pod that never "
        "started: replaced unless a rule says otherwise). Default: "
        "all.", show=_rule_of("RESTART_EVENTS")),
    Var("RESTART_LIMIT", "100", _int_in(0), "policy.budgets.restart_limit",
        "Replacements allowed for the whole job."),
    Var("SLOT_RESTART_LIMIT", None, _int_in(0), "policy.budgets.per_slot_limit",
        "Replacements allowed per worker slot. Default: no limit."),
    Var("BACKOFF_INITIAL_SECONDS", "1", _seconds(0), "policy.budgets.backoff_initial_s",
        "Wait before a slot's second replacement; doubles with each further one."),
    Var("BACKOFF_MAX_SECONDS", "60", _seconds(0), "policy.budgets.backoff_max_s",
        "Longest wait between replacements of the same slot."),
    Var("DISRUPTIONS_FREE", "true", _bool, "policy.budgets.disruptions_free",
        "If true, node loss, eviction, preemption, force deletion and a Hung worker (frozen or cut "
        "off) neither use up the restart limits nor wait for backoff: the infrastructure took the "
        "worker, no crash loop of the script. false: they count like an exit code."),
    Var("NODE_GRACE_SECONDS", "10", _seconds(0, allow_zero=True), "node_grace_s",
        "How long a worker's node must be NotReady/unreachable before the worker counts as lost: a "
        "kubelet posting Ready=False for a second (a PLEG hiccup, a runtime restart) is not node "
        "loss. The node controller's own grace (40-50 s) comes before this when a kubelet stops "
        "posting."),
    Var("NODE_LEASE_SECONDS", None, _seconds(0), "node_lease_s",
        "If set, a worker also counts as lost when its node's Lease (kube-node-lease) was not "
        "renewed for this long: faster than the node controller's 40-50 s. Must be above the "
        "kubelet's renew interval (leaseDurationSeconds / 4: 10 s by default; a node whose "
        "interval is not below it is reported and its Lease not used). Needs leases list/watch. "
        "Default: off."),
    Var("NODE_DISRUPTION_THRESHOLD", "0.55", _fraction_or_off, "node_disruption_threshold",
        "The disruption brake: when every node of the job's workers (at least two) or more than "
        "two and at least this share of them are down together, or so are the cluster's nodes, the "
        "workers on those down nodes are not failed and their pods not force-deleted until fewer "
        "are down (the node controller's --unhealthy-zone-threshold). off: no "
        "brake.", show=_none_is("off")),
    Var("NODE_DRAIN_TAINTS", ",".join(disruption.DEFAULT_DRAIN_TAINTS),
        _names("taint keys", disruption.DEFAULT_DRAIN_TAINTS[0]), "node_drain_taints",
        "Taint keys that say a node is about to go (the cluster autoscaler's, Karpenter's, the "
        "providers' termination handlers'): its workers leave gracefully (out of the discovery "
        "file, Horovod lets them go at their next commit, replaced on another node) and no new "
        "worker goes there. Comma-separated; none: off. A cordoned node (spec.unschedulable) "
        "counts too."),
    Var("NODE_BAD_CONDITIONS", ",".join(disruption.DEFAULT_BAD_CONDITIONS),
        _names("node condition types", disruption.DEFAULT_BAD_CONDITIONS[0]), "node_bad_conditions",
        "Node condition types (node-problem-detector's) that say a node goes bad when their status "
        "is True: its workers leave gracefully as for NODE_DRAIN_TAINTS. Comma-separated; none: "
        "off."),
    Var("QUARANTINE_FAILURES", "2", _int_in(0), "quarantine_failures",
        "Bad-node quarantine: a node with this many failures of the job's workers that point at "
        "the node within QUARANTINE_WINDOW_SECONDS (its loss; a hang whose pod is still there "
        "when its node goes NotReady; the same exit, not 137/143, of workers of two slots "
        "there and of none elsewhere; a node-problem condition. Not a kill, a stuck script, a "
        "delete, an eviction) gets no new worker of the job for QUARANTINE_SECONDS (a "
        "required anti-affinity by node name; Events NodeQuarantined, NodeReleased; shown by "
        "`status`), unless the nodes left cannot hold the job's desired workers; lifted early "
        "when the job is short of it (NodeQuarantineLifted). 0: off."),
    Var("QUARANTINE_WINDOW_SECONDS", "1800", _seconds(0), "quarantine_window_s",
        "The window of QUARANTINE_FAILURES."),
    Var("QUARANTINE_SECONDS", "3600", _seconds(0), "quarantine_s",
        "How long a quarantined node gets no new worker of the job; it ends by itself."),
    Var("SCALE_OUT_TIMEOUT_SECONDS", "600", _seconds(0), "scale_out_timeout_s",
        "A worker added by `scale` that is not Running within this long is deleted again "
        "(rollback, Warning Event)."),
    Var("WORKER_START_TIMEOUT_SECONDS", "600", _seconds_or("off", 30), "worker_start_timeout_s",
        "A worker pod bound to a node that has not started after this long (Pending, no container "
        "running: ContainerCreating, a volume that does not mount, an image that does not pull, a "
        "missing Secret) is acted on, with the kubelet's reason and message in a Warning Event: "
        "replaced off its node, no restart budget used, when the node is at fault or the pod's "
        "status does not say (Event WorkerRestarting, cause NotStarted; at most 3 pods of a slot "
        "in a row, then WorkerNeverStarts); only reported, after 60 s already, when the template "
        "is (an image pull, a missing Secret or key: WorkerNotStarting, since it would fail the "
        "same on any node). 600 is above the cold pull of a large CUDA training image (10-20 GB at "
        "50-100 MB/s: 2-7 min), which shows as ContainerCreating too. At least 30; off: "
        "never.", show=_none_is("off")),
    Var("SCALE_IN_TIMEOUT_SECONDS", "60", _seconds(0, allow_zero=True), "scale_in_timeout_s",
        "A worker removed by `scale` leaves the discovery file first; it is deleted when "
        "horovodrun's ssh clients to it are gone, or after this."),
    Var("CLEAN_POD_POLICY", "Running", _enum(CleanPodPolicy, fold=False), "clean_pod_policy",
        "Worker pods deleted when the job ends (a terminal exit: success, a FailJob exit code, the "
        "Job's last attempt, no Job; an exit the Job retries, or a Job that cannot be read, leaves "
        "them to the next launcher), mpi-operator's names: Running (those still Running or "
        "Pending), All, or None. Only pods the supervisor created (WORKER_TEMPLATE)."),
    Var("API_TIMEOUT_SECONDS", "30", _seconds_in(1, 300), "api_timeout_s",
        "Client timeout of every Kubernetes API call except watches (state, Events, creates, "
        "deletes, the leader Lease); 1 to 300. A call that stalls is given up and retried."),
    Var("LEADER_LEASE_SECONDS", "60", _seconds_in(2, 3600), "leader_lease_s",
        "Duration of the job's leader Lease (<job>-supervisor-leader): a second launcher waits as "
        "a standby; a leader that cannot renew it for 2/3 of this pauses (writes nothing, training "
        "goes on) until it renews again, and stops horovodrun (exit 7) only when it sees another "
        "launcher holding it; a standby takes over a dead leader's job after this. 2 to 3600."),
    Var("WORKER_HOOK", "true", _bool, "worker_hook",
        "Load the hook into every training process horovodrun starts (fence, heartbeats, hang "
        "detection; no change to the script). false: training processes are left alone "
        "(horovodrun's driver is hardened either way)."),
    Var("HEARTBEAT_TIMEOUT_SECONDS", "3", _at_least(1.5, "three heartbeats"), "heartbeat_timeout_s",
        "A training process whose heartbeats (every 0.5 s) stopped this long, while its peers wait "
        "in a collective and none completes, is Hung."),
    Var("STUCK_SECONDS", "auto", _seconds_or("auto", 5), "stuck_s",
        "A training process that heartbeats but whose main thread has not moved (same Python frame "
        "position, no I/O, no collective) this long, while it is not in the collective every other "
        "process waits in, is stuck: named (Event WorkerStuck, with where its main thread stands) "
        "and replaced like a Hung worker. auto: the larger of 20 s and 4 times the job's recent "
        "p99 step time; or a number of seconds >= 5.", show=_none_is("auto")),
    Var("STALL_TIMEOUT_SECONDS", "1800", _at_least(10, "a few steps"), "stall_timeout_s",
        "No collective completed anywhere for this long while the training processes heartbeat: "
        "horovodrun is restarted (longer than any step, checkpoint or evaluation without "
        "collectives)."),
    Var("HOROVODRUN_RESTART_LIMIT", "3", _int_in(0), "horovodrun_restart_limit",
        "Restarts of horovodrun (a stalled job, a rendezvous a dead worker broke or that is stuck) "
        "before the job fails instead (exit 9); with a WORKER_TEMPLATE counted over launcher "
        "attempts (saved with the workers' state)."),
)
KNOWN = {PREFIX + v.name for v in VARIABLES}
REFERENCE_HEADER = """# Environment variables

Every `SUPERVISOR_*` variable the supervisor reads, its default and its meaning. Generated from
`VARIABLES` in `supervisor/config.py` by `make docs`; do not edit: a unit test fails when this
file differs from the code. How the supervisor is configured: [configuration.md](configuration.md).

| variable | default | meaning |
| --- | --- | --- |
"""
DEFAULT_SELECTOR = "elastic-supervisor/job={job},elastic-supervisor/role=worker"


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


if __name__ == "__main__":
    sys.stdout.write(reference())
