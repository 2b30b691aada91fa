"""The process watcher: a second signal for a training process that falls silent.

A training process's heartbeats come from a Python thread, which needs the GIL. A process whose
GIL is held for seconds (a garbage-collector pass over a huge heap, a C extension that does not
release it) is silent, yet it runs and will go on. The watcher is a small separate process (this
module, started by the Beater with the standard library only, `python -I`) that reads the
training process's /proc/<pid>/stat every BEAT_S, whatever its GIL does, and sends the supervisor
its scheduler state and CPU time ("ps" datagrams, the run's key). The supervisor takes a silent
process for Hung at once only when its watcher is silent too (a frozen node, a partition, a
vanished pod) or says it is not running (stopped, or sleeping without CPU: a deadlock with the
GIL held); a silent process that runs is given longer (supervisor/decide/hang.py).

It ends when the process it watches is gone (or is no longer its parent).
Standard library only, Python >= 3.8: it runs inside users' training images.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import Callable

from . import wire

BEAT_S = 0.5
OF_ENV = "ELASTIC_SUPERVISOR_HOOK_WATCH_OF"  # the watched process's sender id
PID_ENV = "ELASTIC_SUPERVISOR_HOOK_WATCH_PID"
TARGET_ENV = "ELASTIC_SUPERVISOR_HOOK_WATCH_TO"  # host:port of the supervisor


def parse_stat(text: str) -> tuple[str, int]:
    """PURE: (state, utime + stime in clock ticks) from a /proc/<pid>/stat line (the command
    name, in parentheses, may hold spaces and parentheses)."""
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[11]) + int(rest[12])


def read_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def run(key: bytes, to: tuple[str, int], run_id: str, of: str, pid: int, *,
        parent: Callable[[], int] = os.getppid,
        sleep: Callable[[float], None] = time.sleep) -> int:
    """Send the state of `pid` every BEAT_S until it is gone; return how many were sent."""
    sender, seq = wire.new_sender_id(), 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while parent() == pid:
            stat = read_stat(pid)
            if stat is None:
                break
            seq += 1
            body = {"t": "ps", "s": sender, "n": seq, "run": run_id, "of": of, "pid": pid,
                    "state": stat[0], "cpu": stat[1]}
            with contextlib.suppress(OSError):
                sock.sendto(wire.encode(key, body), to)
            sleep(BEAT_S)
    return seq


def command(hook_dir: str) -> list:
    """The watcher's command line: isolated (-I: no PYTHONPATH, so no hook in it), with this
    package found in `hook_dir`."""
    return [sys.executable, "-I", "-c",
            f"import sys; sys.path.insert(0, {hook_dir!r}); "
            "from elastic_supervisor_hook.watch import main; sys.exit(main())"]


def main() -> int:
    from . import RUN_ENV, key_of
    env = dict(os.environ)
    host, _, port = env[TARGET_ENV].rpartition(":")
    run(key_of(env), (host, int(port)), env[RUN_ENV], env[OF_ENV], int(env[PID_ENV]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
