"""The driver half: horovodrun's own elastic driver, hardened at runtime (Horovod 0.28.x).

Two hangs of the driver (../shared/notes/horovod-elastic.md, "A SECOND HANG") come from
`horovod.runner.common.util.network.BasicClient`: its sockets have no timeout, so a
notification to a frozen worker (the kernel accepts, the process never answers) blocks the
driver's discovery thread on a read forever, while it holds the host-update lock, and one to a
dead or partitioned host waits for the OS's SYN timeout, attempt after attempt.

- `pin_host_keys` (only with ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS set): Horovod puts
  `-o StrictHostKeyChecking=no` on every ssh command line it runs (a command-line option wins
  over any ssh_config), so a worker's host key is never checked: whoever answers at a worker's
  address gets the training command and its environment. The ssh prefix is changed to check
  the host key strictly against that file (the job's pinned host key).
- `timed_sockets`: every socket BasicClient opens (probes and requests) gets CONNECT_S to
  connect and READ_S for each read. Horovod's own retry loop stays as it is (3 attempts), so a
  request gives up after at most 3 x max(CONNECT_S, READ_S) = 6 s.
- `skip_dead`: the driver notifies only the coordinator (rank 0) of host changes; a coordinator
  on a host the supervisor declared dead (a JSON list of host strings in the file
  ELASTIC_SUPERVISOR_HOOK_DEAD_FILE, written atomically) is not contacted at all.
- `refuse_dead`: a worker on a host the supervisor declared dead that asks for its rank in the
  next rendezvous (its process outlived its pod's deletion) is refused, not recorded READY.
- `report_worlds`: each host assignment the driver makes (the world of the next rendezvous) is
  reported to the supervisor, which can then tell a rendezvous a dead member broke.
- `report_waits`: when the driver must wait for hosts to assign the next world (fewer
  listed slots than --min-np, less Horovod's blacklist), it says so, with the hosts, on stderr
  and to the supervisor, which then holds no new host back (`supervisor/decide/regroup.py`).
- `report_exits`: each worker process the driver records as failed (a non-zero exit of a worker
  with a rank) is reported with its exit code, before Horovod records it (that call blocks in
  the registry's barrier until the round completes): the process can die while its pod runs on
  (an OOM kill of the training process, a crash, a `pkill`), and Horovod then never uses that
  host again, so the supervisor replaces the pod.
- `join_gate`: a rendezvous that starts new workers (a replacement, a scale-out) is not let
  happen until they are in it. Survivors asking for their new rank (after the stock barrier) are
  held until every new worker published its address in the driver's KV store (`/global/<rank>`,
  which Gloo's connectFullMesh writes before it waits for anybody). If, while they are held, a
  member's process exits (its exit is kept out of the registry and its host blacklisted), a
  member's host is declared dead, or a new worker is not there within the join timeout
  (ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S, default 120 s), the driver assigns the world again
  without those hosts (and without the other new workers of that world, which are inside its
  rendezvous already) and the held survivors get the new world. Unpatched, survivors that
  entered a rendezvous with a member that never comes can only abort at the Gloo timeout (a
  C++ std::terminate: SIGABRT, which the driver sees as 134, or as ssh's 255): the whole job
  fails, and a script without a checkpoint starts over. Not covered: a member that dies after
  the gate opened, before the rendezvous completes (~0.1-0.3 s): that is still the stock abort.

Why these values: a healthy notification service answers in milliseconds (the handler only
queues the message; the GIL is released at least every 5 ms), and a connect on a cluster network
takes a round trip: 2 s allows a lost SYN (retransmitted after 1 s) and a loaded worker, and
bounds the driver's stall on a frozen coordinator to 6 s before the supervisor fences it (after
which it is skipped). A spurious timeout costs one missed host-change notification, never a hang.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import socket as _socket
import sys
import threading
import time
import types
from typing import Any, Callable

CONNECT_S = 2.0
READ_S = 2.0
JOIN_TIMEOUT_S = 120.0  # default of ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S
JOIN_POLL_S = 0.05  # how often a closed gate looks at the KV store, the dead file, the clock
HOLD_RECHECK_S = 0.5  # a held request and a waiting exit look at the driver at least this often


class TimedSocket(_socket.socket):
    """A socket that connects within CONNECT_S and then waits at most READ_S per read or write
    (settimeout calls made before connect, like the probe's 20 s, are overridden)."""

    def connect(self, address: Any) -> None:
        self.settimeout(CONNECT_S)
        super().connect(address)
        self.settimeout(READ_S)


def timed_sockets(network: types.ModuleType) -> None:
    """Make every socket `network` (horovod.runner.common.util.network) opens a TimedSocket."""
    real = network.socket
    if getattr(real, "socket", None) is not _socket.socket or not hasattr(
            network, "BasicClient") or not all(
            hasattr(network.BasicClient, m) for m in ("_send_one", "_probe_one")):
        raise RuntimeError("horovod.runner.common.util.network: BasicClient._send_one/_probe_one "
                           "or its `socket` module not found")
    shim = types.ModuleType("socket", "socket, with BasicClient's sockets timed")
    shim.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    shim.socket = TimedSocket  # type: ignore[attr-defined]
    network.socket = shim


UNCHECKED = "-o StrictHostKeyChecking=no"


def pin_host_keys(remote: types.ModuleType, known_hosts: str) -> None:
    """Make the ssh commands of `remote` (horovod.runner.util.remote) check the host key
    strictly against the file `known_hosts` (those commands run through a shell: quoted)."""
    prefix = getattr(remote, "SSH_COMMAND_PREFIX", None)
    if not isinstance(prefix, str) or prefix.count(UNCHECKED) != 1 or not callable(
            getattr(remote, "get_ssh_command", None)):
        raise RuntimeError("horovod.runner.util.remote: SSH_COMMAND_PREFIX with "
                           f"'{UNCHECKED}' or get_ssh_command not found")
    remote.SSH_COMMAND_PREFIX = prefix.replace(
        UNCHECKED, "-o StrictHostKeyChecking=yes -o UserKnownHostsFile="
        + shlex.quote(known_hosts))


def read_dead(path: str | None) -> frozenset[str]:
    """The host strings the supervisor declared dead (empty if there is no such file yet)."""
    if not path:
        return frozenset()
    try:
        with open(path) as f:
            hosts = json.load(f)
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError) as e:
        print(f"elastic-supervisor hook: cannot read the dead hosts in {path}: {e}",
              file=sys.stderr, flush=True)
        return frozenset()
    return frozenset(h for h in hosts if isinstance(h, str)) if isinstance(hosts, list) \
        else frozenset()


