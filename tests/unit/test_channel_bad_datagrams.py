"""Signed datagrams the hook never sends: dropped and counted, said once, the receiver goes on.

Every training process holds the channel's key, so a bug, another version of the hook or a
hostile process can sign anything. Each bad datagram here is signed with the run's key and sent
over loopback UDP to a started HookChannel; a real heartbeat sent after it must still be taken
(the receiver thread is alive), and what was recorded must still be something hang.assess can
judge. The fuzz test mutates real heartbeats (a Beater's) with a seeded generator.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import io
import json
import os
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import datagrams
from supervisor.channel import HookChannel
from supervisor.config import LogFormat, LogLevel
from supervisor.decide import hang
from supervisor.hook.elastic_supervisor_hook import RUN_ENV, DriverHook, watch, wire
from supervisor.hook.elastic_supervisor_hook.worker import Beater, Progress
from supervisor.logs import make_logger
from tests.helpers import wait_for


class Sender:
    """One process's end: datagrams signed with the run's key, its own sequence numbers."""

    def __init__(self, ch: HookChannel, run: str, name: str = "f0f0f0f0f0f0f0f0") -> None:
        self.ch, self.run, self.name, self.n = ch, run, name, 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def raw(self, payload: bytes) -> None:
        """Send `payload` (any bytes) signed, as one datagram."""
        tag = hmac.new(self.ch.key, payload, hashlib.sha256).digest()
        self.sock.sendto(wire.MAGIC + tag + payload, ("127.0.0.1", self.ch.port))

    def body(self, fields: dict[str, Any], kind: str = "hb") -> None:
        self.n += 1
        self.raw(json.dumps({"t": kind, "s": self.name, "n": self.n, "run": self.run,
                             **fields}).encode())

    def text(self, fields: str, kind: str = "hb") -> None:
        """A body whose fields are written as JSON text (what json.dumps cannot write)."""
        self.n += 1
        self.raw(f'{{"t":"{kind}","s":"{self.name}","n":{self.n},"run":"{self.run}",'
                 f"{fields}}}".encode())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def log() -> io.StringIO:
    return io.StringIO()


@pytest.fixture
def channel(tmp_path: Path, log: io.StringIO) -> Iterator[HookChannel]:
    ch = HookChannel(0, dead_file=tmp_path / "hosts.dead", bind="127.0.0.1",
                     log=make_logger(LogFormat.JSON, LogLevel.INFO, log)).start()
    yield ch
    ch.close()


@pytest.fixture
def run(channel: HookChannel) -> str:
    return channel.new_run(None)[RUN_ENV]


def events(log: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, log.getvalue().splitlines()) if e["event"] == name]


def real_heartbeat(channel: HookChannel, run: str) -> dict[str, Any]:
    """What a Beater of this run sends (twice: the second names the main thread's frames)."""
    progress = Progress()
    progress.rank, progress.size, progress.done, progress.inits = 1, 4, 10, 1
    b = Beater(progress, key=channel.key, supervisor=("127.0.0.1", channel.port), run=run,
               host="10.0.0.1", local_rank=0, keep=[], connections=list)
    try:
        b.heartbeat()
        return {**b.heartbeat(), "run": run}
    finally:
        b.sock.close()


def taken(channel: HookChannel, sender: Sender, done: int) -> None:
    """Send a good heartbeat and wait until the store shows it: the receiver is alive."""
    sender.body({"host": "10.0.0.1", "pid": 7, "lr": 0, "done": done})
    wait_for(lambda: (b := channel.snapshot().beats.get(sender.name)) and b.done == done, 5,
             what=f"the good heartbeat (done={done}) taken")


# ---- the examples, each on its own --------------------------------------------------

DEEP = '"x":' + "[" * 50_000  # 50,000 deep (unclosed: closed, it is over a datagram's size)


@pytest.mark.parametrize(("datagram", "said"), [
    pytest.param(("hb", '"host":"10.0.0.1","ports":5'), ("ports", "TCP ports"),
                 id="ports: a number"),
    pytest.param(("hb", '"host":"10.0.0.1","problems":7'), ("problems", "list of at most"),
                 id="problems: a number"),
    pytest.param(("hb", '"host":"10.0.0.1","where":3'), ("where", "list of at most"),
                 id="where: a number"),
    pytest.param(("hb", '"host":"10.0.0.1","wait":1e400'), ("body", "1e400 is not finite"),
                 id="wait: 1e400"),
    pytest.param(("hb", '"host":"10.0.0.1","wait":NaN'), ("body", "NaN is not a JSON number"),
                 id="wait: NaN"),
    pytest.param(("hb", '"host":"10.0.0.1",' + DEEP), ("body", "nested deeper"),
                 id="nested 50,000 deep"),
    pytest.param(("hb", '"host":"10.0.0.1","ports":[70000]'), ("ports", "0..65535"),
                 id="a port out of range"),
    pytest.param(("hb", '"host":"10.0.0.1","rank":true'), ("rank", "null or an integer"),
                 id="rank: a bool"),
    pytest.param(("hb", '"host":"10.0.0.1","tr":-1'), ("tr", "seconds >= 0"),
                 id="training time below 0"),
    pytest.param(("hb", '"host":["10.0.0.1"]'), ("host", "host string"),
                 id="host: a list"),
    pytest.param(("hb", '"pid":1'), ("host", "without host"),
                 id="no host"),
    pytest.param(("bye", '"host":5'), ("host", "host string"),
                 id="bye: host a number"),
    pytest.param(("ps", '"of":"f0f0f0f0f0f0f0f0","cpu":"12"'), ("cpu", "integer 0..2^63-1"),
                 id="watcher: cpu a string"),
    pytest.param(("driver", '"ok":true,"world":5'), ("world", "list of host strings"),
                 id="driver: world a number"),
    pytest.param(("driver", '"ok":true,"exited":{"10.0.0.2":[1]}'), ("exited", "exit codes"),
                 id="driver: an exit code a list"),
    pytest.param(("driver", '"ok":"yes"'), ("ok", "true or false"),
                 id="driver: ok a string"),
    pytest.param(("fence", '"v":99,"dead":[]'), ("t", "a process sends only"),
                 id="a fence from a process"),
])
def test_a_bad_datagram_is_dropped_counted_and_said_once_and_the_next_good_one_is_taken(
        channel: HookChannel, run: str, log: io.StringIO, datagram: tuple[str, str],
        said: tuple[str, str]) -> None:
    """`datagram`: (its type, its fields as JSON text); `said`: (the field named, part of the
    line)."""
    (kind, fields), (field, says) = datagram, said
    s = Sender(channel, run)
    try:
        taken(channel, s, 1)
        for _ in range(3):
            s.text(fields, kind)
        taken(channel, s, 2)
        assert channel.counters.invalid == 3 and channel.counters.failed == 0
        lines = events(log, "hook.datagram_invalid")
        assert len(lines) == 1, "said once"
        assert lines[0]["field"] == field and says in lines[0]["reason"], lines[0]
        assert lines[0]["source"] == "127.0.0.1"
    finally:
        s.close()


@pytest.mark.parametrize(("body", "line"), [
    pytest.param({"t": "hb", "run": "r", "host": "h", "ports": 5},
                 '"hb" datagram: ports=5: expected a list of at most 4096 TCP ports '
                 "(integers 0..65535)", id="ports: a number"),
    pytest.param({"t": "hb", "run": "r", "host": "h", "where": ["x" * 5000]},
                 "\"hb\" datagram: where=['" + "x" * 55 + "...: expected a list of at most 16 "
                 "strings of at most 4096 characters",
                 id="a frame too long: the value cut in the line"),
    pytest.param({"t": "driver", "run": "r"},
                 '"driver" datagram without ok: expected true or false', id="driver: no ok"),
    pytest.param({"t": "ps", "run": 5, "of": "x"},
                 '"ps" datagram: run=5: expected a run id of at most 64 characters',
                 id="watcher: run a number"),
])
def test_the_line_names_the_type_the_field_the_value_and_what_is_accepted(
        body: dict[str, Any], line: str) -> None:
    found = datagrams.defect({"s": "x", "n": 1, **body})
    assert found is not None and found.line == line


def test_what_the_hook_sends_is_taken(channel: HookChannel, run: str) -> None:
    """The checks are not stricter than the hook: a training process's heartbeats (standing
    still: with its frames) and bye, its watcher's report, the driver's hello and refusal."""
    b = Beater(Progress(), key=channel.key, supervisor=("127.0.0.1", channel.port), run=run,
               host="10.0.0.1", local_rank=0, keep=[]).start()
    try:
        wait_for(lambda: (beat := channel.snapshot().beats.get(b.sender)) and beat.where, 5,
                 what="a heartbeat that names the main thread's frames")
        parents = iter([os.getpid(), 0])
        assert watch.run(channel.key, ("127.0.0.1", channel.port), run, b.sender, os.getpid(),
                         parent=lambda: next(parents), sleep=lambda _: None) == 1
        wait_for(lambda: channel.snapshot().beats[b.sender].proc_state, 5, what="the watcher")
        driver = DriverHook(channel.key, channel.port, run, None)
        driver.say("driver", driver.hello())
        wait_for(channel.driver, 5, what="the driver's hello")
        driver.say("driver", {"ok": False, "problems": driver.problems()})
        wait_for(lambda: (d := channel.driver()) and not d.ok, 5, what="the driver's refusal")
        b.bye()
        wait_for(lambda: channel.snapshot().beats[b.sender].bye_at, 5, what="the bye")
        assert (channel.counters.invalid, channel.counters.failed) == (0, 0)
    finally:
        b.close()


# ---- fuzz: real heartbeats, mutated -----------------------------------------------------------

# values at the edges of what is accepted, and past them
SCALARS: list[Any] = [None, True, False, 0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64,
                      -(2**63), 10**30, 0.5, -0.0, 9.2e18, 1e308, -1e308, "", "c", "i",
                      "10.0.0.2", "x" * 5000, "\u00e9\x00", {}, [], [0], [65535]]
RAW = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "[" * 2000 + "]" * 2000,
       "[" * 50_000, "{" * 3000, '"\\ud800"', "1" * 5000]


