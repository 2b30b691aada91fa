"""The table of `SUPERVISOR_*` variables: each one's name, default, parser, `Config` field and
meaning; parsing, `explain` and docs/env-vars.md are loops over it."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.config.parsers import (
    _abs_path,
    _args,
    _at_least,
    _bool,
    _codes,
    _dns_label,
    _enum,
    _events,
    _factor_or_off,
    _fraction_or_off,
    _hook_key,
    _int_in,
    _known_hosts,
    _names,
    _none_is,
    _nonempty,
    _rule_of,
    _seconds,
    _seconds_in,
    _seconds_or,
    _selector,
    _watch_read_timeout,
)
from supervisor.config.values import (
    PREFIX,
    SHARED_DIR,
    CleanPodPolicy,
    LogFormat,
    LogLevel,
    Mode,
    SshHostKeys,
)
from supervisor.decide import disruption
from supervisor.decide.hostlist import HostMode


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
        "`<pod>-ssh-<key>`, and pinned to the pod's address: no worker can answer at another's; "
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
        "Period of the loop's tick (staleness checks, reaping) even without events. 0.05 to "
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
    Var("SLOW_FACTOR", "2.5", _factor_or_off, "slow_factor",
        "Stragglers: a worker whose training processes spend this many times the other "
        "workers' median time per step outside collectives (their own compute and input, "
        "timed by the hook; the means of their last 31 steps without the slowest tenth), or "
        "whose fastest link to another worker takes this many times the others' median round "
        "trip (and 5 ms more), for SLOW_SECONDS is slow "
        "(Warning Event WorkerSlow, the metric slow_workers, shown by `status`). A job-wide "
        "slowdown is not a straggler. off: not watched.",
        show=lambda v: v or "off"),
    Var("SLOW_SECONDS", "30", _seconds(0), "slow_s",
        "How long a worker stays over SLOW_FACTOR before it is said slow."),
    Var("SLOW_MOVES", "2", _int_in(0), "slow_moves",
        "A slow worker is moved when the job trains faster without it (its ranks gone, the "
        "others at their pace) than with it: its replacement is placed first, kept off its "
        "node, and it leaves gracefully once that runs (nowhere to go: it trains on); its "
        "node counts once toward QUARANTINE_FAILURES. At most this many moves within "
        "SLOW_MOVES_WINDOW_SECONDS; 0: reported only. Needs SUPERVISOR_WORKER_TEMPLATE."),
    Var("SLOW_MOVES_WINDOW_SECONDS", "3600", _seconds(0), "slow_moves_window_s",
        "The window of SLOW_MOVES."),
    Var("SCALE_OUT_TIMEOUT_SECONDS", "600", _seconds(0), "scale_out_timeout_s",
        "A worker added by `scale` that is not Running this long after its pod was asked for "
        "is deleted again (rollback, Warning Event)."),
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
`VARIABLES` in `supervisor/config/variables.py` by `make docs`; do not edit: a unit test fails
when this file differs from the code. How the supervisor is configured:
[configuration.md](configuration.md).

| variable | default | meaning |
| --- | --- | --- |
"""
DEFAULT_SELECTOR = "elastic-supervisor/job={job},elastic-supervisor/role=worker"
