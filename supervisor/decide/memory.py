"""PURE: the decisions' memory (`Memory`), what a pass sees (`Seen`), the settings it reads
(`Settings`) and the script it returns (`Pass`: the operations Fence, KillSsh,
RestartHorovodrun, CreateWorker, KeepMinAvailable, FailJob, beside script.py's), with the small
rules every step shares. core.manage composes the steps; on.py decides between passes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from supervisor.decide import (
    admission,
    disruption,
    failures,
    fleet,
    incidents,
    plan,
    podindex,
    progress,
    quarantine,
    regroup,
    stragglers,
)
from supervisor.decide.beats import Beat, Driver
from supervisor.decide.classify import (
    ClassifySettings,
    NodeState,
    PodMemory,
)
from supervisor.decide.fleet import Fleet
from supervisor.decide.hang import HangSettings, Verdict
from supervisor.decide.hostlist import Rendered
from supervisor.decide.plan import Note
from supervisor.decide.podindex import PodIndex
from supervisor.decide.policy import Policy
from supervisor.decide.script import (
    CreateWorker,
    DeletePod,
    FailJob,
    Fence,
    KeepMinAvailable,
    KillSsh,
    RestartHorovodrun,
    SaveState,
)
from supervisor.observe import Obj

if TYPE_CHECKING:  # the settings are read from it by the caller (scripts/layers.py)
    from supervisor.config import Config

HUNG_NODE_AVOID_S = 300.0  # replacements prefer other nodes this long after a hang on one


def classify_settings(cfg: Config) -> ClassifySettings:
    """How failures are classified: the node graces, the training container, and the other
    containers the policy's rules name (their exits count too)."""
    return ClassifySettings(
        node_grace_s=cfg.node_grace_s, lease_grace_s=cfg.node_lease_s,
        training_container=cfg.worker_container,
        policy_containers=frozenset(r.container for r in cfg.policy.rules
                                    if r.container is not None),
        graceful_leave=cfg.worker_template is not None)


def hang_settings(cfg: Config) -> HangSettings:
    return HangSettings(silence_s=cfg.heartbeat_timeout_s, stall_s=cfg.stall_timeout_s,
                        stuck_s=cfg.stuck_s)


def horovodrun_restarts(c: Memory) -> int:
    """Restarts of horovodrun so far: kept in the fleet's persisted ledger where the supervisor
    owns the workers, so the limit holds over launcher attempts (a Job retry, a takeover)."""
    stored = c.fleet.ledger.horovodrun_restarts if c.fleet is not None else 0
    return max(c.horovodrun_restarts, stored)


@dataclass(frozen=True)
class Settings:
    """What of the config the decisions read (config.Config holds them)."""

    plan: plan.Settings
    policy: Policy
    classify: ClassifySettings
    hang: HangSettings
    disruption_threshold: float | None
    horovodrun_restart_limit: int
    stall_timeout_s: float
    disruption: disruption.Settings = field(default_factory=disruption.Settings)
    quarantine: quarantine.Settings = field(default_factory=quarantine.Settings)
    # seconds a bound worker may stay not started (starts.py); None: never acted on
    start_timeout_s: float | None = None
    slow: stragglers.Settings = field(default_factory=stragglers.Settings)

    @classmethod
    def of(cls, cfg: Config) -> Settings:
        return cls(plan.Settings.of(cfg), cfg.policy, classify_settings(cfg),
                   hang_settings(cfg),
                   cfg.node_disruption_threshold, cfg.horovodrun_restart_limit,
                   cfg.stall_timeout_s,
                   disruption.Settings(cfg.node_drain_taints, cfg.node_bad_conditions),
                   quarantine.Settings(cfg.quarantine_failures, cfg.quarantine_window_s,
                                       cfg.quarantine_s),
                   cfg.worker_start_timeout_s,
                   stragglers.Settings(cfg.slow_factor, cfg.slow_s, cfg.slow_moves,
                                       cfg.slow_moves_window_s))


