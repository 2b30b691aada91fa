"""Config parsing: defaults, derived values, Arena forms, and one precise line per bad value."""

from __future__ import annotations

from dataclasses import fields
from functools import reduce
from pathlib import Path

import pytest

from supervisor.config import (
    OWNED_OPTIONS,
    VARIABLES,
    CleanPodPolicy,
    Config,
    ConfigError,
    HostMode,
    LogFormat,
    LogLevel,
    Mode,
    SshHostKeys,
    effective_values,
    known_hosts_path,
    packaged_discovery_script,
    parse_config,
)
from supervisor.decide.classify import Cause, Failure
from supervisor.decide.policy import Action, Budgets, Ledger, decide, match
from supervisor.launch import horovodrun_argv

BASE = {"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a", "SUPERVISOR_NP": "4"}
TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels:
    app: x
spec:
  restartPolicy: Never
  containers:
  - name: worker
    image: worker:1
"""


def parse(**env: str) -> Config:
    return parse_config({**BASE, **env})


def problems(env: dict[str, str], **kw: str | None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(env, **kw)
    return err.value.problems


def test_defaults_for_a_minimal_environment() -> None:
    cfg = parse()
    assert cfg == Config(
        job_name="job1", namespace="team-a",
        worker_selector="elastic-supervisor/job=job1,elastic-supervisor/role=worker",
        slots_per_worker=1, np=4, min_np=4, max_np=4,
        discovery_file=Path("/etc/edl/hostfile"), discovery_script=packaged_discovery_script(),
        host_mode=HostMode.POD_IP, staleness_s=60.0, start_timeout_s=600.0,
        shutdown_grace_s=30.0, horovodrun="horovodrun", ssh_port=None, ssh_identity_file=None,
        network_interface=None, gloo_timeout_s=None, extra_args=(),
        watch_read_timeout_s=90.0, resync_s=1.0, log_format=LogFormat.JSON,
        log_level=LogLevel.INFO, metrics_port=9400, pod_name=None,
    )
    # Node blips are not node loss; many nodes down together are held (the disruption brake).
    assert (cfg.node_grace_s, cfg.node_disruption_threshold) == (10.0, 0.55)
    assert cfg.sources["SUPERVISOR_MIN_NP"] == "derived: NP"
    assert cfg.sources["SUPERVISOR_WORKER_SELECTOR"] == "derived: JOB_NAME"


def test_every_variable_set_explicitly() -> None:
    cfg = parse_config({
        "SUPERVISOR_JOB_NAME": "bert", "SUPERVISOR_NAMESPACE": "ml",
        "SUPERVISOR_WORKER_SELECTOR": "app=bert, role=worker",
        "SUPERVISOR_SLOTS_PER_WORKER": "2", "SUPERVISOR_NP": "4",
        "SUPERVISOR_MIN_NP": "2", "SUPERVISOR_MAX_NP": "8",
        "SUPERVISOR_DISCOVERY_FILE": "/run/edl/hosts", "SUPERVISOR_DISCOVERY_SCRIPT": "/bin/d.sh",
        "SUPERVISOR_HOST_MODE": "DNS", "SUPERVISOR_STALENESS_SECONDS": "30",
        "SUPERVISOR_START_TIMEOUT_SECONDS": "120.5", "SUPERVISOR_SHUTDOWN_GRACE_SECONDS": "0",
        "SUPERVISOR_HOROVODRUN": "/opt/bin/horovodrun", "SUPERVISOR_SSH_PORT": "2222",
        "SUPERVISOR_SSH_IDENTITY_FILE": "/etc/ssh-key/id", "SUPERVISOR_NETWORK_INTERFACE": "eth0",
        "SUPERVISOR_GLOO_TIMEOUT_SECONDS": "120",
        "SUPERVISOR_HOROVODRUN_EXTRA_ARGS": "--verbose --blacklist-cooldown-range '10' 100",
        "SUPERVISOR_WATCH_READ_TIMEOUT_SECONDS": "120", "SUPERVISOR_RESYNC_SECONDS": "0.5",
        "SUPERVISOR_LOG_FORMAT": "console", "SUPERVISOR_LOG_LEVEL": "DEBUG",
        "SUPERVISOR_METRICS_PORT": "0", "SUPERVISOR_POD_NAME": "bert-launcher-x",
        "SUPERVISOR_FENCE_PORT": "9401", "SUPERVISOR_WORKER_TEMPLATE": "/etc/edl/worker.yaml",
        "SUPERVISOR_RESTART_EXIT_CODES": "137", "SUPERVISOR_FAIL_EXIT_CODES": "3",
        "SUPERVISOR_RESTART_EVENTS": "nodeNotReady", "SUPERVISOR_RESTART_LIMIT": "5",
        "SUPERVISOR_SLOT_RESTART_LIMIT": "2", "SUPERVISOR_BACKOFF_INITIAL_SECONDS": "0.5",
        "SUPERVISOR_BACKOFF_MAX_SECONDS": "10", "SUPERVISOR_DISRUPTIONS_FREE": "true",
        "SUPERVISOR_NODE_GRACE_SECONDS": "0", "SUPERVISOR_NODE_LEASE_SECONDS": "5",
        "SUPERVISOR_NODE_DISRUPTION_THRESHOLD": "off",
        "SUPERVISOR_SCALE_OUT_TIMEOUT_SECONDS": "120", "SUPERVISOR_SCALE_IN_TIMEOUT_SECONDS": "0",
        "SUPERVISOR_WORKER_START_TIMEOUT_SECONDS": "off",
        "SUPERVISOR_CLEAN_POD_POLICY": "All", "SUPERVISOR_API_TIMEOUT_SECONDS": "10",
        "SUPERVISOR_LEADER_LEASE_SECONDS": "30",
        "SUPERVISOR_WORKER_HOOK": "false", "SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS": "2.5",
        "SUPERVISOR_STALL_TIMEOUT_SECONDS": "900", "SUPERVISOR_HOROVODRUN_RESTART_LIMIT": "0",
        "SUPERVISOR_STUCK_SECONDS": "45",
        "SUPERVISOR_NODE_DRAIN_TAINTS": "example.com/going, ToBeDeletedByClusterAutoscaler",
        "SUPERVISOR_NODE_BAD_CONDITIONS": "none", "SUPERVISOR_QUARANTINE_FAILURES": "3",
        "SUPERVISOR_QUARANTINE_WINDOW_SECONDS": "600", "SUPERVISOR_QUARANTINE_SECONDS": "120",
        "SUPERVISOR_SLOW_FACTOR": "off", "SUPERVISOR_SLOW_SECONDS": "90",
        "SUPERVISOR_SLOW_MOVES": "0", "SUPERVISOR_SLOW_MOVES_WINDOW_SECONDS": "60",
        "SUPERVISOR_MODE": "baked", "SUPERVISOR_SHARED_DIR": "/run/es",
        "SUPERVISOR_SSH_HOST_KEYS": "Worker",
    }, read_text=lambda _: TEMPLATE.replace("app: x", "app: bert\n    role: worker"))
    assert (cfg.worker_selector, cfg.slots_per_worker, cfg.np, cfg.min_np, cfg.max_np) == (
        "app=bert,role=worker", 2, 4, 2, 8)
    assert (cfg.host_mode, cfg.staleness_s, cfg.start_timeout_s, cfg.shutdown_grace_s) == (
        HostMode.POD_DNS, 30.0, 120.5, 0.0)
    assert cfg.ssh_host_keys == SshHostKeys.WORKER
    assert (cfg.ssh_port, cfg.ssh_identity_file, cfg.network_interface, cfg.gloo_timeout_s) == (
        2222, Path("/etc/ssh-key/id"), "eth0", 120)
    assert cfg.extra_args == ("--verbose", "--blacklist-cooldown-range", "10", "100")
    assert (cfg.log_format, cfg.log_level, cfg.metrics_port, cfg.pod_name, cfg.fence_port) == (
        LogFormat.CONSOLE, LogLevel.DEBUG, 0, "bert-launcher-x", 9401)
    assert cfg.worker_template is not None and cfg.node_grace_s == 0.0
    assert cfg.node_disruption_threshold is None
    assert (cfg.node_lease_s, cfg.scale_out_timeout_s, cfg.scale_in_timeout_s) == (5, 120, 0)
    assert cfg.worker_start_timeout_s is None
    assert (cfg.clean_pod_policy, cfg.api_timeout_s, cfg.leader_lease_s) == (
        CleanPodPolicy.ALL, 10, 30)
    assert (cfg.worker_hook, cfg.heartbeat_timeout_s, cfg.stall_timeout_s,
            cfg.horovodrun_restart_limit, cfg.stuck_s) == (False, 2.5, 900.0, 0, 45.0)
    assert cfg.policy.budgets == Budgets(restart_limit=5, per_slot_limit=2,
                                         backoff_initial_s=0.5, backoff_max_s=10.0,
                                         disruptions_free=True)
    assert [(r.name, r.action) for r in cfg.policy.rules] == [
        ("SUPERVISOR_FAIL_EXIT_CODES", Action.FAIL_JOB),
        ("SUPERVISOR_RESTART_EXIT_CODES", Action.RESTART),
        ("SUPERVISOR_RESTART_EXIT_CODES: other exit codes", Action.IGNORE),
        ("SUPERVISOR_RESTART_EVENTS", Action.RESTART),
        ("SUPERVISOR_RESTART_EVENTS: other events", Action.IGNORE)]
    assert cfg.node_drain_taints == {"example.com/going", "ToBeDeletedByClusterAutoscaler"}
    assert cfg.node_bad_conditions == frozenset()
    assert (cfg.quarantine_failures, cfg.quarantine_window_s, cfg.quarantine_s) == (3, 600, 120)
    assert (cfg.slow_factor, cfg.slow_s, cfg.slow_moves, cfg.slow_moves_window_s) == (
        0.0, 90.0, 0, 60.0)
    assert (cfg.mode, cfg.shared_dir) == (Mode.BAKED, Path("/run/es"))
    assert all(src == "env" for src in cfg.sources.values())


@pytest.mark.parametrize(("env", "expected"), [
    pytest.param({"SUPERVISOR_WORKERS": "3", "SUPERVISOR_SLOTS_PER_WORKER": "2"},
                 (6, 6, 6), id="workers times slots gives np, min and max"),
    pytest.param({"SUPERVISOR_WORKERS": "2", "SUPERVISOR_MIN_WORKERS": "1",
                  "SUPERVISOR_MAX_WORKERS": "4", "SUPERVISOR_SLOTS_PER_WORKER": "4"},
                 (8, 4, 16), id="arena min and max workers scale by slots"),
    pytest.param({"SUPERVISOR_NP": "4", "SUPERVISOR_MAX_WORKERS": "3",
                  "SUPERVISOR_SLOTS_PER_WORKER": "2"},
                 (4, 4, 6), id="forms can be mixed across np, min and max"),
    pytest.param({"SUPERVISOR_MIN_NP": "2"}, (2, 2, 2), id="np defaults to min-np"),
])
def test_np_forms(env: dict[str, str], expected: tuple[int, int, int]) -> None:
    base = {k: v for k, v in BASE.items() if k != "SUPERVISOR_NP"}
    cfg = parse_config({**base, **env})
    assert (cfg.np, cfg.min_np, cfg.max_np) == expected


BAD = [
    ("SUPERVISOR_JOB_NAME", "Job_1", "SUPERVISOR_JOB_NAME='Job_1': expected a DNS label: "
     "lower-case letters, digits and '-', at most 63 characters"),
    ("SUPERVISOR_NAMESPACE", "-x", "SUPERVISOR_NAMESPACE='-x': expected a DNS label"),
    ("SUPERVISOR_WORKER_SELECTOR", "app in (a,b)", "SUPERVISOR_WORKER_SELECTOR='app in (a,b)':"
     " expected a label selector like 'key=value,other!=x' (no set-based terms)"),
    ("SUPERVISOR_SLOTS_PER_WORKER", "0", "SUPERVISOR_SLOTS_PER_WORKER='0': expected an integer"
     " 1..1024"),
    ("SUPERVISOR_NP", "four", "SUPERVISOR_NP='four': expected an integer >= 1"),
    ("SUPERVISOR_MIN_NP", "-1", "SUPERVISOR_MIN_NP='-1': expected an integer >= 1"),
    ("SUPERVISOR_MAX_NP", "2.5", "SUPERVISOR_MAX_NP='2.5': expected an integer >= 1"),
    ("SUPERVISOR_DISCOVERY_FILE", "hostfile", "SUPERVISOR_DISCOVERY_FILE='hostfile': expected"
     " an absolute path"),
    ("SUPERVISOR_DISCOVERY_SCRIPT", "./d.sh", "SUPERVISOR_DISCOVERY_SCRIPT='./d.sh': expected"
     " an absolute path"),
    ("SUPERVISOR_HOST_MODE", "hostname", "SUPERVISOR_HOST_MODE='hostname': expected one of"
     " ip|dns"),
    ("SUPERVISOR_MODE", "native", "SUPERVISOR_MODE='native': expected one of baked|sidecar"),
    ("SUPERVISOR_SHARED_DIR", "es", "SUPERVISOR_SHARED_DIR='es': expected an absolute path"),
    ("SUPERVISOR_STALENESS_SECONDS", "0", "SUPERVISOR_STALENESS_SECONDS='0': expected a number"
     " of seconds from 1 to 3600"),
    ("SUPERVISOR_START_TIMEOUT_SECONDS", "nan", "SUPERVISOR_START_TIMEOUT_SECONDS='nan':"
     " expected a number of seconds > 0"),
    ("SUPERVISOR_SHUTDOWN_GRACE_SECONDS", "-1", "SUPERVISOR_SHUTDOWN_GRACE_SECONDS='-1':"
     " expected a number of seconds >= 0"),
    ("SUPERVISOR_HOROVODRUN", "horovod run", "SUPERVISOR_HOROVODRUN='horovod run': expected a"
     " non-empty word without spaces"),
    ("SUPERVISOR_SSH_PORT", "70000", "SUPERVISOR_SSH_PORT='70000': expected an integer"
     " 1..65535"),
    ("SUPERVISOR_SSH_IDENTITY_FILE", "id_rsa", "SUPERVISOR_SSH_IDENTITY_FILE='id_rsa':"
     " expected an absolute path"),
    ("SUPERVISOR_NETWORK_INTERFACE", "eth0 eth1", "SUPERVISOR_NETWORK_INTERFACE='eth0 eth1':"
     " expected a non-empty word without spaces"),
    ("SUPERVISOR_GLOO_TIMEOUT_SECONDS", "0", "SUPERVISOR_GLOO_TIMEOUT_SECONDS='0': expected an"
     " integer >= 1"),
    ("SUPERVISOR_HOROVODRUN_EXTRA_ARGS", "--x 'open", "SUPERVISOR_HOROVODRUN_EXTRA_ARGS="
     "\"--x 'open\": expected shell-style words with balanced quotes"),
    ("SUPERVISOR_WATCH_READ_TIMEOUT_SECONDS", "30", "SUPERVISOR_WATCH_READ_TIMEOUT_SECONDS="
     "'30': expected more than 60 seconds"),
    ("SUPERVISOR_RESYNC_SECONDS", "inf", "SUPERVISOR_RESYNC_SECONDS='inf': expected a number of"
     " seconds from 0.05 to 60"),
    ("SUPERVISOR_LOG_FORMAT", "xml", "SUPERVISOR_LOG_FORMAT='xml': expected one of"
     " json|console"),
    ("SUPERVISOR_LOG_LEVEL", "trace", "SUPERVISOR_LOG_LEVEL='trace': expected one of"
     " debug|info|warning|error"),
    ("SUPERVISOR_METRICS_PORT", "http", "SUPERVISOR_METRICS_PORT='http': expected an integer"
     " 0..65535"),
    ("SUPERVISOR_FENCE_PORT", "70000", "SUPERVISOR_FENCE_PORT='70000': expected an integer"
     " 0..65535"),
    ("SUPERVISOR_HOOK_KEY_FILE", "hook-key", "SUPERVISOR_HOOK_KEY_FILE='hook-key': expected an"
     " absolute path"),
    ("SUPERVISOR_HOOK_KEY_FILE", "/nonexistent/hook-key", "SUPERVISOR_HOOK_KEY_FILE="
     "'/nonexistent/hook-key': expected a readable file with the hook's key (No such file or"
     " directory)"),
    ("SUPERVISOR_SSH_HOST_KEYS", "pod", "SUPERVISOR_SSH_HOST_KEYS='pod': expected one of "
     "worker|job|unchecked"),
    ("SUPERVISOR_SSH_KNOWN_HOSTS_FILE", "/nonexistent/known_hosts",
     "SUPERVISOR_SSH_KNOWN_HOSTS_FILE='/nonexistent/known_hosts': expected a readable "
     "known_hosts file (No such file or directory)"),
    ("SUPERVISOR_POD_NAME", " ", "SUPERVISOR_POD_NAME=' ': expected a non-empty word without"
     " spaces"),
    ("SUPERVISOR_WORKER_TEMPLATE", "pod.yaml", "SUPERVISOR_WORKER_TEMPLATE='pod.yaml': expected"
     " an absolute path"),
    ("SUPERVISOR_WORKER_CONTAINER", "a b", "SUPERVISOR_WORKER_CONTAINER='a b': expected a non-empty"
     " word without spaces"),
    ("SUPERVISOR_POLICY_FILE", "/nonexistent/policy.yaml", "SUPERVISOR_POLICY_FILE="
     "'/nonexistent/policy.yaml': cannot read: No such file or directory"),
    ("SUPERVISOR_RESTART_EXIT_CODES", "137,300", "SUPERVISOR_RESTART_EXIT_CODES='137,300': "
     "expected exit codes like '137,143,128-255' ('300' is outside 0-255 or reversed)"),
    ("SUPERVISOR_FAIL_EXIT_CODES", "1;2", "SUPERVISOR_FAIL_EXIT_CODES='1;2': expected exit codes"
     " like '137,143,128-255' ('1;2' is not N or N-M)"),
    ("SUPERVISOR_RESTART_EVENTS", "NodeLost", "SUPERVISOR_RESTART_EVENTS='NodeLost': expected "
     "comma-separated events ('NodeLost' is not one of Evicted|Hung|NodeNotReady|NotStarted|"
     "PodDeleted|PodForceDeleted|Preempted)"),
    ("SUPERVISOR_RESTART_LIMIT", "-1", "SUPERVISOR_RESTART_LIMIT='-1': expected an integer >= 0"),
    ("SUPERVISOR_SLOT_RESTART_LIMIT", "many", "SUPERVISOR_SLOT_RESTART_LIMIT='many': expected "
     "an integer >= 0"),
    ("SUPERVISOR_BACKOFF_INITIAL_SECONDS", "0", "SUPERVISOR_BACKOFF_INITIAL_SECONDS='0': "
     "expected a number of seconds > 0"),
    ("SUPERVISOR_BACKOFF_MAX_SECONDS", "0.5", "SUPERVISOR_BACKOFF_INITIAL_SECONDS=1 > "
     "SUPERVISOR_BACKOFF_MAX_SECONDS=0.5: expected initial <= max"),
    ("SUPERVISOR_DISRUPTIONS_FREE", "maybe", "SUPERVISOR_DISRUPTIONS_FREE='maybe': expected "
     "true|false"),
    ("SUPERVISOR_SCALE_OUT_TIMEOUT_SECONDS", "0", "SUPERVISOR_SCALE_OUT_TIMEOUT_SECONDS='0': "
     "expected a number of seconds > 0"),
    ("SUPERVISOR_SCALE_IN_TIMEOUT_SECONDS", "x", "SUPERVISOR_SCALE_IN_TIMEOUT_SECONDS='x': "
     "expected a number of seconds >= 0"),
    ("SUPERVISOR_NODE_LEASE_SECONDS", "0", "SUPERVISOR_NODE_LEASE_SECONDS='0': expected a "
     "number of seconds > 0"),
    ("SUPERVISOR_NODE_GRACE_SECONDS", "-5", "SUPERVISOR_NODE_GRACE_SECONDS='-5': expected a "
     "number of seconds >= 0"),
    ("SUPERVISOR_NODE_DISRUPTION_THRESHOLD", "1.5", "SUPERVISOR_NODE_DISRUPTION_THRESHOLD="
     "'1.5': expected a fraction in (0, 1] like 0.55, or off"),
    ("SUPERVISOR_NODE_DISRUPTION_THRESHOLD", "0", "SUPERVISOR_NODE_DISRUPTION_THRESHOLD="
     "'0': expected a fraction in (0, 1] like 0.55, or off"),
    ("SUPERVISOR_CLEAN_POD_POLICY", "Always", "SUPERVISOR_CLEAN_POD_POLICY='Always': expected "
     "one of Running|All|None"),
    ("SUPERVISOR_API_TIMEOUT_SECONDS", "0", "SUPERVISOR_API_TIMEOUT_SECONDS='0': expected a "
     "number of seconds from 1 to 300"),
    ("SUPERVISOR_LEADER_LEASE_SECONDS", "1", "SUPERVISOR_LEADER_LEASE_SECONDS='1': expected a "
     "number of seconds from 2 to 3600"),
    ("SUPERVISOR_WORKER_HOOK", "off", "SUPERVISOR_WORKER_HOOK='off': expected true|false"),
    ("SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS", "1", "SUPERVISOR_HEARTBEAT_TIMEOUT_SECONDS='1': "
     "expected a number of seconds >= 1.5 (three heartbeats)"),
    ("SUPERVISOR_STALL_TIMEOUT_SECONDS", "5", "SUPERVISOR_STALL_TIMEOUT_SECONDS='5': expected a "
     "number of seconds >= 10 (a few steps)"),
    ("SUPERVISOR_STUCK_SECONDS", "4", "SUPERVISOR_STUCK_SECONDS='4': expected auto, or a "
     "number of seconds >= 5"),
    ("SUPERVISOR_STUCK_SECONDS", "never", "SUPERVISOR_STUCK_SECONDS='never': expected auto, "
     "or a number of seconds >= 5"),
    ("SUPERVISOR_WORKER_START_TIMEOUT_SECONDS", "10", "SUPERVISOR_WORKER_START_TIMEOUT_SECONDS="
     "'10': expected off, or a number of seconds >= 30"),
    ("SUPERVISOR_HOROVODRUN_RESTART_LIMIT", "-1", "SUPERVISOR_HOROVODRUN_RESTART_LIMIT='-1': "
     "expected an integer >= 0"),
    ("SUPERVISOR_QUARANTINE_FAILURES", "-1", "SUPERVISOR_QUARANTINE_FAILURES='-1': expected an "
     "integer >= 0"),
    ("SUPERVISOR_QUARANTINE_WINDOW_SECONDS", "0", "SUPERVISOR_QUARANTINE_WINDOW_SECONDS='0': "
     "expected a number of seconds > 0"),
    ("SUPERVISOR_QUARANTINE_SECONDS", "x", "SUPERVISOR_QUARANTINE_SECONDS='x': expected a "
     "number of seconds > 0"),
    ("SUPERVISOR_SLOW_FACTOR", "1", "SUPERVISOR_SLOW_FACTOR='1': expected a factor > 1 like "
     "2.0, or off"),
    ("SUPERVISOR_SLOW_SECONDS", "-5", "SUPERVISOR_SLOW_SECONDS='-5': expected a number of "
     "seconds > 0"),
    ("SUPERVISOR_SLOW_MOVES", "two", "SUPERVISOR_SLOW_MOVES='two': expected an integer >= 0"),
    ("SUPERVISOR_SLOW_MOVES_WINDOW_SECONDS", "nan", "SUPERVISOR_SLOW_MOVES_WINDOW_SECONDS='nan': "
     "expected a number of seconds > 0"),
    ("SUPERVISOR_NODE_DRAIN_TAINTS", "a,,b", "SUPERVISOR_NODE_DRAIN_TAINTS='a,,b': expected "
     "comma-separated taint keys without spaces (e.g. ToBeDeletedByClusterAutoscaler), or none"),
    ("SUPERVISOR_NODE_BAD_CONDITIONS", "Kernel Deadlock", "SUPERVISOR_NODE_BAD_CONDITIONS="
     "'Kernel Deadlock': expected comma-separated node condition types without spaces (e.g. "
     "KernelDeadlock), or none"),
]


@pytest.mark.parametrize(("var", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_value_gets_one_precise_line(var: str, value: str, message: str) -> None:
    found = problems({**BASE, var: value})
    assert len(found) == 1, found
    assert found[0].startswith(message), found[0]


@pytest.mark.parametrize(("env", "message"), [
    pytest.param({"SUPERVISOR_RESYNC_SECONDS": "0.01"}, "SUPERVISOR_RESYNC_SECONDS='0.01': "
                 "expected a number of seconds from 0.05 to 60", id="resync: a busy loop"),
    pytest.param({"SUPERVISOR_RESYNC_SECONDS": "600"}, "SUPERVISOR_RESYNC_SECONDS='600': "
                 "expected a number of seconds from 0.05 to 60", id="resync: no tick at all"),
    pytest.param({"SUPERVISOR_STALENESS_SECONDS": "86400"}, "SUPERVISOR_STALENESS_SECONDS="
                 "'86400': expected a number of seconds from 1 to 3600",
                 id="staleness: stale hosts for a day"),
    pytest.param({"SUPERVISOR_STALENESS_SECONDS": "2", "SUPERVISOR_RESYNC_SECONDS": "5"},
                 "SUPERVISOR_STALENESS_SECONDS=2 <= SUPERVISOR_RESYNC_SECONDS=5: expected the "
                 "staleness bound above the resync period (it is checked on each tick)",
                 id="staleness shorter than a tick"),
    pytest.param({"SUPERVISOR_JOB_NAME": "a" * 54},
                 "SUPERVISOR_JOB_NAME='" + "a" * 54 + "': expected at most 53 characters: "
                 "worker pods are named <job>-w<slot>-<incarnation>, at most 63 characters, "
                 "for up to 4 workers", id="job name too long for its pod names"),
    pytest.param({"SUPERVISOR_JOB_NAME": "a" * 52, "SUPERVISOR_MAX_NP": "1000"},
                 "SUPERVISOR_JOB_NAME='" + "a" * 52 + "': expected at most 50 characters: "
                 "worker pods are named <job>-w<slot>-<incarnation>, at most 63 characters, "
                 "for up to 1000 workers", id="the longest slot number counts"),
])
def test_values_out_of_range_together(env: dict[str, str], message: str) -> None:
    assert problems({**BASE, **env}) == [message]


def test_a_job_name_that_leaves_room_for_its_pod_names_is_accepted() -> None:
    assert parse(SUPERVISOR_JOB_NAME="a" * 53).job_name == "a" * 53


@pytest.mark.parametrize(("content", "ok"), [
    ("ab" * 32 + "\n", True), ("ab" * 16, True), ("ab" * 15, False), ("not hex", False),
    ("", False)])
def test_the_hook_key_file_holds_enough_hex_digits(tmp_path: Path, content: str,
                                                   ok: bool) -> None:
    key = tmp_path / "hook-key"
    key.write_text(content)
    if ok:
        assert parse(SUPERVISOR_HOOK_KEY_FILE=str(key)).hook_key_file == (
            key, bytes.fromhex(content))
    else:
        assert problems({**BASE, "SUPERVISOR_HOOK_KEY_FILE": str(key)}) == [
            f"SUPERVISOR_HOOK_KEY_FILE='{key}': expected a file with at least 32 hex digits "
            "(e.g. `openssl rand -hex 32`)"]


PUB = "AAAAC3NzaC1lZDI1NTE5AAAAILEA8lus+cDZ80oX0WtzxxXRtPdJ6vw4RJ2FYbeL73Q4"


@pytest.mark.parametrize(("content", "ok"), [
    pytest.param(f"* ssh-ed25519 {PUB}\n", True, id="ssh-keygen.sh's line"),
    pytest.param(f"# pinned\n\n[10.0.0.1]:2222 ecdsa-sha2-nistp256 {PUB} c\n", True,
                 id="a comment, a port, a comment after the key"),
    pytest.param(f"@cert-authority * ssh-ed25519 {PUB}\n", True, id="a host CA"),
    pytest.param("", False, id="empty"),
    pytest.param(f"ssh-ed25519 {PUB}\n", False, id="a public key file, no host pattern"),
    pytest.param("* ssh-ed25519 not-base64!\n", False, id="a damaged key"),
])
def test_the_known_hosts_file_holds_a_host_key(tmp_path: Path, content: str, ok: bool) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(content)
    if ok:
        assert parse(SUPERVISOR_SSH_KNOWN_HOSTS_FILE=str(known)).ssh_known_hosts_file == known
    else:
        assert problems({**BASE, "SUPERVISOR_SSH_KNOWN_HOSTS_FILE": str(known)}) == [
            f"SUPERVISOR_SSH_KNOWN_HOSTS_FILE='{known}': expected a known_hosts file with at "
            "least one host key line, like '* ssh-ed25519 AAAA...' (manifests/ssh-keygen.sh "
            "writes one)"]


def test_the_host_keys_default_follows_the_known_hosts_file_then_the_template(
        tmp_path: Path) -> None:
    """Each worker its own key when the supervisor makes the workers; the job's one key when a
    known_hosts file is given; unchecked only when neither (no pod of ours to give a key)."""
    known = tmp_path / "known_hosts"
    known.write_text(f"* ssh-ed25519 {PUB}\n")
    template = {"SUPERVISOR_WORKER_TEMPLATE": "/etc/edl/worker.yaml"}
    read = {"read_text": lambda _: TEMPLATE}
    cases = [
        ({}, SshHostKeys.UNCHECKED, "default", None),
        (template, SshHostKeys.WORKER, "derived: WORKER_TEMPLATE", "/etc/edl/hostfile.known_hosts"),
        ({"SUPERVISOR_SSH_KNOWN_HOSTS_FILE": str(known)}, SshHostKeys.JOB,
         "derived: SSH_KNOWN_HOSTS_FILE", str(known)),
        ({**template, "SUPERVISOR_SSH_HOST_KEYS": "unchecked"}, SshHostKeys.UNCHECKED, "env",
         None),
    ]
    for env, mode, source, path in cases:
        cfg = parse_config({**BASE, **env}, **read) if env.get(
            "SUPERVISOR_WORKER_TEMPLATE") else parse(**env)
        assert (cfg.ssh_host_keys, cfg.sources["SUPERVISOR_SSH_HOST_KEYS"]) == (mode, source), env
        got = known_hosts_path(cfg)
        assert (str(got) if got else None) == path, env


def test_a_host_key_mode_without_what_it_needs_is_refused(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"* ssh-ed25519 {PUB}\n")
    assert problems({**BASE, "SUPERVISOR_SSH_HOST_KEYS": "job"}) == [
        "SUPERVISOR_SSH_HOST_KEYS=job: needs SUPERVISOR_SSH_KNOWN_HOSTS_FILE (the known_hosts "
        "line of the job's host key)"]
    assert problems({**BASE, "SUPERVISOR_SSH_HOST_KEYS": "worker"}) == [
        "SUPERVISOR_SSH_HOST_KEYS=worker: needs SUPERVISOR_WORKER_TEMPLATE (the supervisor "
        "makes each worker's key when it creates the pod); expected job or unchecked without "
        "one"]
    assert problems({**BASE, "SUPERVISOR_SSH_HOST_KEYS": "unchecked",
                     "SUPERVISOR_SSH_KNOWN_HOSTS_FILE": str(known)}) == [
        "SUPERVISOR_SSH_HOST_KEYS=unchecked: SUPERVISOR_SSH_KNOWN_HOSTS_FILE is set too; "
        "expected SUPERVISOR_SSH_HOST_KEYS=job with it, or no known_hosts file"]


def test_every_variable_is_covered_by_the_bad_value_table() -> None:
    tested = {b[0] for b in BAD} | {"SUPERVISOR_WORKERS", "SUPERVISOR_MIN_WORKERS",
                                    "SUPERVISOR_MAX_WORKERS"}
    assert tested == {f"SUPERVISOR_{v.name}" for v in VARIABLES}


# Config fields that no variable fills alone: put together after the table's loop.
DERIVED = {
    "policy": "POLICY_FILE's rules and budgets, then the rules and budget variables' (dotted)",
    "worker_template": "WORKER_TEMPLATE's file, read and checked against WORKER_SELECTOR",
    "sources": "where each value came from, for explain",
}
# Variables that fill no field of their own (an Arena form, folded into NP and its kin).
FOLDED = {"WORKERS", "MIN_WORKERS", "MAX_WORKERS"}


def test_every_config_field_is_filled_by_one_variable_unless_derived() -> None:
    direct = [v.field for v in VARIABLES if v.field and "." not in v.field]
    assert len(direct) == len(set(direct)), "a field filled by two variables"
    assert not set(direct) & DERIVED.keys()
    assert set(direct) | DERIVED.keys() == {f.name for f in fields(Config)}
    assert {v.name for v in VARIABLES if v.field is None} == FOLDED
    cfg = parse()
    for v in VARIABLES:
        if v.field and "." in v.field:
            root, *inner = v.field.split(".")
            assert root in DERIVED, v.name
            reduce(getattr, inner, getattr(cfg, root))  # AttributeError: no such field


def test_sidecar_mode_puts_discovery_in_the_shared_dir() -> None:
    cfg = parse(SUPERVISOR_MODE="sidecar", SUPERVISOR_SHARED_DIR="/es")
    assert (cfg.mode, cfg.discovery_file, cfg.discovery_script) == (
        Mode.SIDECAR, Path("/es/hosts"), Path("/es/discover_hosts.sh"))
    assert cfg.sources["SUPERVISOR_DISCOVERY_FILE"] == "derived: SHARED_DIR"
    baked = parse()
    assert (baked.mode, baked.discovery_file) == (Mode.BAKED, Path("/etc/edl/hostfile"))
    assert problems({**BASE, "SUPERVISOR_MODE": "sidecar", "SUPERVISOR_SHARED_DIR": "/es",
                     "SUPERVISOR_DISCOVERY_FILE": "/etc/edl/hostfile",
                     "SUPERVISOR_DISCOVERY_SCRIPT": "/es/bin/d.sh"}) == [
        "SUPERVISOR_DISCOVERY_FILE='/etc/edl/hostfile': in sidecar mode expected a path under "
        "SUPERVISOR_SHARED_DIR (/es), which the training container mounts too (or leave it "
        "unset)"]


def test_all_problems_are_reported_at_once() -> None:
    found = problems({"SUPERVISOR_NP": "x", "SUPERVISOR_LOG_LEVEL": "loud",
                      "SUPERVISOR_SLOTS_PER_WORKR": "2"})
    assert found == [
        "SUPERVISOR_SLOTS_PER_WORKR: unknown variable (did you mean SUPERVISOR_SLOTS_PER_WORKER?);"
        " see `elastic-supervisor explain`",
        "SUPERVISOR_JOB_NAME: required (a DNS label naming the training job)",
        "SUPERVISOR_NAMESPACE: not set and no in-cluster or kubeconfig namespace found; set it",
        "SUPERVISOR_NP='x': expected an integer >= 1",
        "SUPERVISOR_LOG_LEVEL='loud': expected one of debug|info|warning|error",
    ]


def test_problems_come_in_the_order_of_the_variables_table() -> None:
    found = problems({"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n",
                      "SUPERVISOR_STALL_TIMEOUT_SECONDS": "5", "SUPERVISOR_STUCK_SECONDS": "4",
                      "SUPERVISOR_WORKER_CONTAINER": "a b", "SUPERVISOR_MAX_WORKERS": "x"})
    assert [p.split("=")[0].split(":")[0] for p in found] == [
        "SUPERVISOR_NP", "SUPERVISOR_MAX_WORKERS", "SUPERVISOR_WORKER_CONTAINER",
        "SUPERVISOR_STUCK_SECONDS", "SUPERVISOR_STALL_TIMEOUT_SECONDS"]


@pytest.mark.parametrize(("env", "message"), [
    pytest.param({"SUPERVISOR_NP": "4", "SUPERVISOR_WORKERS": "4"},
                 "SUPERVISOR_NP and SUPERVISOR_WORKERS: give one of them, not both",
                 id="np and workers together"),
    pytest.param({"SUPERVISOR_NP": "bad", "SUPERVISOR_WORKERS": "4"},
                 "SUPERVISOR_NP and SUPERVISOR_WORKERS: give one of them, not both",
                 id="np and workers together even when np is invalid"),
    pytest.param({"SUPERVISOR_NP": "4", "SUPERVISOR_MIN_NP": "5"},
                 "SUPERVISOR_MIN_NP=5, SUPERVISOR_NP=4, SUPERVISOR_MAX_NP=4: expected "
                 "MIN_NP <= NP <= MAX_NP", id="min above np"),
    pytest.param({"SUPERVISOR_NP": "4", "SUPERVISOR_MAX_NP": "3"},
                 "SUPERVISOR_MIN_NP=4, SUPERVISOR_NP=4, SUPERVISOR_MAX_NP=3: expected "
                 "MIN_NP <= NP <= MAX_NP", id="max below np"),
    pytest.param({}, "SUPERVISOR_NP: required (or SUPERVISOR_WORKERS, or SUPERVISOR_MIN_NP)",
                 id="no size at all"),
])
def test_size_rules(env: dict[str, str], message: str) -> None:
    base = {"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n"}
    assert message in problems({**base, **env})


@pytest.mark.parametrize(("pod_ns", "kc_ns", "env_ns", "expected", "source"), [
    pytest.param("from-pod", "from-kc", None, "from-pod", "derived: service account",
                 id="in a pod the service account namespace wins"),
    pytest.param(None, "from-kc", None, "from-kc", "derived: kubeconfig",
                 id="locally the kubeconfig namespace"),
    pytest.param("from-pod", "from-kc", "explicit", "explicit", "env",
                 id="an explicit namespace beats both"),
])
def test_namespace_default(pod_ns: str | None, kc_ns: str | None, env_ns: str | None,
                           expected: str, source: str) -> None:
    env = {"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NP": "1"}
    if env_ns:
        env["SUPERVISOR_NAMESPACE"] = env_ns
    cfg = parse_config(env, pod_namespace=pod_ns, kubeconfig_namespace=kc_ns)
    assert (cfg.namespace, cfg.sources["SUPERVISOR_NAMESPACE"]) == (expected, source)


def test_pod_name_defaults_to_hostname_only_inside_a_pod() -> None:
    env = {**BASE, "HOSTNAME": "job1-launcher-abc"}
    assert parse_config(env, pod_namespace="team-a").pod_name == "job1-launcher-abc"
    assert parse_config(env).pod_name is None


def test_non_supervisor_variables_are_ignored() -> None:
    assert parse(PATH="/bin", SUPERVISORX="1").np == 4


def test_effective_values_list_every_variable_with_its_source() -> None:
    rows = {name: (value, source) for name, value, source in effective_values(parse())}
    assert rows["SUPERVISOR_NP"] == ("4", "env")
    assert rows["SUPERVISOR_MAX_NP"] == ("4", "derived: NP")
    assert rows["SUPERVISOR_SSH_PORT"] == ("", "unset")
    assert rows["SUPERVISOR_LOG_FORMAT"] == ("json", "default")
    assert "SUPERVISOR_WORKERS" not in rows  # folded into NP


def test_packaged_discovery_script_only_cats_the_file() -> None:
    script = packaged_discovery_script()
    assert script.is_file()
    body = [line for line in script.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert body == ['exec cat -- "${SUPERVISOR_DISCOVERY_FILE:-/etc/edl/hostfile}"']


def files(**by_name: str):  # a read_text over in-memory files; a missing one raises like open()
    def read(path: Path) -> str:
        if path.name not in by_name:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return by_name[path.name]
    return read


def test_policy_defaults_without_any_policy_variable() -> None:
    cfg = parse()
    assert cfg.policy.rules == () and cfg.policy.budgets == Budgets()
    assert cfg.worker_template is None
    killed = Failure(Cause.EXIT_CODE, "w", "u", "n", 137, "worker")
    assert match(cfg.policy.rules, killed).action is Action.RESTART


def test_restart_exit_codes_replace_the_default_code_rule() -> None:
    cfg = parse(SUPERVISOR_RESTART_EXIT_CODES="143")
    for code, action in ((143, Action.RESTART), (137, Action.IGNORE), (1, Action.IGNORE)):
        f = Failure(Cause.EXIT_CODE, "w", "u", "n", code, "worker")
        assert decide(cfg.policy, f, "0", Ledger(), 0.0).action is action, code
    # causes keep their defaults
    lost = Failure(Cause.NODE_NOT_READY, "w", "u", "n")
    assert match(cfg.policy.rules, lost).action is Action.RESTART


def test_restart_events_drop_the_causes_not_listed() -> None:
    cfg = parse(SUPERVISOR_RESTART_EVENTS="NodeNotReady")
    evicted = Failure(Cause.EVICTED, "w", "u", "n")
    assert match(cfg.policy.rules, evicted).action is Action.IGNORE
    assert match(cfg.policy.rules, Failure(Cause.NODE_NOT_READY, "w", "u", "n")).action \
        is Action.RESTART


POLICY = """\
faultTolerantPolicy:
- exitCodes: 129,101
  restartPolicy: ExitCode
  restartScope: Pod