def skip_dead(driver_module: types.ModuleType, dead: Callable[[], frozenset[str]]) -> None:
    """Make ElasticDriver skip notifications to a coordinator whose host is in `dead()`."""
    cls = getattr(driver_module, "ElasticDriver", None)
    if cls is None or not all(hasattr(cls, m) for m in (
            "get_worker_client", "_notify_workers_host_changes", "get_coordinator_info")):
        raise RuntimeError("horovod.runner.elastic.driver.ElasticDriver: get_worker_client / "
                           "_notify_workers_host_changes / get_coordinator_info not found")
    original = cls.get_worker_client
    skipped: set[str] = set()

    def get_worker_client(self: Any, slot_info: Any) -> Any:
        host = getattr(slot_info, "hostname", None)
        if host is not None and host in dead():
            if host not in skipped:
                skipped.add(host)
                print(f"elastic-supervisor hook: not notifying {host}[{slot_info.local_rank}]: "
                      "the supervisor declared its host dead", file=sys.stderr, flush=True)
            return None  # Horovod then skips this notification
        return original(self, slot_info)

    get_worker_client.__wrapped__ = original  # type: ignore[attr-defined]
    cls.get_worker_client = get_worker_client


def refuse_dead(driver_module: types.ModuleType, dead: Callable[[], frozenset[str]]) -> None:
    """Make ElasticDriver refuse the rendezvous of a worker whose host is in `dead()`.

    A pod force-deleted or on a lost node can keep its training process alive for a while after
    the supervisor declared it dead and killed its ssh client (the kubelet kills it later, or
    never, on a lost node). Fenced off by the survivors, that process fails its collective,
    resets and asks the driver for its new rank: Horovod would record it READY beside the
    FAILURE its killed ssh client recorded, so the registry's barrier would count one host twice
    and complete, or wait, for the wrong parties. Refused, its request fails (the worker's
    rendezvous client sees the connection close) and the registry only knows the failure."""
    cls = getattr(driver_module, "ElasticDriver", None)
    if cls is None or not hasattr(cls, "record_ready"):
        raise RuntimeError("horovod.runner.elastic.driver.ElasticDriver: record_ready not found")
    original = cls.record_ready

    def record_ready(self: Any, host: Any, slot: Any) -> Any:
        if host in dead():
            print(f"elastic-supervisor hook: refusing the rendezvous of {host}[{slot}]: the "
                  "supervisor declared its host dead", file=sys.stderr, flush=True)
            raise RuntimeError(f"{host} was declared dead by the supervisor")
        return original(self, host, slot)

    record_ready.__wrapped__ = original  # type: ignore[attr-defined]
    cls.record_ready = record_ready