@dataclass(frozen=True)
class Memory:
    """What the decisions remember from one pass to the next (replaced, never mutated)."""

    fleet: Fleet | None = None  # None: the supervisor does not own the workers
    saved: Fleet | None = None  # the fleet last handed to the actuator to save
    failed: frozenset[str] = frozenset()  # UIDs classified as failed (never twice)
    found: tuple[failures.Failed, ...] = ()  # failures classified between passes, to decide
    node_down: Mapping[str, float] = field(default_factory=dict)  # node -> down since
    braked: frozenset[str] = frozenset()  # down nodes the disruption brake holds back
    settling: frozenset[str] = frozenset()  # down nodes held after an API outage (settle)
    kept: frozenset[str] = frozenset()  # hosts on down nodes kept listed while they beat
    synced_at: float | None = None  # the first pass after the watch synced
    scanned: bool = False  # the first full classification after sync is done
    reused: Mapping[int, int] = field(default_factory=dict)  # slot -> pods replaced (reused IP)
    reuse_checked: Rendered | None = None  # the render last looked at for reused addresses
    expected: Mapping[str, float] = field(default_factory=dict)  # being created -> since
    unseen: Mapping[str, int] = field(default_factory=dict)  # pod -> creates it went unseen
    blocked: Mapping[str, admission.Refusal] = field(default_factory=dict)  # creates refused
    scale_request: int | None = None  # desired workers asked for, not applied yet
    leaving: Mapping[str, plan.Leaving] = field(default_factory=dict)  # announced to go
    budget: int | None = None  # the PodDisruptionBudget's minAvailable last asked for
    leave_waits: frozenset[str] = frozenset()  # announced, waiting for another to join
    # workers on a cordoned node -> their replacement placed ahead (move_ahead); workers
    # whose replacement failed before it ran: they stay while the cordon lasts
    moving: Mapping[str, str] = field(default_factory=dict)
    staying: frozenset[str] = frozenset()
    quarantine: quarantine.Quarantine = field(default_factory=quarantine.Quarantine)
    saved_quarantine: Mapping[str, float] = field(default_factory=dict)  # as last saved
    failing: tuple[int, str] | None = None  # the run ends with this code and reason
    # a watch's or an action's error for good (on.fatal): the run ends at once with it
    fatal: tuple[int, str] | None = None
    # the hang watch (this run of horovodrun, except the restarts and the hung pods)
    listed_since: Mapping[str, float] = field(default_factory=dict)  # host -> listed since
    hung: frozenset[str] = frozenset()  # UIDs of pods found Hung: never listed again
    forced: frozenset[str] = frozenset()  # UIDs of hung pods force-deleted: their node went down
    hung_nodes: Mapping[str, float] = field(default_factory=dict)  # node -> a worker hung
    failed_at: Mapping[str, float] = field(default_factory=dict)  # host -> found failed
    regroup: regroup.Pending | None = None  # a failure the survivors have not regrouped from
    horovodrun_restarts: int = 0  # of this supervisor (see horovodrun_restarts())
    # the host list (listing.listing): host -> (driver world, out of the file until) of hosts
    # announced again to Horovod; the hold-back of the pending regroup was said
    reannounced: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    held_said: bool = False
    # pods that never start (starts.py): UID -> seen bound and not started since (monotonic);
    # slot -> its pods replaced in a row for it; UID -> what was said of it (once)
    unstarted_since: Mapping[str, float] = field(default_factory=dict)
    unstarted: Mapping[int, int] = field(default_factory=dict)
    start_said: Mapping[str, str] = field(default_factory=dict)
    # the start gate: since when it waits for MIN_NP usable slots (monotonic)
    gate_since: float = 0.0
    api_back_at: float | None = None  # monotonic: the node watch back from an outage
    scale_version: str | None = None  # resourceVersion of the last scale request seen
    # the leader Lease cannot be renewed (LeadershipPaused until resumed); horovodrun's exit
    # code seen meanwhile: not judged until the Lease says whose the job is (a standby may have
    # taken the workers, whose processes then end this run's: hook owner.py); judged once
    # resumed, or the exit is LEADERSHIP_LOST's once the Lease is lost
    paused: bool = False
    held_exit: int | None = None
    # the job's training progress and its incidents (accounting.py), and when they were last
    # due to be saved with the state (epoch seconds)
    progress: progress.Progress = field(default_factory=progress.Progress)
    book: incidents.Book = field(default_factory=incidents.Book)
    progress_saved_at: float = 0.0
    slow: stragglers.Watch = field(default_factory=stragglers.Watch)  # slow ranks (stragglers)


