"""PURE: the datagrams of the hook channel, shared by the supervisor and the hook.

One UDP datagram = MAGIC (4 bytes) + HMAC-SHA256 of the body under the run's key (32 bytes) +
the body, a compact JSON object. Every body has "t" (its type), "s" (the sender: a random id per
process, "supervisor" for the supervisor) and "n" (a sequence number that only grows per
sender). `authentic` returns the payload of a datagram whose tag verifies; `parse` its body, or
raises Malformed naming what is wrong (not JSON, a number that is not finite, nested deeper than
the interpreter parses, not such an object); `decode` is both, None for either failure.
`Replays` drops what is not newer than the last datagram accepted from its sender. So a client
without the key changes nothing, and a recorded datagram sent again neither.

Types: training process -> supervisor "hb" (heartbeat) and "bye" (a clean exit), its process
watcher -> supervisor "ps" (the process's scheduler state and CPU time), horovodrun's
driver -> supervisor "driver"; supervisor -> training process "fence" (the dead set) and "exit"
(leave: this run of horovodrun is being restarted).
Standard library only, Python >= 3.8: this module runs inside users' training processes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from collections import OrderedDict
from typing import Any

MAGIC = b"ESH1"
TAG_LEN = 32
# Well under the 65507-byte UDP limit; heartbeats are ~300 bytes, fence pushes grow with the
# dead set (about 40 bytes a host on real nodes).
MAX_DATAGRAM = 60000
SUPERVISOR = "supervisor"
TYPES = frozenset({"hb", "bye", "ps", "driver", "fence", "exit"})
MAX_SENDER = 64  # characters of "s" (the hook's ids are 16 hex digits)
MAX_SEQ = 2 ** 63 - 1


MIN_KEY_BYTES = 16


def new_key() -> bytes:
    """A fresh random key for one run of horovodrun."""
    return os.urandom(32)


def parse_key(text: str, where: str) -> bytes:
    """The key written as hex digits in `text` (a Secret's file); raise ValueError naming
    `where` when it is not one."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{where}: expected hex digits (e.g. from `openssl rand -hex 32`)") \
            from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where}: expected at least {2 * MIN_KEY_BYTES} hex digits "
                         f"({MIN_KEY_BYTES} bytes), got {len(key)} bytes")
    return key


def read_key(path: str, where: str) -> bytes:
    """The key in file `path`; raise ValueError naming `where`."""
    try:
        with open(path) as f:
            return parse_key(f.read(), where)
    except OSError as e:
        raise ValueError(f"{where}: cannot read it: {e.strerror or e}") from None


def new_sender_id() -> str:
    """A random id for one process (pids repeat across hosts and runs)."""
    return os.urandom(8).hex()


def encode(key: bytes, body: dict[str, Any]) -> bytes:
    """Return the datagram carrying `body` (which must have t, s and n), tagged with `key`."""
    payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    if len(payload) + len(MAGIC) + TAG_LEN > MAX_DATAGRAM:
        raise ValueError(f"datagram of {len(payload)} bytes is over {MAX_DATAGRAM}")
    return MAGIC + hmac.new(key, payload, hashlib.sha256).digest() + payload


class Malformed(ValueError):
    """An authentic payload that is not a body of this channel: `field` names what is wrong
    ("body": the JSON itself), the message says what it holds and what is accepted."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def brief(value: Any, limit: int = 60) -> str:
    """`value`'s repr, cut to `limit` characters (a log line names a bad value, not all of it)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise ValueError(f"number {text[:20]} is not finite")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def authentic(key: bytes, data: bytes) -> bytes | None:
    """The payload of a datagram whose tag verifies under `key`, else None."""
    if len(data) <= len(MAGIC) + TAG_LEN or not data.startswith(MAGIC):
        return None
    tag, payload = data[len(MAGIC):len(MAGIC) + TAG_LEN], data[len(MAGIC) + TAG_LEN:]
    if not hmac.compare_digest(tag, hmac.new(key, payload, hashlib.sha256).digest()):
        return None
    return payload


def parse(payload: bytes) -> dict[str, Any]:
    """The body of an authentic payload; raise Malformed unless it is a JSON object of finite
    numbers with a known "t", a string "s" and an integer "n" >= 0."""
    try:
        body = json.loads(payload, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise Malformed("body", "nested deeper than this interpreter parses") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
        raise Malformed("body", f"not JSON of finite numbers: {str(e)[:80]}") from None
    if not isinstance(body, dict):
        raise Malformed("body", f"a JSON {type(body).__name__}, expected an object")
    kind, sender, seq = body.get("t"), body.get("s"), body.get("n")
    if not isinstance(kind, str) or kind not in TYPES:
        raise Malformed("t", f"{brief(kind)}, expected one of {', '.join(sorted(TYPES))}")
    if not isinstance(sender, str) or not 0 < len(sender) <= MAX_SENDER:
        raise Malformed("s", f"{brief(sender)}, expected a string of 1 to {MAX_SENDER} "
                        "characters")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
        raise Malformed("n", f"{brief(seq)}, expected an integer 0..2^63-1")
    return body


def decode(key: bytes, data: bytes) -> dict[str, Any] | None:
    """Return the body of an authentic, well-formed datagram, else None."""
    payload = authentic(key, data)
    if payload is None:
        return None
    try:
        return parse(payload)
    except Malformed:
        return None


class Replays:
    """The last sequence number accepted per sender, for the `limit` most recent senders."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._last: OrderedDict[str, int] = OrderedDict()

    def accept(self, sender: str, seq: int) -> bool:
        """Whether a datagram (sender, seq) is new; if so, remember it."""
        last = self._last.get(sender)
        if last is not None and seq <= last:
            return False
        self._last[sender] = seq
        self._last.move_to_end(sender)
        while len(self._last) > self.limit:
            self._last.popitem(last=False)
        return True