def weird(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.6 or depth > 3:
        return rng.choice(SCALARS)
    if roll < 0.8:
        return [weird(rng, depth + 1) for _ in range(rng.randrange(4))]
    if roll < 0.9:
        return {str(weird(rng, depth + 1))[:20]: weird(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    nested: Any = rng.choice(SCALARS)
    for _ in range(rng.randrange(1, 60)):
        nested = [nested]
    return nested


def mutated(rng: random.Random, real: dict[str, Any], n: int) -> bytes:
    """A real heartbeat with one to three fields changed, dropped or added, or a field's JSON
    text replaced by what json.dumps cannot write, or the text cut short."""
    body = {**real, "s": "f0f0f0f0f0f0f0f0", "n": n}
    raw: tuple[str, str] | None = None
    for _ in range(rng.randrange(1, 4)):
        name = rng.choice([*body, "extra"])
        roll = rng.random()
        if roll < 0.6:
            body[name] = weird(rng)
        elif roll < 0.75:
            body.pop(name, None)
        else:
            raw = (name, rng.choice(RAW))
    text = json.dumps(body)
    if raw is not None:
        text = text[:-1] + f', "{raw[0]}": {raw[1]}}}'
    if rng.random() < 0.05:
        text = text[:rng.randrange(len(text))]
    return text.encode()[:wire.MAX_DATAGRAM - 40]


def test_fuzz_mutated_heartbeats_never_stop_the_receiver_nor_break_what_reads_the_store(
        channel: HookChannel, run: str, log: io.StringIO) -> None:
    rng = random.Random(39)
    real = real_heartbeat(channel, run)
    fuzz, good = Sender(channel, run), Sender(channel, run, name="0a0a0a0a0a0a0a0a")
    sent = 0
    try:
        for batch in range(30):
            for _ in range(50):
                fuzz.n += 1
                data = mutated(rng, real, fuzz.n)
                fuzz.raw(data)
                sent += 1
                if len(data) > 4096:  # a socket's buffer holds only a few of those: pace
                    wait_for(lambda s=sent, b=batch: channel.counters.received >= s + b, 10,
                             interval=0.002, what="a large datagram received")
            taken(channel, good, batch + 1)
            beats = channel.snapshot().beats.values()
            now = channel.clock() + 10
            hang.assess(beats, {b.host: 0.0 for b in beats}, started_at=0.0,
                        settings=hang.HangSettings(), now=now, failed_at={"10.0.0.1": 0.0},
                        world=(frozenset(b.host for b in beats), 0.0))
            hang.run_progress(beats, 0.0, now)
        c = channel.counters
        assert c.failed == 0, "nothing raised while recording"
        assert sent - 50 > c.invalid > 1000, f"{c.invalid} of {sent} invalid: the " \
            "mutations mutate, and some are valid"
        said = events(log, "hook.datagram_invalid")
        keys = [(e["type"], e["field"]) for e in said]
        assert len(keys) == len(set(keys)), "said once per type and field"
    finally:
        fuzz.close()
        good.close()


# ---- the receiver thread, ended anyway ---------------------------------------------------------

def test_a_receiver_thread_that_ends_anyway_is_said_and_started_again(
        channel: HookChannel, run: str, log: io.StringIO) -> None:
    s = Sender(channel, run)
    try:
        taken(channel, s, 1)
        assert channel.revive() is False, "alive: nothing to do"
        receiver = next(t for t in threading.enumerate() if t.name == "hook-channel")
        # Whatever a guard cannot catch (here SystemExit, raised in the thread itself)
        assert ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(receiver.ident or 0), ctypes.py_object(SystemExit)) == 1
        s.body({"host": "10.0.0.1", "pid": 7, "lr": 0, "done": 1})  # wakes it
        receiver.join(5)
        assert not receiver.is_alive()
        assert channel.revive() is True
        said = events(log, "hook.receiver_restarted")
        assert len(said) == 1 and said[0]["reason"] == "SystemExit()", said
        assert said[0]["level"] == "error"
        taken(channel, s, 2)
        assert channel.revive() is False
    finally:
        s.close()
    channel.close()
    assert channel.revive() is False, "closed: not started again"