def report_worlds(driver_module: types.ModuleType, report: Callable[[list[str]], None]) -> None:
    """Make ElasticDriver call `report(hosts)` after each host assignment it makes."""
    cls = getattr(driver_module, "ElasticDriver", None)
    if cls is None or not hasattr(cls, "_update_host_assignments"):
        raise RuntimeError("horovod.runner.elastic.driver.ElasticDriver: "
                           "_update_host_assignments not found")
    original = cls._update_host_assignments

    def _update_host_assignments(self: Any, current_hosts: Any) -> Any:
        pending = original(self, current_hosts)
        try:
            report(sorted(getattr(self, "_host_assignments", {}) or {}))
        except Exception as e:  # never break the driver for a report
            print(f"elastic-supervisor hook: cannot report the assignment: {e!r}",
                  file=sys.stderr, flush=True)
        return pending

    _update_host_assignments.__wrapped__ = original  # type: ignore[attr-defined]
    cls._update_host_assignments = _update_host_assignments


def report_exits(driver_module: types.ModuleType,
                 report: Callable[[str, int, int], None]) -> None:
    """Make ElasticDriver call `report(host, local_rank, exit_code)` for each worker exit it
    records as a failure (non-zero, from a worker that had a rank)."""
    cls = getattr(driver_module, "ElasticDriver", None)
    if cls is None or not all(hasattr(cls, m) for m in ("_handle_worker_exit",
                                                          "has_rank_assignment")):
        raise RuntimeError("horovod.runner.elastic.driver.ElasticDriver: _handle_worker_exit / "
                           "has_rank_assignment not found")
    original = cls._handle_worker_exit

    def _handle_worker_exit(self: Any, slot_info: Any, exit_code: Any, timestamp: Any) -> Any:
        counted = False
        try:
            counted = exit_code != 0 and self.has_rank_assignment(slot_info.hostname,
                                                                  slot_info.local_rank)
        except Exception:  # never break the driver for a report
            counted = False
        if counted:  # now: Horovod's own handling waits for the whole round
            try:
                report(str(slot_info.hostname), int(slot_info.local_rank), int(exit_code))
            except Exception as e:
                print(f"elastic-supervisor hook: cannot report a worker's exit: {e!r}",
                      file=sys.stderr, flush=True)
        return original(self, slot_info, exit_code, timestamp)

    _handle_worker_exit.__wrapped__ = original  # type: ignore[attr-defined]
    cls._handle_worker_exit = _handle_worker_exit


