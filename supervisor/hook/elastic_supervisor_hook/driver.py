"""The driver half: horovodrun's own elastic driver, hardened at runtime (Horovod 0.28.x).

Two hangs of the driver (../shared/notes/horovod-elastic.md, "A SECOND HANG") come from
`horovod.runner.common.util.network.BasicClient`: its sockets have no timeout, so a
notification to a frozen worker (the kernel accepts, the process never answers) blocks the
driver's discovery thread on a read forever, while it holds the host-update lock, and one to a
dead or partitioned host waits for the OS's SYN timeout, attempt after attempt.

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
- `report_exits`: each worker process the driver records as failed (a non-zero exit of a worker
  with a rank) is reported with its exit code: the process can die while its pod runs on (an
  OOM kill of the training process, a crash, a `pkill`), and Horovod then never uses that host
  again, so the supervisor replaces the pod.

Why these values: a healthy notification service answers in milliseconds (the handler only
queues the message; the GIL is released at least every 5 ms), and a connect on a cluster network
takes a round trip: 2 s allows a lost SYN (retransmitted after 1 s) and a loaded worker, and
bounds the driver's stall on a frozen coordinator to 6 s before the supervisor fences it (after
which it is skipped). A spurious timeout costs one missed host-change notification, never a hang.
"""

from __future__ import annotations

import json
import socket as _socket
import sys
import types
from typing import Any, Callable

CONNECT_S = 2.0
READ_S = 2.0


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
        result = original(self, slot_info, exit_code, timestamp)
        if counted:
            try:
                report(str(slot_info.hostname), int(slot_info.local_rank), int(exit_code))
            except Exception as e:
                print(f"elastic-supervisor hook: cannot report a worker's exit: {e!r}",
                      file=sys.stderr, flush=True)
        return result

    _handle_worker_exit.__wrapped__ = original  # type: ignore[attr-defined]
    cls._handle_worker_exit = _handle_worker_exit