- exceptionalEvent: nodeNotReady
  restartPolicy: OnNodeFail
restartLimit: 7
"""


def test_policy_file_is_read_and_its_budgets_win_over_env_defaults() -> None:
    cfg = parse_config({**BASE, "SUPERVISOR_POLICY_FILE": "/etc/edl/policy.yaml",
                        "SUPERVISOR_SLOT_RESTART_LIMIT": "3"},
                       read_text=files(**{"policy.yaml": POLICY}))
    assert [r.name for r in cfg.policy.rules] == ["faultTolerantPolicy[0]",
                                                  "faultTolerantPolicy[1]"]
    assert cfg.policy.budgets.restart_limit == 7
    assert cfg.policy.budgets.per_slot_limit == 3
    assert cfg.sources["SUPERVISOR_RESTART_LIMIT"] == "derived: POLICY_FILE"


@pytest.mark.parametrize(("env", "text", "message"), [
    pytest.param({"SUPERVISOR_RESTART_LIMIT": "9"}, POLICY,
                 "SUPERVISOR_RESTART_LIMIT and SUPERVISOR_POLICY_FILE: both set this budget; "
                 "keep one", id="budget in both places"),
    pytest.param({"SUPERVISOR_RESTART_EXIT_CODES": "137"}, POLICY,
                 "SUPERVISOR_RESTART_EXIT_CODES and SUPERVISOR_POLICY_FILE: rules come from one "
                 "place", id="rules in both places"),
    pytest.param({}, "faultTolerantPolicy:\n- exitCodes: 1\n  action: Retry\n",
                 "SUPERVISOR_POLICY_FILE='/p/policy.yaml': faultTolerantPolicy[0].action: "
                 "'Retry': expected one of Restart|Ignore|FailJob", id="bad rule names its index"),
    pytest.param({}, "faultTolerantPolicy: [\n", "SUPERVISOR_POLICY_FILE='/p/policy.yaml': not "
                 "valid YAML at line 2", id="broken yaml names the line"),
    pytest.param({}, "", "SUPERVISOR_POLICY_FILE='/p/policy.yaml': the file is empty",
                 id="empty file"),
])
def test_policy_file_problems(env: dict[str, str], text: str, message: str) -> None:
    found = problems({**BASE, "SUPERVISOR_POLICY_FILE": "/p/policy.yaml", **env},
                     read_text=files(**{"policy.yaml": text}))
    assert len(found) == 1 and found[0].startswith(message), found


def test_worker_template_is_validated_against_the_selector() -> None:
    env = {**BASE, "SUPERVISOR_WORKER_TEMPLATE": "/t/worker.yaml",
           "SUPERVISOR_WORKER_SELECTOR": "app=bert"}
    found = problems(env, read_text=files(**{"worker.yaml": TEMPLATE}))
    assert found == ["SUPERVISOR_WORKER_TEMPLATE='/t/worker.yaml': template.metadata.labels.app:"
                     " expected 'bert' to match the worker selector"]
    cfg = parse_config({**env, "SUPERVISOR_WORKER_SELECTOR": "app=x"},
                       read_text=files(**{"worker.yaml": TEMPLATE}))
    assert cfg.worker_template["spec"]["containers"][0]["name"] == "worker"
    assert problems({**BASE, "SUPERVISOR_WORKER_TEMPLATE": "/t/missing.yaml"},
                    read_text=files()) == [
        "SUPERVISOR_WORKER_TEMPLATE='/t/missing.yaml': cannot read: No such file or directory"]


def test_the_training_container_must_be_one_of_the_templates() -> None:
    env = {**BASE, "SUPERVISOR_WORKER_TEMPLATE": "/t/worker.yaml",
           "SUPERVISOR_WORKER_SELECTOR": "app=x"}
    read = files(**{"worker.yaml": TEMPLATE})
    assert problems({**env, "SUPERVISOR_WORKER_CONTAINER": "trainer"}, read_text=read) == [
        "SUPERVISOR_WORKER_CONTAINER='trainer': not a container of the worker template (its "
        "containers: worker)"]
    assert parse_config({**env, "SUPERVISOR_WORKER_CONTAINER": "worker"},
                        read_text=read).worker_container == "worker"
    assert parse_config(env, read_text=read).worker_container is None


@pytest.mark.parametrize(("extra", "word", "option", "var"), [
    pytest.param("-np 8", "-np", "-np", "NP", id="-np: the start size"),
    pytest.param("--num-proc=8", "--num-proc=8", "--num-proc", "NP",
                 id="--num-proc=8: the long alias with its value attached"),
    pytest.param("--verbose --min-np 1", "--min-np", "--min-np", "MIN_NP",
                 id="--min-np after an option of horovodrun's own"),
    pytest.param("--max-num-proc 64", "--max-num-proc", "--max-num-proc", "MAX_NP",
                 id="--max-num-proc"),
    pytest.param("--slots-per-host=4", "--slots-per-host=4", "--slots-per-host",
                 "SLOTS_PER_WORKER", id="--slots-per-host=4"),
    pytest.param("--host-discovery-script /bin/hosts", "--host-discovery-script",
                 "--host-discovery-script", "DISCOVERY_SCRIPT", id="--host-discovery-script"),
    pytest.param("--host-discovery /bin/hosts", "--host-discovery", "--host-discovery-script",
                 "DISCOVERY_SCRIPT", id="an abbreviation argparse expands"),
    pytest.param("-p2222", "-p2222", "-p", "SSH_PORT", id="-p with its value attached"),
    pytest.param("--ssh-identity-file=/k", "--ssh-identity-file=/k", "--ssh-identity-file",
                 "SSH_IDENTITY_FILE", id="--ssh-identity-file=/k"),
    pytest.param("--network-interfaces eth1", "--network-interfaces", "--network-interfaces",
                 "NETWORK_INTERFACE", id="--network-interfaces (plural)"),
    pytest.param("--gloo-timeout-seconds 5", "--gloo-timeout-seconds",
                 "--gloo-timeout-seconds", "GLOO_TIMEOUT_SECONDS", id="--gloo-timeout-seconds"),
])
def test_extra_args_that_repeat_an_option_the_supervisor_sets_are_refused(
        extra: str, word: str, option: str, var: str) -> None:
    assert problems({**BASE, "SUPERVISOR_HOROVODRUN_EXTRA_ARGS": extra}) == [
        f"SUPERVISOR_HOROVODRUN_EXTRA_ARGS={extra!r}: expected no option the supervisor sets "
        "itself (horovodrun takes the last one given: it would override the supervisor's); "
        f"{word!r} is {option}: set SUPERVISOR_{var} instead"]


@pytest.mark.parametrize("extra", [
    "--verbose --reset-limit 50 --blacklist-cooldown-range 10 100",
    "--gloo", "-prefix-timestamp", "--start-timeout 60", "--log-level DEBUG",
])
def test_horovodruns_other_options_pass_through(extra: str) -> None:
    assert parse(SUPERVISOR_HOROVODRUN_EXTRA_ARGS=extra).extra_args == tuple(extra.split())


def test_every_option_the_supervisor_passes_is_one_extra_args_may_not_repeat() -> None:
    cfg = parse(SUPERVISOR_SSH_PORT="2222", SUPERVISOR_SSH_IDENTITY_FILE="/keys/id",
                SUPERVISOR_NETWORK_INTERFACE="eth0", SUPERVISOR_GLOO_TIMEOUT_SECONDS="120")
    argv = horovodrun_argv(cfg, ["python", "train.py"])
    passed = {w for w in argv[1:-2] if w.startswith("-")}
    assert len(passed) == 9 and passed <= set(OWNED_OPTIONS)
