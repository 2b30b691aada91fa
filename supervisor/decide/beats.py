"""PURE: what the hook's heartbeats said, as the decisions read them.

`Beat` is one training process at its last heartbeat, `Driver` what horovodrun's driver hook
said last; supervisor/channel.py (the adapter) receives the datagrams and keeps them.
`heartbeating` is the one rule for "this process heartbeats".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Progress intervals not taken as step times after each init: the state's sync and the new
# world's first steps wait for its slowest member (a joiner still importing or tracing its
# tf.function: 7.6 s seen on the TensorFlow tour), which is not a step time.
WARMUP_GAPS = 3


@dataclass(frozen=True)
class Beat:
    """One training process as its last heartbeat showed it; times are the supervisor's
    monotonic receipt times."""

    sender: str
    host: str
    pid: int
    local_rank: int
    first_seen: float
    last_seen: float
    progress_at: float | None  # when `done` was last seen to grow (None: not yet)
    rank: int | None = None
    size: int | None = None
    inits: int = 0
    done: int = 0
    wait_s: float | None = None  # inside a collective ("c") or an init ("i") this long
    waiting: str | None = None
    addrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()  # what its hook reported (it is not judged then)
    unfenced: str | None = None  # the framework the hook does not fence, apart from `problems`
    bye_at: float | None = None
    source: tuple[str, int] = ("", 0)
    # the main thread: collectives completed since the last init (None: an older hook), since
    # when its position, I/O and progress have not changed (None: the hook does not say), its
    # innermost frames while it stands still, and the last GAPS intervals between two
    # heartbeats that showed progress with no init between them (the step time, at the
    # heartbeat's resolution), and how many more of those intervals to leave out because the
    # world is new (WARMUP_GAPS after each init)
    since_init: int | None = None
    still_since: float | None = None
    where: tuple[str, ...] = ()
    gaps: tuple[float, ...] = ()
    warmup: int = WARMUP_GAPS
    pos: str = ""
    io: int | None = None
    # what its process watcher (the hook's watch.py) said last: the scheduler state ("R", "S",
    # "D", "T", ...), when it said it, and when the process's CPU time last grew
    proc_state: str | None = None
    proc_seen: float | None = None
    proc_cpu: int | None = None
    proc_cpu_at: float | None = None
    # training progress (None: an older hook): optimizer steps, commits, steps computed again
    steps: int | None = None
    commits: int | None = None
    redone: int | None = None
    trained_s: float | None = None  # seconds training, judged by the hook at each step
    # a step's time (None: an older hook, or no step timed since the last init): the means
    # over its last steps of the seconds outside collectives (its own work) and inside them
    # (waiting for its peers, and the transfer), and how many steps were timed
    step_out_s: float | None = None
    step_wait_s: float | None = None
    step_n: int = 0
    # the round-trip time of its fastest active link to each of up to 8 other machines'
    # addresses (the hook's `peer_rtts`; the fastest first as sent, sorted here by address)
    link_rtt: tuple[tuple[str, float], ...] = ()


def is_loopback(ip: str) -> bool:
    """PURE: whether `ip` is a loopback address (False for what is not an address)."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def judged(b: Beat) -> bool:
    """PURE: whether the hang watch and the regroup read b: its hook reported no problem and
    sees its collectives (a framework it does not fence has neither waits nor progress)."""
    return not b.problems and b.unfenced is None


def heartbeating(b: Beat, now: float, within_s: float, *, inclusive: bool = False) -> bool:
    """PURE: whether b's process heartbeats at `now`: it said no bye and its last heartbeat
    came less than `within_s` ago (`inclusive`: at most `within_s` ago).

    The one "fresh heartbeat" rule. Its callers differ only at the boundary: the hang watch,
    the settling nodes, the hosts kept on down nodes and the heartbeating metric take
    within_s=silence_s, exclusive (a process silent for exactly silence_s is silent: hang.py);
    progress.rank0 and the hosts that joined an incident's world take progress.FRESH_S,
    inclusive. `HookChannel.next_silence` is the deadline of the exclusive rule."""
    if b.bye_at is not None:
        return False
    age = now - b.last_seen
    return age <= within_s if inclusive else age < within_s


@dataclass(frozen=True)
class Driver:
    """What horovodrun's driver hook said last (None: nothing yet): its state, and the hosts of
    the last assignment it made (the world of the next rendezvous) with when it came."""

    ok: bool
    at: float
    problems: tuple[str, ...] = ()
    world: frozenset[str] = frozenset()
    world_seq: int = 0
    world_at: float = 0.0
    # host -> (exit code, when first reported) of workers the driver recorded as failed
    exited: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # the driver waits for hosts to assign the next world (fewer listed slots than --min-np)
    waits_for_hosts: bool = False


def talking(beats: Iterable[Beat], now: float, silence_s: float) -> frozenset[str]:
    """PURE: the hosts whose training processes heartbeat now (`heartbeating`, exclusive at
    silence_s): what both holds of a down node read, the hosts kept listed on it
    (hostlist.kept_while_heartbeating, kept in the memory by on.heard) and the nodes not
    replaced after an API outage (nodes.settling_nodes)."""
    return frozenset(b.host for b in beats if heartbeating(b, now, silence_s))