def report_waits(driver_module: types.ModuleType,
                 report: Callable[[dict[str, Any] | None], None]) -> None:
    """Make ElasticDriver say when it must wait for hosts to assign the next world, and why.

    After a round, the driver assigns the next world from the hosts its discovery listed last,
    less those Horovod blacklisted; with fewer slots than --min-np it waits, holding the
    survivors in `hvd.init`, until enough are listed (`wait_for_available_slots`). The
    supervisor must then list new hosts at once, not hold them back until the survivors
    regrouped (they cannot before): `report(short)` (what it needs and what it has) as the
    wait begins, `report(None)` once it has them; one line on stderr names the hosts."""
    cls = getattr(driver_module, "ElasticDriver", None)
    missing = [f"ElasticDriver.{m}" for m in ("wait_for_available_slots",)
               if not hasattr(cls, m)]
    missing += [f"ElasticDriver.{n}" for n in _not_set_in_init(cls, (
        "_host_manager", "_wait_hosts_cond"))]
    if missing:
        raise RuntimeError(f"horovod.runner.elastic.driver: {' / '.join(missing)} not found")
    original = cls.wait_for_available_slots

    def short_of(self: Any, min_num_proc: Any, min_hosts: Any) -> dict[str, Any] | None:
        with self._wait_hosts_cond:
            manager = self._host_manager
            current = manager.current_hosts
            slots = int(current.count_available_slots())
            if slots >= min_num_proc and len(current.available_hosts) >= min_hosts:
                return None
            listed = sorted(map(str, current.host_slots))
            return {"need": int(min_num_proc), "slots": slots, "listed": listed,
                    "blacklisted": [h for h in listed if manager.is_blacklisted(h)]}

    def wait_for_available_slots(self: Any, min_num_proc: Any, min_hosts: Any = 1) -> Any:
        short = None
        try:
            short = short_of(self, min_num_proc, min_hosts)
        except Exception as e:  # never break the driver for a report
            _say(f"cannot read the driver's hosts: {e!r}")
        if short is None:
            return original(self, min_num_proc, min_hosts)
        _say(f"the driver waits for {short['need']} slot(s) to assign the next world: "
             f"{short['slots']} available; listed {short['listed']}, blacklisted by Horovod "
             f"{short['blacklisted']}")
        try:
            report(short)
        except Exception as e:
            _say(f"cannot report the driver's wait: {e!r}")
        try:
            return original(self, min_num_proc, min_hosts)
        finally:
            try:
                report(None)
            except Exception as e:
                _say(f"cannot report the driver's wait: {e!r}")

    wait_for_available_slots.__wrapped__ = original  # type: ignore[attr-defined]
    cls.wait_for_available_slots = wait_for_available_slots


class _Found:
    """A host discovery that answers what the script printed a moment ago (discover_unlocked)."""

    def __init__(self, found: Any) -> None:
        self.found = found

    def find_available_hosts_and_slots(self) -> Any:
        return self.found


def discover_unlocked(driver_module: types.ModuleType) -> None:
    """Make ElasticDriver run its host discovery script before it takes its host-update lock.

    Horovod's discovery thread holds `_wait_hosts_cond` while the script runs (a fork of the
    driver, a middleman process, a shell: 0.3 s on a loaded 2-core machine, every second), and
    the round after a failure needs that lock to assign the new world
    (`wait_for_available_slots`): measured on loopback hosts, the survivors waited those 0.3 s
    in `hvd.init` after the driver had recorded every exit, in each of two resets. Run first,
    the script's hosts are applied under the lock as Horovod applies them (its own
    `update_available_hosts`, the notification of the coordinator, the wake-up), so the lock is
    held only for that; a script that fails is handled as Horovod handles it (the first time
    the job stops, later a warning)."""
    cls = getattr(driver_module, "ElasticDriver", None)
    update = getattr(driver_module, "HostUpdateResult", None)
    frequency = getattr(driver_module, "DISCOVER_HOSTS_FREQUENCY_SECS", None)
    missing = [f"ElasticDriver.{m}" for m in ("_discover_hosts", "_notify_workers_host_changes")
               if not hasattr(cls, m)]
    missing += [f"ElasticDriver.{n}" for n in _not_set_in_init(cls, (
        "_host_manager", "_wait_hosts_cond", "_shutdown"))]
    missing += [f"HostManager.{n}" for n in _not_set_in_init(
        getattr(driver_module, "HostManager", None), ("_discovery",))]
    missing += [n for n, v in (("HostUpdateResult", update),
                               ("DISCOVER_HOSTS_FREQUENCY_SECS", frequency)) if v is None]
    if missing:
        raise RuntimeError(f"horovod.runner.elastic.driver: {' / '.join(missing)} not found")
    original = cls._discover_hosts

    def _discover_hosts(self: Any) -> None:
        first_update = True
        while not self._shutdown.is_set():
            manager = self._host_manager
            discovery = manager._discovery
            found: Any = None
            failed: BaseException | None = None
            try:
                found = discovery.find_available_hosts_and_slots()
            except BaseException as e:
                failed = e
            with self._wait_hosts_cond:
                try:
                    if failed is not None:
                        raise failed
                    manager._discovery = _Found(found)
                    try:
                        update_res = manager.update_available_hosts()
                    finally:
                        manager._discovery = discovery
                    if update_res != update.no_update:
                        self._notify_workers_host_changes(manager.current_hosts, update_res)
                        self._wait_hosts_cond.notify_all()
                except BaseException as e:
                    if first_update:  # Horovod's own: a misconfiguration fails the job at once
                        self._shutdown.set()
                        self._wait_hosts_cond.notify_all()
                        raise
                    logging.warning(str(e))  # a transient error: Horovod's own, said the same
            first_update = False
            self._shutdown.wait(frequency)

    _discover_hosts.__wrapped__ = original  # type: ignore[attr-defined]
    cls._discover_hosts = _discover_hosts


