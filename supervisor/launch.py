"""PURE: the exact horovodrun command line and environment, built from the config.

Never goes through a shell: every value is one argv element, so nothing from the environment is
ever interpreted by a shell. The training command is appended verbatim after the options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.config import Config, known_hosts_path
from supervisor.hook.elastic_supervisor_hook import KNOWN_HOSTS_ENV


def horovodrun_argv(cfg: Config, command: Sequence[str], np: int | None = None) -> list[str]:
    """Return the horovodrun argv for `command` (the training program and its arguments);
    `np`: -np (default NP; see decide/start.py's start_np)."""
    if not command:
        raise ValueError("no training command given (elastic-supervisor run -- python train.py)")
    argv = [
        cfg.horovodrun,
        "-np", str(cfg.np if np is None else np),
        "--min-np", str(cfg.min_np),
        # horovodrun's --max-np defaults to unbounded in code: always pass it.
        "--max-np", str(cfg.max_np),
        # A line without ':slots' would make horovodrun fall back to this (default None: crash).
        "--slots-per-host", str(cfg.slots_per_worker),
        "--host-discovery-script", str(cfg.discovery_script),
    ]
    if cfg.ssh_port is not None:
        argv += ["--ssh-port", str(cfg.ssh_port)]
    if cfg.ssh_identity_file is not None:
        argv += ["--ssh-identity-file", str(cfg.ssh_identity_file)]
    if cfg.network_interface is not None:
        argv += ["--network-interface", cfg.network_interface]
    if cfg.gloo_timeout_s is not None:
        argv += ["--gloo-timeout-seconds", str(cfg.gloo_timeout_s)]
    argv += list(cfg.extra_args)
    argv += list(command)
    return argv


def horovodrun_env(cfg: Config, base: Mapping[str, str],
                   hook: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment for horovodrun: `base` plus what the discovery script reads and
    the hook's variables (its PYTHONPATH first, the channel's port and key: see
    channel.HookChannel.new_run; the pinned host keys the driver's ssh checks).
    horovodrun forwards its environment to every worker."""
    env = dict(base)
    env["SUPERVISOR_DISCOVERY_FILE"] = str(cfg.discovery_file)
    if (known_hosts := known_hosts_path(cfg)) is not None:
        env[KNOWN_HOSTS_ENV] = str(known_hosts)
    env.update(hook or {})
    return env
