"""The horovodrun argv: always the elastic flags, optional ones only when set, no shell ever."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import packaged_discovery_script, parse_config
from supervisor.decide.start import Sizes, start_np
from supervisor.launch import horovodrun_argv, horovodrun_env

BASE = {"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n", "SUPERVISOR_NP": "4",
        "SUPERVISOR_MIN_NP": "2", "SUPERVISOR_MAX_NP": "8"}
SCRIPT = str(packaged_discovery_script())


def argv(cmd: list[str], **env: str) -> list[str]:
    return horovodrun_argv(parse_config({**BASE, **env}), cmd)


def test_minimal_argv_always_has_the_elastic_flags() -> None:
    assert argv(["python", "train.py"]) == [
        "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "8", "--slots-per-host", "1",
        "--host-discovery-script", SCRIPT, "python", "train.py"]


def test_optional_flags_then_extra_args_then_the_command() -> None:
    got = argv(["python", "train.py", "--epochs", "3"],
               SUPERVISOR_SSH_PORT="2222", SUPERVISOR_SSH_IDENTITY_FILE="/keys/id",
               SUPERVISOR_NETWORK_INTERFACE="eth0", SUPERVISOR_GLOO_TIMEOUT_SECONDS="120",
               SUPERVISOR_HOROVODRUN_EXTRA_ARGS="--verbose --reset-limit 50",
               SUPERVISOR_HOROVODRUN="/opt/hvd/bin/horovodrun",
               SUPERVISOR_SLOTS_PER_WORKER="2")
    assert got == [
        "/opt/hvd/bin/horovodrun", "-np", "4", "--min-np", "2", "--max-np", "8",
        "--slots-per-host", "2", "--host-discovery-script", SCRIPT,
        "--ssh-port", "2222", "--ssh-identity-file", "/keys/id",
        "--network-interface", "eth0", "--gloo-timeout-seconds", "120",
        "--verbose", "--reset-limit", "50", "python", "train.py", "--epochs", "3"]


@pytest.mark.parametrize("hostile", [
    "$(touch /tmp/pwned)", "`id`", "a; rm -rf /", "x' \"y", "*", "--lr=0.1 && reboot", "",
])
def test_values_are_single_argv_elements_never_shell_text(hostile: str) -> None:
    got = argv(["python", "train.py", hostile])
    assert got[-1] == hostile
    assert got[-3:-1] == ["python", "train.py"]


def test_extra_args_are_split_like_words_but_not_expanded() -> None:
    got = argv(["t"], SUPERVISOR_HOROVODRUN_EXTRA_ARGS="--x '$HOME and `id`' *")
    assert got[-4:] == ["--x", "$HOME and `id`", "*", "t"]


def test_an_empty_command_is_refused() -> None:
    with pytest.raises(ValueError, match="no training command"):
        argv([])


def test_env_tells_the_script_where_the_file_is() -> None:
    cfg = parse_config({**BASE, "SUPERVISOR_DISCOVERY_FILE": "/run/edl/h"})
    env = horovodrun_env(cfg, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "SUPERVISOR_DISCOVERY_FILE": "/run/edl/h"}


def test_env_tells_the_drivers_hook_which_host_keys_to_pin(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILEA8lus+cDZ80oX0WtzxxXRtPdJ6vw4\n")
    cfg = parse_config({**BASE, "SUPERVISOR_SSH_KNOWN_HOSTS_FILE": str(known)})
    env = horovodrun_env(cfg, {})
    assert env["ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS"] == str(known)


@pytest.mark.parametrize(("usable", "restart", "np"), [
    (1, False, 4),  # the first start waits for NP: the workers are being created
    (8, False, 4),
    (3, True, 3),  # a restart trains with what is usable now...
    (1, True, 2),  # ...at least MIN_NP (horovodrun's own wait)...
    (11, True, 8),  # ...at most MAX_NP
    (4, True, 4),
])
def test_a_restart_starts_with_the_usable_slots_within_min_and_max(
        usable: int, restart: bool, np: int) -> None:
    cfg = parse_config(BASE)
    sizes = Sizes(cfg.np, cfg.min_np, cfg.max_np)
    assert start_np(sizes, usable, restart=restart) == np
    got = horovodrun_argv(cfg, ["python", "train.py"], start_np(sizes, usable, restart=restart))
    assert got[1:3] == ["-np", str(np)]