@dataclass(frozen=True)
class Seen:
    """What the loop sees in this pass (gathered by loop.py)."""

    pods: Mapping[str, Obj]  # the job's worker pods the watch shows, by name
    nodes: Mapping[str, Obj]
    memory: Mapping[str, PodMemory]  # what earlier events showed of each pod, by name
    lease_ages: Mapping[str, float] | None  # node -> seconds since its Lease was renewed
    lease_stale: frozenset[str]  # nodes whose Lease is older than SUPERVISOR_NODE_LEASE_SECONDS
    first_owner: Mapping[str, str]  # host -> UID of the first pod published with it
    published: str | None  # the discovery file as published (None: withdrawn)
    view_render: Rendered | None  # the last render of the view (hostlist.render)
    listed_hosts: Mapping[str, str]  # host -> pod of the hosts published now
    hooked: bool  # the hook channel is there (fence, heartbeats)
    running: bool  # horovodrun runs
    stopping: bool  # a signal is being forwarded to horovodrun
    started_at: float  # when this run of horovodrun started (monotonic)
    beats: tuple[Beat, ...]  # the hook's heartbeats of this run
    driver: Driver | None  # the driver hook's last word
    ssh_clients: Mapping[str, int]  # host -> ssh clients (plan.retiring_hosts of Memory.fleet)
    now: float  # monotonic
    wall: float  # epoch (the fleet's clock)
    # monotonic: when the supervisor's node watch came back from its last outage (None: none)
    api_back_at: float | None = None
    # the facts of `pods` and `nodes`, kept up to date by the watches (None: built here)
    index: PodIndex | None = None

    def facts(self, job: str) -> PodIndex:
        """The index of the view (podindex.py): the watches', or one built from `pods`."""
        return self.index if self.index is not None else podindex.build(self.pods, self.nodes,
                                                                        job)


Todo = (Note | Fence | KillSsh | RestartHorovodrun | DeletePod | SaveState | CreateWorker
        | KeepMinAvailable | FailJob)


@dataclass(frozen=True)
class Pass:
    core: Memory
    todo: tuple[Todo, ...]
    verdict: Verdict | None = None  # the hang watch's, for the adapter's one-time warnings
    counts: tuple[tuple[str, str], ...] = ()  # (cause, action) of each failure decided
    restarts: tuple[str, ...] = ()  # reasons horovodrun was found to need a restart
    replace_from: Mapping[str, float] = field(default_factory=dict)  # new pod -> failure seen


def node_state(c: Memory, nodes: Mapping[str, Obj], pod: Obj, lease_age: float | None,
               now: float) -> NodeState:
    """What is known of `pod`'s node for classify: held back by the brake, down since, its
    Lease's age. A node never seen since the sync counts as down since then."""
    name = pod.get("spec", {}).get("nodeName") or ""
    node = nodes.get(name)
    if name in c.braked or name in c.settling:
        return NodeState(node=node)  # held back: no evidence against it for now
    down = c.node_down.get(name)
    if node is None and name and down is None:
        down = c.synced_at if c.synced_at is not None else now  # never seen since sync
    return NodeState(node=node, down_since=down, lease_age_s=lease_age)


def fail(c: Memory, code: int, reason: str, *, event: bool = True) -> tuple[Memory, FailJob | None]:
    """The run ends with `code` unless it ends already (the first reason wins)."""
    if c.failing is not None:
        return c, None
    return replace(c, failing=(int(code), reason)), FailJob(int(code), reason, event)


def judge_exit(held: int | None, exited: int | None, *,
               paused: bool) -> tuple[int | None, int | None]:
    """horovodrun's exit, held or judged: (the code held from now on, the code to judge now).
    An exit seen while the leader Lease cannot be renewed (`paused`) is no verdict on the job:
    a standby may have taken the workers, whose training processes then end this run's (hook
    owner.py). It is held until the Lease is renewed again (judged then, as any exit) or lost
    (the run ends with LEADERSHIP_LOST: `fail`, whose code the caller finishes with)."""
    if held is not None:
        return (held, None) if paused else (None, held)
    if exited is not None and paused:
        return exited, None
    return None, exited


@dataclass
class Passing:
    """`manage` under way (local to one call)."""

    c: Memory
    todo: list[Todo] = field(default_factory=list)

    def fail(self, code: int, reason: str, *, event: bool = True) -> None:
        self.c, op = fail(self.c, code, reason, event=event)
        if op is not None:
            self.todo.append(op)


def current_slot(fl: Fleet | None, pod: Obj, job: str) -> tuple[int, int] | None:
    """(slot, incarnation) of `pod` if it is the current pod of an active slot."""
    at = fleet.slot_of(pod, job) if fl is not None else None
    slot = fl.slots.get(at[0]) if fl is not None and at is not None else None
    if (at is None or slot is None or slot.dropped is not None or slot.retiring_at is not None
            or at[1] != slot.incarnation):
        return None
    return at


def nodes_kept_off(c: Memory, s: Seen, st: Settings, suspects: set[str]) -> set[str]:
    """Nodes down or silent, quarantined, or announced to go: a new worker is kept off them
    (and one kept off them is not created again while they are)."""
    kept_off = suspects | set(c.quarantine.until)
    if st.classify.graceful_leave:
        kept_off |= s.facts(st.plan.job).going(s.nodes, st.disruption)
    return kept_off


def suspect_nodes(c: Memory, now: float) -> tuple[str, ...]:
    """Nodes where a worker hung lately: a new worker prefers others."""
    return tuple(sorted(n for n, t in c.hung_nodes.items() if now - t < HUNG_NODE_AVOID_S))
