"""PURE: what a datagram of the hook channel may hold, field by field (the supervisor's side).

The channel's datagrams are authenticated (hook/elastic_supervisor_hook/wire.py), but every
training process holds the key: a bug, an older or newer hook, or a hostile process can sign
anything. `defect(body)` checks a parsed body (wire.parse: JSON of finite numbers, "t", "s" and
"n" already checked) against the table of its type before the channel records anything of it:
each field's type, range and size; lists and maps hold scalars only, so nothing here recurses.
A field the hook may leave out (an older hook) may be absent, never of another type. Fields the
table does not name are never read. One table per type the supervisor takes from a process:
"hb" and "bye" (worker.py), "ps" (watch.py), "driver" (the hook in horovodrun's driver).
No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from supervisor.hook.elastic_supervisor_hook.wire import brief

MAX_INT = 2 ** 63 - 1
MAX_ID = 2 ** 31 - 1  # pids, ranks, sizes, local ranks
HOST_CHARS = 255  # a host string: a pod IP or a DNS name
TEXT_CHARS = 4096  # a problem of the hook, one of its frames
POS_CHARS = 8192  # file (a path) : line : offset : digest
RUN_CHARS = 64  # "<8 hex digits>.<run number>"
MAX_PORTS = 4096  # the hook sends at most 2000
MAX_ADDRS = 256
MAX_PROBLEMS = 64
MAX_FRAMES = 16  # the hook sends 3
MAX_LINKS = 64  # the hook sends 8
MAX_HOSTS = 100_000  # the driver's world and failures (a datagram holds ~1500 anyway)


@dataclass(frozen=True)
class Rule:
    """One field: whether a value is accepted, and how the accepted values read in a line."""

    accepts: Callable[[Any], bool]
    says: str
    required: bool = False


@dataclass(frozen=True)
class Defect:
    """Why a datagram is dropped: its type ("" when the body itself is not one), the field
    ("body" for the JSON itself), and one line naming the value and what is accepted."""

    kind: str
    field: str
    line: str


def _int(v: Any, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def port(v: Any) -> bool:
    """Whether `v` is a TCP port number."""
    return _int(v, 0, 65535)


def _seconds(v: Any) -> bool:
    # finite: wire.parse refuses what is not
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= MAX_INT


def _text(v: Any, chars: int) -> bool:
    return isinstance(v, str) and len(v) <= chars


def _texts(v: Any, items: int, chars: int) -> bool:
    return isinstance(v, list) and len(v) <= items and all(_text(x, chars) for x in v)


def _or_none(accepts: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or accepts(v)


COUNT = Rule(lambda v: _int(v, 0, MAX_INT), "an integer 0..2^63-1")
ID = Rule(lambda v: _int(v, 0, MAX_ID), "an integer 0..2^31-1")
ID_OR_NONE = Rule(_or_none(ID.accepts), "null or an integer 0..2^31-1")
HOST = Rule(lambda v: _text(v, HOST_CHARS) and v != "", f"a host string of 1 to {HOST_CHARS} "
            "characters", required=True)
PROBLEMS = Rule(lambda v: _texts(v, MAX_PROBLEMS, TEXT_CHARS),
                f"a list of at most {MAX_PROBLEMS} strings of at most {TEXT_CHARS} characters")
SECONDS = Rule(_seconds, "a finite number of seconds >= 0")
COMMON = {"run": Rule(lambda v: _text(v, RUN_CHARS), f"a run id of at most {RUN_CHARS} "
                      "characters", required=True)}

SCHEMA: dict[str, dict[str, Rule]] = {
    "hb": {
        **COMMON, "host": HOST, "pid": ID, "lr": ID, "rank": ID_OR_NONE, "size": ID_OR_NONE,
        "inits": COUNT, "done": COUNT, "dc": COUNT, "st": COUNT, "cm": COUNT, "rd": COUNT,
        "tr": SECONDS, "fv": COUNT, "so": SECONDS, "sw": SECONDS, "sn": COUNT,
        "wait": Rule(_or_none(_seconds), "null or a finite number of seconds >= 0"),
        "in": Rule(lambda v: v in (None, "c", "i"), 'null, "c" (a collective) or "i" (an init)'),
        "addrs": Rule(lambda v: _texts(v, MAX_ADDRS, 64),
                      f"a list of at most {MAX_ADDRS} IP addresses"),
        "ports": Rule(lambda v: isinstance(v, list) and len(v) <= MAX_PORTS
                      and all(map(port, v)),
                      f"a list of at most {MAX_PORTS} TCP ports (integers 0..65535)"),
        "problems": PROBLEMS,
        "pos": Rule(lambda v: _text(v, POS_CHARS), f"a string of at most {POS_CHARS} characters"),
        "io": Rule(_or_none(COUNT.accepts), "null or an integer 0..2^63-1"),
        "rt": Rule(lambda v: isinstance(v, dict) and len(v) <= MAX_LINKS and all(
            _text(a, 64) and _seconds(ms) for a, ms in v.items()),
            f"an object of at most {MAX_LINKS} IP addresses to milliseconds >= 0"),
        "where": Rule(lambda v: _texts(v, MAX_FRAMES, TEXT_CHARS),
                      f"a list of at most {MAX_FRAMES} strings of at most {TEXT_CHARS} "
                      "characters"),
    },
    "bye": {**COMMON, "host": replace(HOST, required=False), "pid": ID, "lr": ID},
    "ps": {
        **COMMON, "of": Rule(lambda v: _text(v, 64), "a sender id of at most 64 characters",
                             required=True),
        "pid": ID, "state": Rule(lambda v: _text(v, 8) and v != "",
                                 'a scheduler state of 1 to 8 characters ("R", "S", "D", ...)'),
        "cpu": COUNT,
    },
    "driver": {
        **COMMON, "pid": ID,
        "ok": Rule(lambda v: isinstance(v, bool), "true or false", required=True),
        "problems": PROBLEMS, "version": Rule(lambda v: _text(v, TEXT_CHARS),
                                             f"a string of at most {TEXT_CHARS} characters"),
        "connect_s": SECONDS, "read_s": SECONDS, "wseq": COUNT,
        "world": Rule(lambda v: _texts(v, MAX_HOSTS, HOST_CHARS),
                      f"a list of host strings of at most {HOST_CHARS} characters"),
        "exited": Rule(lambda v: isinstance(v, dict) and len(v) <= MAX_HOSTS and all(
            _text(h, HOST_CHARS) and _int(c, -MAX_ID - 1, MAX_ID) for h, c in v.items()),
            "an object of host strings to exit codes (32-bit integers)"),
    },
}


def defect(body: Mapping[str, Any]) -> Defect | None:
    """PURE: why the supervisor must drop `body` (a wire.parse result), or None."""
    kind = str(body["t"])
    rules = SCHEMA.get(kind)
    if rules is None:
        return Defect(kind, "t", f"t={brief(kind)}: a process sends only "
                      f"{', '.join(sorted(SCHEMA))}")
    for name, rule in rules.items():
        if name not in body:
            if rule.required:
                return Defect(kind, name, f'"{kind}" datagram without {name}: expected '
                              f"{rule.says}")
        elif not rule.accepts(body[name]):
            return Defect(kind, name, f'"{kind}" datagram: {name}={brief(body[name])}: '
                          f"expected {rule.says}")
    return None
