"""ADAPTER: the only module touching subprocess, psutil and signals of child processes.

Owns the horovodrun child: started in its own session (so a terminal's Ctrl-C reaches only the
supervisor, which forwards it), signalled as a process group, and on shutdown its whole process
tree is killed and reaped. The supervisor makes itself a child subreaper, so workers' ssh clients
orphaned by a dying horovodrun are re-parented to it and can still be found and reaped.

Also owns `kill_ssh_clients`: the launcher-side `ssh <host> ...` processes of a dead worker must
be killed, because a frozen or partitioned worker never closes its TCP connection and Horovod's
driver would wait for it forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

PR_SET_CHILD_SUBREAPER = 36
# Environment variable marking every process of one supervised tree (value: a random token).
TREE_MARKER = "ELASTIC_SUPERVISOR_TREE"
# ssh(1) options that take an argument; the first other non-option word is the destination.
SSH_OPTS_WITH_ARG = set("BbcDEeFIiJLlmOoPpQRSWw")


_prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
PR_SET_PDEATHSIG = 1


def _pdeathsig_term() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def exit_code(returncode: int) -> int:
    """Map a Popen returncode to a shell-style exit code (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); return whether it worked."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def reap_zombies(candidates: set[int]) -> list[int]:
    """waitpid() those of `candidates` that are zombie children of this process; return them."""
    reaped = []
    for pid in candidates:
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def ssh_destination(argv: Sequence[str]) -> str | None:
    """Return the destination host of an ssh command line (without user@), or None."""
    if not argv or os.path.basename(argv[0]) != "ssh":
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and len(arg) > 1:
            # "-p22" carries its value; "-p 22" takes the next word; "-vT" are flags.
            letters = arg[1:]
            for j, ch in enumerate(letters):
                if ch in SSH_OPTS_WITH_ARG:
                    if j == len(letters) - 1:
                        i += 1
                    break
            i += 1
            continue
        break
    if i >= len(argv):
        return None
    dest = argv[i]
    if dest.startswith("ssh://"):
        dest = dest[len("ssh://"):].split(":")[0]
    return dest.rsplit("@", 1)[-1]


def ssh_clients(root_pid: int, hosts: Collection[str]) -> dict[str, list[psutil.Process]]:
    """Return the ssh client processes below `root_pid` by destination, for `hosts` (one walk
    of the process table however many hosts: it costs ~2 ms)."""
    try:
        tree = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found: dict[str, list[psutil.Process]] = {}
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            dest = ssh_destination(p.cmdline())
            if dest in hosts:
                found.setdefault(dest, []).append(p)
    return found


def ssh_clients_for(root_pid: int, host: str) -> list[psutil.Process]:
    """Return the ssh client processes below `root_pid` whose destination is `host`."""
    return ssh_clients(root_pid, {host}).get(host, [])


def kill_ssh_clients(root_pid: int, hosts: Collection[str]) -> dict[str, list[int]]:
    """SIGKILL horovodrun's ssh clients for `hosts` (within `root_pid`'s tree); return their
    pids by host.

    ssh then exits 255 in the eyes of its parent, and Horovod's driver records the worker failed.
    """
    killed: dict[str, list[int]] = {}
    for host, procs in ssh_clients(root_pid, hosts).items():
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
                killed.setdefault(host, []).append(p.pid)
    return killed


def kill_rounds(members: Callable[[], list[psutil.Process]],
                wait: Callable[[list[psutil.Process]], object], rounds: int = 3) -> int:
    """SIGKILL what `members()` finds alive, `wait` for it, and look again (a process forked
    meanwhile), at most `rounds` times; return how many processes got it."""
    killed = 0
    for _ in range(rounds):
        procs = [p for p in members() if alive(p)]
        if not procs:
            break
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        killed += len(procs)
        wait(procs)
    return killed


def alive(p: psutil.Process) -> bool:
    """Whether `p` runs (a zombie does not)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Child:
    """A supervised child process (horovodrun) in its own session and process group.

    Every process of its tree carries TREE_MARKER=<token> in its environment (inherited), so the
    tree can still be found after horovodrun died and its orphans were re-parented to us.
    """

    proc: subprocess.Popen[bytes]
    token: str
    seen: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str]) -> Child:
        """Start `argv` with `env` (no shell) in a new session; stdout/stderr are inherited.

        The child gets SIGTERM if the supervisor dies (even by SIGKILL), so horovodrun and its
        workers' ssh clients never outlive it.
        """
        token = uuid.uuid4().hex
        proc = subprocess.Popen(list(argv), env={**env, TREE_MARKER: token},
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                # one prctl() between fork and exec, resolved beforehand
                                preexec_fn=_pdeathsig_term)  # noqa: PLW1509
        return cls(proc, token)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """Return the shell-style exit code if it has exited, else None."""
        rc = self.proc.poll()
        return None if rc is None else exit_code(rc)

    def wait(self, timeout: float | None = None) -> int:
        return exit_code(self.proc.wait(timeout))

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's process group (horovodrun and what stayed in its group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def members(self) -> list[psutil.Process]:
        """Return the live processes of the tree: our descendants carrying this tree's marker."""
        out = []
        for p in psutil.Process().children(recursive=True):
            if p.pid == self.proc.pid:
                continue
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                if p.environ().get(TREE_MARKER) == self.token:
                    out.append(p)
        self.seen.update(p.pid for p in out)
        return out

    def reap(self) -> list[int]:
        """Reap orphans of the tree that were re-parented to us and have exited.

        Called on every loop tick. Orphans land as our direct children (we are a subreaper);
        those carrying this tree's marker are remembered while alive (a zombie's environment
        can no longer be read), and reaped once they have exited.
        """
        for p in psutil.Process().children():
            if p.pid == self.proc.pid or p.pid in self.seen:
                continue
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                if p.environ().get(TREE_MARKER) == self.token:
                    self.seen.add(p.pid)
        reaped = reap_zombies(self.seen)
        self.seen.difference_update(reaped)
        return reaped

    def kill_tree(self, rounds: int = 3) -> int:
        """SIGKILL the child, its process group and every member of its tree; reap; return count."""
        self.signal_group(signal.SIGKILL)
        killed = kill_rounds(self.members, lambda procs: psutil.wait_procs(procs, timeout=2),
                             rounds)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.reap()
        return killed
