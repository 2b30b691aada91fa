"""Which supervisor owns this worker's training: never two horovodruns' processes on one worker.

Two launchers of one job can both drive a horovodrun against the same workers: a leader cut
off from the API keeps training (an outage is no reason to stop), while a standby that can reach
the API sees the leader's Lease expire, takes it over and starts a horovodrun of its own. Both
runs' training processes would then share every worker (and write the same checkpoints).

Each leader's term is the Lease's `leaseTransitions` when it took the Lease (it counts up with
every takeover), scoped by the Lease's uid (one job: a later job of the same name, or another
job's processes on a shared machine, are not compared with it); the supervisor hands
"<uid>.<term>" to every training process of its horovodruns (OWNER_ENV). A training process
claims its worker as it starts, before the user's script runs: under a lock on the job's owner
file on the worker (OWNER_FILE_ENV, else `elastic-supervisor-owner-<uid>` in $TMPDIR or /tmp),

- a term below the file's: this process belongs to a supervisor that lost the job. It says so
  (`hook.superseded` on stderr) and exits SUPERSEDED at once, so the old horovodrun's respawns
  die before they train;
- otherwise the file gets this term, and every process of the worker (of this user, with the
  same job and owner file) that carries a lower term in its environment (the old run's
  training processes and their children) is killed before this one goes on.

Processes without a term (no Lease: a local run) claim nothing and are never killed here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time

OWNER_ENV = "ELASTIC_SUPERVISOR_HOOK_OWNER"  # "<the Lease's uid>.<its leaseTransitions>"
OWNER_FILE_ENV = "ELASTIC_SUPERVISOR_HOOK_OWNER_FILE"
OWNER_FILE = "elastic-supervisor-owner"  # -<uid>, in $TMPDIR or /tmp, unless OWNER_FILE_ENV
SUPERSEDED = 75  # the exit code of a training process whose supervisor lost the job


def owner_of(value: str | None) -> tuple[str, int] | None:
    """(the job's Lease uid, the term) from OWNER_ENV's text; None for none or a malformed
    one."""
    scope, _, term = (value or "").strip().rpartition(".")
    if not term.isdigit() or not scope or len(scope) > 64 or not all(
            c.isalnum() or c == "-" for c in scope):
        return None
    return scope, int(term)


def owner_file(env: dict, scope: str) -> str:
    """The job's owner file on this worker as a process with environment `env` finds it (so
    that the processes that share one are known by their environments)."""
    return env.get(OWNER_FILE_ENV) or os.path.join(env.get("TMPDIR") or "/tmp",
                                                   f"{OWNER_FILE}-{scope}")


def term_of(text: str) -> int | None:
    return int(text.strip()) if text.strip().isdigit() else None


def _environ(pid: str) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = (v.partition(b"=") for v in f.read().split(b"\0") if v)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _terms(scope: str, path: str) -> list[tuple[int, int]]:
    """(pid, term) of this user's other processes of job `scope` that carry a term and share
    owner file `path` (those whose environment can be read)."""
    found = []
    me, uid = os.getpid(), os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            env = _environ(name)
        except OSError:
            continue
        theirs = owner_of(env.get(OWNER_ENV))
        if theirs is not None and theirs[0] == scope and owner_file(env, scope) == path:
            found.append((int(name), theirs[1]))
    return found


def claim(scope: str, mine: int, path: str) -> tuple[int | None, list[int]]:
    """Claim the worker for term `mine` of job `scope`: (the file's higher term, []) when
    superseded, else (None, the pids of lower terms killed)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        held = term_of(f.read())
        if held is not None and held > mine:
            return held, []
        if held != mine:
            f.seek(0)
            f.truncate()
            f.write(f"{mine}\n")
            f.flush()
        killed = []
        for pid, term in _terms(scope, path):
            if term < mine:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return None, killed


def claim_or_exit(env: dict) -> int | None:
    """What a training process does first: claim its worker for its term, or exit SUPERSEDED.
    Returns the term (None: no term, nothing claimed)."""
    owner = owner_of(env.get(OWNER_ENV))
    if owner is None:
        if env.get(OWNER_ENV) is not None:
            print(f"elastic-supervisor hook: {OWNER_ENV}={env[OWNER_ENV]!r}: expected "
                  "<the job's Lease uid>.<the leader's term, a whole number>; this worker is "
                  "not claimed", file=sys.stderr, flush=True)
        return None
    scope, mine = owner
    path = owner_file(env, scope)
    try:
        held, killed = claim(scope, mine, path)
    except OSError as e:
        # The file cannot be used (a read-only filesystem): said, and training goes on
        # unguarded rather than not at all.
        print(f"elastic-supervisor hook: {OWNER_FILE_ENV}={path}: cannot claim the worker "
              f"({e}); set it to a writable file", file=sys.stderr, flush=True)
        return mine
    host = env.get("HOROVOD_HOSTNAME", "")
    if held is not None:
        print(json.dumps({"event": "hook.superseded", "host": host, "term": mine, "owner": held,
                          "time": round(time.time(), 3)}), file=sys.stderr, flush=True)
        os._exit(SUPERSEDED)
    if killed:
        print(json.dumps({"event": "hook.claimed", "host": host, "term": mine,
                          "killed": sorted(killed), "time": round(time.time(), 3)}),
              file=sys.stderr, flush=True)
    return mine
