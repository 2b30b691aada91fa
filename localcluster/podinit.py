"""Per-pod init process: the container runtime of one pod run by the local node agent.

The node agent starts one podinit per pod, in a new session:
`python -I podinit.py --log LOG [--ready-tcp ADDRESS:PORT] -- CMD...`. It makes itself a child
subreaper, so every process the pod ever starts (sshd, its sessions, which call setsid, and
whatever they daemonise) stays in its process tree; then it runs CMD, the container's main
process, with stdout and stderr appended to LOG.

Its exit code is the container's: CMD's own code, or 128+N when signal N killed CMD. When CMD
ends, every process left in the tree gets SIGKILL, as when a container's PID namespace goes away.

Protocol with the agent. Commands, one per line on stdin:
  `signal N`  send signal N to every process of the container (podinit itself excluded);
  `exit N`    SIGKILL every process of the container, then exit with code N.
EOF on stdin (the agent closed the pipe, or died) kills the container (exit 137 if the main
process was still running). `signal 19` (SIGSTOP) repeats until every process is stopped.
SIGTERM to podinit is forwarded to every process of the container.
Events, one JSON object per line on stdout, each with "at" (RFC 3339, UTC):
  started {pid}; ready (once ADDRESS:PORT accepts a TCP connection, like a tcpSocket readiness
  probe); failed {error} (CMD could not be started: exit 128, a runtime's StartError);
  exited {code}.
Only the standard library and psutil: it runs as a script, outside the project's import path.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36
START_ERROR = 128
KILLED = 128 + signal.SIGKILL
# Readiness probe period while CMD is not yet listening, seconds.
PROBE_PERIOD_S = 0.05
# How long the last teardown may take before podinit gives up on unkillable processes, seconds.
TEARDOWN_S = 10.0


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def emit(event: str, **fields: object) -> None:
    """Report one event to the agent (ignored if the agent has gone)."""
    with contextlib.suppress(OSError):
        sys.stdout.write(json.dumps({"event": event, "at": now(), **fields}) + "\n")
        sys.stdout.flush()


def probe(address: str) -> bool:
    """Return whether ADDRESS:PORT accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.5):
        return True
    return False


class Container:
    """The processes below podinit: the main process and everything it started."""

    def __init__(self, main: subprocess.Popen[bytes]) -> None:
        self.main = main
        self.status: int | None = None  # the main process's exit code once reaped

    def members(self) -> list[psutil.Process]:
        """Return the live (not zombie) processes of the container."""
        out = []
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def signal(self, sig: int) -> None:
        for p in self.members():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    def freeze(self, rounds: int = 5) -> None:
        """SIGSTOP members until none is left running (a process may fork while we stop it)."""
        for _ in range(rounds):
            running = []
            for p in self.members():
                with contextlib.suppress(psutil.NoSuchProcess):
                    if p.status() != psutil.STATUS_STOPPED:
                        running.append(p)
            if not running:
                return
            for p in running:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGSTOP)
            time.sleep(0.01)

    def reap(self) -> bool:
        """Reap every exited child (orphans come to us); return False once none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main.pid:
                code = os.waitstatus_to_exitcode(status)
                self.status = 128 - code if code < 0 else code
                self.main.returncode = self.status  # reaped here, not by Popen

    def kill_all(self, deadline: float) -> None:
        """SIGKILL the container's processes until none is left (or the deadline passes)."""
        while time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            if not self.reap():
                return
            time.sleep(0.02)


def read_commands(fd: int, buffer: bytearray) -> list[str] | None:
    """Return the complete command lines available on `fd`, or None at EOF."""
    data = os.read(fd, 4096)
    if not data:
        return None
    buffer += data
    *lines, rest = buffer.split(b"\n")
    buffer[:] = rest
    return [line.decode().strip() for line in lines if line.strip()]


def run(argv: list[str], log: str, ready: str | None) -> int:
    """Run the container `argv`, serve the agent's commands, return the container's exit code."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the fd
    with open(log, "ab") as out:
        try:
            main = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        except OSError as e:
            emit("failed", error=f"{argv[0]}: {e.strerror or e}")
            return START_ERROR
    box = Container(main)
    signal.signal(signal.SIGTERM, lambda *_: box.signal(signal.SIGTERM))
    emit("started", pid=main.pid)
    stdin, buffer = sys.stdin.fileno(), bytearray()
    forced: int | None = None
    while box.reap() and box.status is None:
        if ready and probe(ready):
            emit("ready")
            ready = None
        readable, _, _ = select.select([stdin, wake_r], [], [], PROBE_PERIOD_S if ready else 1.0)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if stdin not in readable:
            continue
        commands = read_commands(stdin, buffer)
        if commands is None:  # the agent is gone: so is the pod
            box.kill_all(time.monotonic() + TEARDOWN_S)
            break
        for command in commands:
            verb, _, arg = command.partition(" ")
            if verb == "signal":
                box.signal(int(arg))
                if int(arg) == signal.SIGSTOP:
                    box.freeze()
            elif verb == "exit":
                forced = int(arg)
                box.kill_all(time.monotonic() + TEARDOWN_S)
            else:
                print(f"podinit: unknown command {command!r}", file=sys.stderr, flush=True)
    box.kill_all(time.monotonic() + TEARDOWN_S)
    code = forced if forced is not None else box.status
    code = KILLED if code is None else code
    emit("exited", code=code)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(prog="podinit")
    parser.add_argument("--log", required=True, help="file the container's output is appended to")
    parser.add_argument("--ready-tcp", help="ADDRESS:PORT that must accept TCP to be Ready")
    parser.add_argument("command", nargs="+", help="the container's main process")
    args = parser.parse_args()
    return run(args.command, args.log, args.ready_tcp)


if __name__ == "__main__":
    sys.exit(main())
