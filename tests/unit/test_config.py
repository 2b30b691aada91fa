"""Config parsing: defaults, derived values, Arena forms, and one precise line per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import (
    VARIABLES,
    Config,
    ConfigError,
    HostMode,
    LogFormat,
    LogLevel,
    effective_values,
    packaged_discovery_script,
    parse_config,
)

BASE = {"SUPERVISOR_JOB_NAME": "job1", "SUPERVISOR_NAMESPACE": "team-a", "SUPERVISOR_NP": "4"}


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
    })
    assert (cfg.worker_selector, cfg.slots_per_worker, cfg.np, cfg.min_np, cfg.max_np) == (
        "app=bert,role=worker", 2, 4, 2, 8)
    assert (cfg.host_mode, cfg.staleness_s, cfg.start_timeout_s, cfg.shutdown_grace_s) == (
        HostMode.POD_DNS, 30.0, 120.5, 0.0)
    assert (cfg.ssh_port, cfg.ssh_identity_file, cfg.network_interface, cfg.gloo_timeout_s) == (
        2222, Path("/etc/ssh-key/id"), "eth0", 120)
    assert cfg.extra_args == ("--verbose", "--blacklist-cooldown-range", "10", "100")
    assert (cfg.log_format, cfg.log_level, cfg.metrics_port, cfg.pod_name) == (
        LogFormat.CONSOLE, LogLevel.DEBUG, 0, "bert-launcher-x")
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
    ("SUPERVISOR_STALENESS_SECONDS", "0", "SUPERVISOR_STALENESS_SECONDS='0': expected a number"
     " of seconds > 0"),
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
     " seconds > 0"),
    ("SUPERVISOR_LOG_FORMAT", "xml", "SUPERVISOR_LOG_FORMAT='xml': expected one of"
     " json|console"),
    ("SUPERVISOR_LOG_LEVEL", "trace", "SUPERVISOR_LOG_LEVEL='trace': expected one of"
     " debug|info|warning|error"),
    ("SUPERVISOR_METRICS_PORT", "http", "SUPERVISOR_METRICS_PORT='http': expected an integer"
     " 0..65535"),
    ("SUPERVISOR_POD_NAME", " ", "SUPERVISOR_POD_NAME=' ': expected a non-empty word without"
     " spaces"),
]


@pytest.mark.parametrize(("var", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_value_gets_one_precise_line(var: str, value: str, message: str) -> None:
    found = problems({**BASE, var: value})
    assert len(found) == 1, found
    assert found[0].startswith(message), found[0]


def test_every_variable_is_covered_by_the_bad_value_table() -> None:
    tested = {b[0] for b in BAD} | {"SUPERVISOR_WORKERS", "SUPERVISOR_MIN_WORKERS",
                                    "SUPERVISOR_MAX_WORKERS"}
    assert tested == {f"SUPERVISOR_{v.name}" for v in VARIABLES}


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
