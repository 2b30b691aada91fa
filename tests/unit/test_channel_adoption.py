"""A supervisor process killed and started again (sidecar mode) goes on commanding the run.

The first supervisor runs in a process of its own, is SIGKILLed after a fence, and the next one
adopts the run on the same port, as runner.run does: a real worker hook (Beater) heartbeats to
both over loopback UDP. The workers take a command only from a sequence above the last one they
took and a fence only of a version above theirs, so the next supervisor must go on from where
the first stopped: its fence, its `exit`, and the dead file keep the hosts declared dead before.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.channel import HookChannel, state_file
from supervisor.config import LogFormat, LogLevel
from supervisor.hook.elastic_supervisor_hook import KEY_ENV, RUN_ENV
from supervisor.hook.elastic_supervisor_hook.worker import Beater, Progress
from supervisor.logs import make_logger
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

# The first supervisor: opens a run, says its environment, fences the hosts it reads on stdin.
# With a second argument, the channel's key is the job's, in that file.
FIRST = """
import json, sys
from pathlib import Path
from supervisor.channel import HookChannel
key_file = (Path(sys.argv[2]), bytes.fromhex(Path(sys.argv[2]).read_text())) \\
    if len(sys.argv) > 2 else None
ch = HookChannel(0, dead_file=Path(sys.argv[1]), bind="127.0.0.1", key_file=key_file).start()
print(json.dumps({"port": ch.port, **ch.new_run(None)}), flush=True)
for line in sys.stdin:
    print(ch.fence([line.strip()]), flush=True)
"""


class First:
    """The first supervisor process, killed with SIGKILL at the end."""

    def __init__(self, dead_file: Path, *key_file: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FIRST, str(dead_file),
                                      *map(str, key_file)], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.env = json.loads(self.proc.stdout.readline())
        self.key = bytes.fromhex(key_file[0].read_text() if key_file else self.env[KEY_ENV])

    def fence(self, host: str) -> int:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write(host + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def first(tmp_path: Path) -> Iterator[First]:
    f = First(tmp_path / "hosts.dead")
    yield f
    if f.proc.poll() is None:
        f.kill()


def worker(first: First, exits: list[int]) -> Beater:
    return Beater(Progress(), key=first.key, supervisor=("127.0.0.1", first.env["port"]),
                  run=first.env[RUN_ENV], host="10.0.0.1", local_rank=0, keep=[],
                  exit_process=exits.append, fence=False)


@contextlib.contextmanager
def fenced_then_killed(first: First) -> Iterator[tuple[Beater, list[int]]]:
    """A worker of `first`'s run that took its fence of 10.0.0.9, and `first` SIGKILLed: the
    worker's heartbeats, and the exits it was told to make."""
    exits: list[int] = []
    b = worker(first, exits).start()
    try:
        first.fence("10.0.0.9")  # pushed, or in the reply to its next heartbeat
        wait_for(lambda: b.fence_version == 1, 5, what="the first fence taken")
        first.kill()
        yield b, exits
    finally:
        b.close()


def channel(tmp_path: Path, first: First, log: io.StringIO, **kw: Any) -> HookChannel:
    """The next supervisor's channel, on the first one's port (not receiving yet)."""
    return HookChannel(first.env["port"], dead_file=tmp_path / "hosts.dead", bind="127.0.0.1",
                       log=make_logger(LogFormat.JSON, LogLevel.INFO, log), **kw)


def events(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


def test_after_a_sigkill_that_follows_a_fence_the_next_supervisor_fences_and_ends_the_run(
        tmp_path: Path, first: First) -> None:
    log = io.StringIO()
    with fenced_then_killed(first) as (b, exits), contextlib.closing(
            channel(tmp_path, first, log)) as again:
        again.adopt(first.env[RUN_ENV], first.env[KEY_ENV])
        again.start()
        wait_for(lambda: again.snapshot().beats.get(b.sender), 5, what="a beat to the next one")
        assert again.fenced() == {"10.0.0.9"}, "the dead set carried over"
        assert again.fence(["10.0.0.8"]) == 1
        wait_for(lambda: b.fence_version == 2, 5, what="the next supervisor's fence taken")
        assert b.dead == [("10.0.0.9", None), ("10.0.0.8", None)]
        assert json.loads((tmp_path / "hosts.dead").read_text()) == ["10.0.0.8", "10.0.0.9"]
        assert again.exit_run("restarted") == 1
        wait_for(lambda: exits, 5, what="the next supervisor's exit taken")
        said = events(log)
        assert [e["event"] for e in said] == ["hook.channel_adopted"], "nothing lost"
        assert (said[0]["fence_version"], said[0]["dead"]) == (1, ["10.0.0.9"])


@pytest.mark.parametrize("damage", [
    pytest.param(None, id="no state file"),
    pytest.param(lambda text: "{", id="not JSON"),
    pytest.param(lambda text: json.dumps({**json.loads(text), "run": "0000abcd.1"}),
                 id="another run's"),
    pytest.param(lambda text: json.dumps({**json.loads(text), "version": "1"}),
                 id="a version that is not a number"),
    pytest.param(lambda text: json.dumps({**json.loads(text), "entries": {}}),
                 id="a dead host without its entries"),
])
def test_a_state_file_that_cannot_be_read_is_said_and_fences_and_exits_still_get_through(
        tmp_path: Path, first: First, damage: Callable[[str], str] | None) -> None:
    log = io.StringIO()
    path = state_file(tmp_path / "hosts.dead")
    with fenced_then_killed(first) as (b, exits), contextlib.closing(
            channel(tmp_path, first, log)) as again:
        if damage is None:
            path.unlink()
        else:
            path.write_text(damage(path.read_text()))
        again.adopt(first.env[RUN_ENV], first.env[KEY_ENV])
        again.start()
        lost = [e for e in events(log) if e["event"] == "hook.channel_state_lost"]
        assert len(lost) == 1 and lost[0]["file"] == str(path), log.getvalue()
        again.fence(["10.0.0.8"])
        wait_for(lambda: b.dead == [("10.0.0.8", None)], 5, what="the next fence taken")
        again.exit_run("restarted")
        wait_for(lambda: exits, 5, what="the next supervisor's exit taken")


def test_a_heartbeat_that_comes_before_the_adoption_leaves_the_state_file_alone(
        tmp_path: Path) -> None:
    """With the job's key (a file), a channel that receives before it adopts takes the run's
    heartbeats for an earlier run's and answers them (runner.run adopts before it receives):
    that answer must not replace the state of the run it is about to adopt."""
    key = tmp_path / "key"
    key.write_text(os.urandom(32).hex())
    first, log = First(tmp_path / "hosts.dead", key), io.StringIO()
    try:
        with fenced_then_killed(first) as (b, _), contextlib.closing(
                channel(tmp_path, first, log, key_file=(key, first.key)).start()) as again:
            wait_for(lambda: again.counters.replies, 5, what="an answer to a heartbeat")
            again.adopt(first.env[RUN_ENV], None)
            assert [e["event"] for e in events(log)] == ["hook.channel_adopted"]
            again.fence(["10.0.0.8"])
            wait_for(lambda: b.dead == [("10.0.0.9", None), ("10.0.0.8", None)], 5,
                     what="the next supervisor's fence taken")
    finally:
        if first.proc.poll() is None:
            first.kill()