# ---- join_gate ----------------------------------------------------------------------------------

CLOSED, OPEN, REPLANNING, DONE = "closed", "open", "replanning", "done"
_GATE = "_elastic_supervisor_gate"
_STOCK_RESET_LIMIT = "Horovod was shutdown because number of resets during elastic job " \
                     "exceeded limit: {}"


def _say(line: str) -> None:
    print(f"elastic-supervisor hook: {line}", file=sys.stderr, flush=True)


def _not_set_in_init(cls: Any, names: tuple[str, ...]) -> list[str]:
    """The attributes of `names` that `cls.__init__` does not assign (its code names them;
    Horovod's own `__init__` under the wrappers of this module's patches)."""
    init = getattr(cls, "__init__", None)
    while hasattr(init, "__wrapped__"):
        init = init.__wrapped__
    code = getattr(init, "__code__", None)
    return [n for n in names if code is None or n not in code.co_names]


class Join:
    """The rendezvous of one assignment that started new workers: its members, the new ones
    among them (by rank), the deadline for them to arrive, and what happened to it."""

    def __init__(self, members: set[tuple[str, int]], pending: dict[tuple[str, int], int],
                 deadline: float) -> None:
        self.members = frozenset(members)
        self.pending = dict(pending)
        self.deadline = deadline
        self.state = CLOSED
        self.exits: dict[tuple[str, int], Any] = {}  # members' exits while closed: code


