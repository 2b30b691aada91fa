"""PURE: the datagrams of the hook channel, shared by the supervisor and the hook.

One UDP datagram = MAGIC (4 bytes) + HMAC-SHA256 of the body under the run's key (32 bytes) +
the body, a compact JSON object. Every body has "t" (its type), "s" (the sender: a random id per
process, "supervisor" for the supervisor) and "n" (a sequence number that only grows per
sender). `decode` returns None for anything whose tag does not verify or whose body is not such
an object; `Replays` drops what is not newer than the last datagram accepted from its sender.
So a client without the key changes nothing, and a recorded datagram sent again neither.

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


def decode(key: bytes, data: bytes) -> dict[str, Any] | None:
    """Return the body of an authentic, well-formed datagram, else None."""
    if len(data) <= len(MAGIC) + TAG_LEN or not data.startswith(MAGIC):
        return None
    tag, payload = data[len(MAGIC):len(MAGIC) + TAG_LEN], data[len(MAGIC) + TAG_LEN:]
    if not hmac.compare_digest(tag, hmac.new(key, payload, hashlib.sha256).digest()):
        return None
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    if (not isinstance(body, dict) or body.get("t") not in TYPES
            or not isinstance(body.get("s"), str) or not isinstance(body.get("n"), int)
            or isinstance(body.get("n"), bool)):
        return None
    return body


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
