"""The configuration's types: the typed, frozen `Config` and its enums, ConfigError."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from supervisor.decide import disruption
from supervisor.decide.hostlist import HostMode
from supervisor.decide.policy import (
    Policy,
)

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
    slow_factor: float = 2.5  # 0.0: stragglers not watched
    slow_s: float = 30.0
    slow_moves: int = 2  # 0: reported only
    slow_moves_window_s: float = 3600.0
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