class Gate:
    """One driver's gate: the Join of its last assignment (None: nothing to wait for)."""

    def __init__(self, dead: Callable[[], frozenset[str]], join_timeout_s: float,
                 reset_limit_message: str,
                 report: Callable[[list[str]], None] | None = None) -> None:
        self.dead, self.join_timeout_s = dead, join_timeout_s
        self.reset_limit_message = reset_limit_message
        self.report = report
        self.cond = threading.Condition()
        self.join: Join | None = None
        self.warned = False

    def assigned(self, driver: Any, pending_slots: list[Any]) -> None:
        """The driver made an assignment and is about to start `pending_slots`: gate it if it
        has both survivors (they will ask for their rank) and new workers (they will not)."""
        members = {(h, s.local_rank) for h, slots in driver._host_assignments.items()
                   for s in slots}
        pending = {(s.hostname, s.local_rank): s.rank for s in pending_slots}
        join = None
        if pending and members - set(pending) and not driver.finished():
            httpd = getattr(driver._rendezvous, "_httpd", None)
            if hasattr(httpd, "cache") and hasattr(httpd, "cache_lock"):
                join = Join(members, pending, time.monotonic() + self.join_timeout_s)
            elif not self.warned:
                self.warned = True
                _say("cannot gate the rendezvous (the driver's rendezvous server has no "
                     "_httpd.cache): new workers join the stock way")
        with self.cond:
            if self.join is not None and self.join.state == CLOSED:
                self.join.state = DONE
            self.join = join
            self.cond.notify_all()
        if join is not None:
            threading.Thread(target=self._watch, args=(driver, join), daemon=True,
                             name="elastic-supervisor-join-gate").start()

    def hold(self, driver: Any, key: tuple[str, int]) -> None:
        """Return once the survivor `key` may have its rank: its world's gate is open, the world
        was replaced by one without a gate or without it, or the driver finished."""
        with self.cond:
            while not driver.finished():
                j = self.join
                if j is None or key not in j.members or j.state == OPEN:
                    return
                self.cond.wait(HOLD_RECHECK_S)

    def divert(self, driver: Any, slot_info: Any, exit_code: Any) -> bool:
        """True if this worker exit is the gate's: a member of a closed gate's world exited. Its
        host is then blacklisted and the exit kept out of the registry (its round would never
        complete: the held survivors do not record in it)."""
        host = slot_info.hostname
        key = (host, slot_info.local_rank)
        registry = driver._worker_registry
        while True:
            # A barrier action or a re-plan is making the next world (and its Join): wait.
            registry._action_event.wait(HOLD_RECHECK_S)
            with self.cond:
                if driver.finished():
                    return False
                if not registry._action_event.is_set():
                    continue
                j = self.join
                if j is None or j.state != CLOSED or key not in j.members \
                        or driver._host_manager.is_blacklisted(host):
                    return False
                driver._host_manager.blacklist(host)  # also ends its other ssh sessions
                j.exits[key] = exit_code
                self.cond.notify_all()
                return True

    def _watch(self, driver: Any, j: Join) -> None:
        """While `j` is closed: open it when every new worker arrived, re-plan on trouble."""
        try:
            while True:
                with self.cond:
                    if self.join is not j or j.state != CLOSED or driver.finished():
                        return
                    self.cond.wait(JOIN_POLL_S)
                    if self.join is not j or j.state != CLOSED or driver.finished():
                        return
                arrived = self._arrived(driver, j)
                trouble = self._trouble(driver, j, arrived)
                if trouble:
                    self._replan(driver, j, trouble)
                    return
                if arrived == set(j.pending.values()):
                    with self.cond:
                        if self.join is j and j.state == CLOSED:
                            j.state = OPEN
                            self.cond.notify_all()
                    return
        except Exception as e:  # never keep survivors held because of a bug here
            _say(f"the join gate failed ({e!r}): the rendezvous goes on the stock way")
            with self.cond:
                if j.state == CLOSED:
                    j.state = OPEN
                self.cond.notify_all()

    @staticmethod
    def _arrived(driver: Any, j: Join) -> set[int]:
        """The new workers' ranks whose address is in the driver's KV store (cleared at every
        assignment, so only this world's)."""
        httpd = driver._rendezvous._httpd
        with httpd.cache_lock:
            scope = set(httpd.cache.get("global", {}))
        return {r for r in j.pending.values() if str(r) in scope}

    def _trouble(self, driver: Any, j: Join, arrived: set[int]) -> dict[str, str]:
        """The members' hosts the world must do without, each with why."""
        why: dict[str, str] = {}
        dead = self.dead()
        late = time.monotonic() > j.deadline
        for key in sorted(j.members):
            host = key[0]
            if host in why:
                continue
            if key in j.exits:
                when = "before it joined" if key in j.pending else "while it was held"
                why[host] = f"its worker exited (exit code {j.exits[key]}) {when}"
            elif host in dead:
                why[host] = "the supervisor declared it dead"
            elif driver._host_manager.is_blacklisted(host):
                why[host] = "Horovod blacklisted it"
            elif late and key in j.pending and j.pending[key] not in arrived:
                why[host] = (f"its new worker did not reach the rendezvous within "
                             f"{self.join_timeout_s:g} s")
        return why

    def _replan(self, driver: Any, j: Join, why: dict[str, str]) -> None:
        """Assign the world again without the hosts in `why` (nobody entered the rendezvous of
        `j`'s world yet), as a barrier action would: held survivors then get the new one."""
        registry = driver._worker_registry
        with self.cond:
            if self.join is not j or j.state != CLOSED:
                return
            j.state = REPLANNING
            registry._action_event.clear()  # exits wait for the next world, as in an action
        try:
            recorded = sorted(registry._states)
            if recorded:  # a new round would orphan the threads waiting in this one
                _say(f"cannot re-plan the world without {', '.join(sorted(why))}: "
                     f"{recorded} already recorded in this round; it goes on the stock way")
                with self.cond:
                    j.state = OPEN
                return
            # v1: new workers that did arrive are inside this world's rendezvous, with its rank
            # and size in their environment: they cannot be used in another one.
            also = sorted({h for h, _ in j.pending} - set(why))
            _say(f"re-planning the world without {', '.join(sorted(set(why) | set(also)))}: "
                 + "; ".join(f"{h}: {w}" for h, w in sorted(why.items()))
                 + (f"; {', '.join(also)}: started for that world" if also else ""))
            for host in sorted(set(why) | set(also)):
                driver._host_manager.blacklist(host)
            limit = registry._reset_limit
            if limit is not None and registry._reset_count >= limit:
                _say(f"the reset limit ({limit}) is reached: stopping the job")
                driver.stop(error_message=self.reset_limit_message.format(limit))
                return
            registry._reset_count += 1
            if self.report is not None:
                # The survivors are the world until the next assignment: the supervisor must
                # not take a re-plan that waits for a host (fewer survivors than min-np) for a
                # rendezvous the lost host broke.
                survivors = {h for h, _ in j.members} - set(why) - set(also)
                try:
                    self.report(sorted(survivors))
                except Exception as e:  # never break the re-plan for a report
                    _say(f"cannot report the survivors' world: {e!r}")
            driver._activate_workers(driver._min_num_proc)
        except Exception as e:
            _say(f"the re-plan failed ({e!r}): stopping the job")
            driver.stop()
        finally:
            with self.cond:
                if j.state == REPLANNING:
                    j.state = DONE
                if self.join is j and j.state == DONE:
                    self.join = None
                self.cond.notify_all()
            registry._action_event.set()


def join_gate(driver_module: types.ModuleType, dead: Callable[[], frozenset[str]],
              join_timeout_s: float = JOIN_TIMEOUT_S,
              report: Callable[[list[str]], None] | None = None) -> None:
    """Make ElasticDriver hold survivors out of a rendezvous until its new workers are in it, and
    assign the world again when one of its members is lost before that (module docstring)."""
    cls = getattr(driver_module, "ElasticDriver", None)
    registry_cls = getattr(driver_module, "WorkerStateRegistry", None)
    hosts_cls = getattr(driver_module, "HostManager", None)
    missing = [f"ElasticDriver.{m}" for m in (
        "__init__", "record_ready", "_activate_workers", "_start_worker_processes",
        "_handle_worker_exit", "finished", "stop") if not hasattr(cls, m)]
    missing += [f"ElasticDriver.{n}" for n in _not_set_in_init(cls, (
        "_rendezvous", "_worker_registry", "_host_manager", "_min_num_proc",
        "_host_assignments"))]
    missing += [f"WorkerStateRegistry.{n}" for n in _not_set_in_init(registry_cls, (
        "_action_event", "_states", "_reset_count", "_reset_limit"))]
    missing += [f"HostManager.{m}" for m in ("blacklist", "is_blacklisted")
                if not hasattr(hosts_cls, m)]
    try:
        from horovod.runner.http import http_server
        missing += [f"RendezvousServer.{n}" for n in _not_set_in_init(
            http_server.RendezvousServer, ("_httpd",))]
        missing += [f"RendezvousHTTPServer.{n}" for n in _not_set_in_init(
            http_server.RendezvousHTTPServer, ("cache", "cache_lock"))]
    except ImportError:
        missing.append("horovod.runner.http.http_server")
    if missing:
        raise RuntimeError(f"horovod.runner.elastic.driver: {' / '.join(missing)} not found")
    registration = sys.modules.get(getattr(registry_cls, "__module__", ""))
    message = getattr(getattr(registration, "constants", None), "RESET_LIMIT_EXCEEDED_MESSAGE",
                      _STOCK_RESET_LIMIT)
    if not math.isfinite(join_timeout_s) or join_timeout_s <= 0:
        raise RuntimeError(f"the join timeout must be a number of seconds > 0: {join_timeout_s}")
    init, record, start = cls.__init__, cls.record_ready, cls._start_worker_processes
    handle = cls._handle_worker_exit

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        setattr(self, _GATE, Gate(dead, join_timeout_s, message, report))
        init(self, *args, **kwargs)

    def _start_worker_processes(self: Any, pending_slots: Any) -> Any:
        try:
            getattr(self, _GATE).assigned(self, list(pending_slots))
        except Exception as e:
            _say(f"cannot gate this rendezvous ({e!r}): it goes on the stock way")
        return start(self, pending_slots)

    def record_ready(self: Any, host: Any, slot: Any) -> Any:
        result = record(self, host, slot)
        try:  # never fail a held request: the worker would retry and be counted twice
            getattr(self, _GATE).hold(self, (host, slot))
        except Exception as e:
            _say(f"the join gate failed to hold {host}[{slot}] ({e!r}): released")
        return result

    def _handle_worker_exit(self: Any, slot_info: Any, exit_code: Any, timestamp: Any) -> Any:
        try:
            if getattr(self, _GATE).divert(self, slot_info, exit_code):
                return None
        except Exception as e:
            _say(f"the join gate failed on an exit ({e!r}): handled the stock way")
        return handle(self, slot_info, exit_code, timestamp)

    for name, f, wrapped in (("__init__", __init__, init), ("record_ready", record_ready, record),
                             ("_start_worker_processes", _start_worker_processes, start),
                             ("_handle_worker_exit", _handle_worker_exit, handle)):
        f.__wrapped__ = wrapped  # type: ignore[attr-defined]
        setattr(cls, name, f)
