"""PURE: what an authentic datagram of the hook says, as the channel records it: whether its
source may speak for what it names (`bound`), a process's record after a heartbeat, a bye or its
watcher's report (`updated`, `watched`), and the driver's after its report (`driver_after`).

No socket, clock or thread: the channel (channel.py) hands in the body, the source address and
the receipt time, and keeps what these return. A field that is not what the hook sends was
refused before (supervisor.datagrams); what is left here is read defensively all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from supervisor.decide.beats import WARMUP_GAPS, Beat, Driver, is_loopback
from supervisor.hook.elastic_supervisor_hook import unfenced_framework

GAPS = 64  # progress intervals kept per process (the step time, hang.stuck_threshold)


def bound(body: Mapping[str, Any], source: str, beats: Mapping[str, Beat],
           addresses: Mapping[str, str]) -> bool:
    """PURE: whether an authentic datagram from `source` may speak for what it names, so a
    holder of the key cannot get another worker declared dead: the driver's reports come from
    the launcher itself (loopback); a process's datagrams from the address of its first, and
    that from its host's pod IP (`addresses`). Loopback is this pod: trusted."""
    if is_loopback(source):
        return True
    kind = body.get("t")
    if kind == "driver":
        return False
    sender, host = body.get("of") if kind == "ps" else body.get("s"), body.get("host")
    first = beats.get(sender) if isinstance(sender, str) else None
    if first is not None:
        return first.source[0] == source
    return kind != "ps" and isinstance(host, str) and addresses.get(host) == source


def driver_after(old: Driver | None, body: Mapping[str, Any], now: float) -> Driver:
    """PURE: the driver's record after one of its datagrams."""
    seq = _int(body.get("wseq"))
    same = old is not None and old.world_seq == seq
    world = old.world if same and old is not None else frozenset(
        str(h) for h in body.get("world") or ())
    before = old.exited if old is not None else {}
    raw = body.get("exited")
    exited = dict(before)
    for host, code in (raw.items() if isinstance(raw, dict) else ()):
        if isinstance(host, str) and host not in exited:
            exited[host] = (_int(code, 1), now)
    return Driver(bool(body.get("ok")), now, tuple(map(str, body.get("problems") or ())),
                  world, seq, old.world_at if same and old is not None else now, exited,
                  isinstance(body.get("short"), dict))


def watched(b: Beat, body: Mapping[str, Any], now: float) -> Beat:
    """PURE: a process's record after its watcher's datagram."""
    state = body.get("state")
    cpu = body.get("cpu") if isinstance(body.get("cpu"), int) else None
    grew = cpu is not None and (b.proc_cpu is None or cpu > b.proc_cpu)
    return replace(b, proc_state=str(state) if isinstance(state, str) else None,
                   proc_seen=now, proc_cpu=cpu,
                   proc_cpu_at=now if grew and b.proc_cpu is not None else b.proc_cpu_at)


def _problems(said: Any) -> dict[str, Any]:
    """The problems a heartbeat reports: the one that names a framework the hook does not fence
    apart (`unfenced`: the hook's own wording, parsed here at the edge), the others as said."""
    texts = tuple(str(p) for p in said or ())
    unfenced = next((f for p in texts if (f := unfenced_framework(p)) is not None), None)
    return {"problems": tuple(p for p in texts if unfenced_framework(p) is None),
            "unfenced": unfenced}


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _seconds(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _rtts(v: Any) -> tuple[tuple[str, float], ...]:
    """The hook's {address: milliseconds} as ((address, seconds), ...)."""
    if not isinstance(v, dict):
        return ()
    return tuple(sorted((str(a), s / 1000) for a, raw in v.items()
                        if (s := _seconds(raw)) is not None))


def updated(old: Beat | None, body: Mapping[str, Any], addr: tuple[str, int],
            now: float) -> Beat | None:
    """PURE: the process's record after one authentic datagram of the current run."""
    if body["t"] == "bye":
        return None if old is None else replace(old, bye_at=now, last_seen=now, wait_s=None,
                                                waiting=None)
    if body["t"] != "hb" or not isinstance(body.get("host"), str):
        return old
    done = _int(body.get("done"))
    wait = body.get("wait")
    fields = dict(
        host=body["host"], pid=_int(body.get("pid")), local_rank=_int(body.get("lr")),
        rank=body.get("rank") if isinstance(body.get("rank"), int) else None,
        size=body.get("size") if isinstance(body.get("size"), int) else None,
        inits=_int(body.get("inits")), done=done,
        wait_s=float(wait) if isinstance(wait, int | float) else None,
        waiting=body.get("in") if body.get("in") in ("c", "i") else None,
        addrs=tuple(str(a) for a in body.get("addrs") or ()),
        ports=tuple(p for p in body.get("ports") or () if isinstance(p, int)),
        **_problems(body.get("problems")),
        last_seen=now, source=(addr[0], int(addr[1])),
        since_init=body["dc"] if isinstance(body.get("dc"), int) else None,
        steps=_count(body.get("st")), commits=_count(body.get("cm")),
        redone=_count(body.get("rd")),
        trained_s=_seconds(body.get("tr")), step_out_s=_seconds(body.get("so")),
        step_wait_s=_seconds(body.get("sw")), step_n=_int(body.get("sn")),
        link_rtt=_rtts(body.get("rt")),
        pos=str(body.get("pos") or ""), io=body["io"] if isinstance(body.get("io"), int) else None,
        where=tuple(str(w) for w in body.get("where") or ())[:8])
    if old is None:
        return Beat(sender=str(body["s"]), first_seen=now, progress_at=None,
                    still_since=now if fields["pos"] else None, **fields)
    progress = now if done != old.done else old.progress_at
    gaps, warmup = old.gaps, old.warmup
    if fields["inits"] != old.inits:
        warmup = WARMUP_GAPS
    elif done != old.done and old.progress_at is not None:
        if warmup:
            warmup -= 1
        else:
            # A step's time; not a pause that spans a reset (an init: a fault, a worker
            # joining), nor the new world's first intervals, which would make the stuck
            # threshold half a minute or more right after every recovery.
            gaps = (*old.gaps[-(GAPS - 1):], now - old.progress_at)
    moved = (fields["pos"], fields["io"], done, fields["waiting"]) != (
        old.pos, old.io, old.done, old.waiting)
    still = None if not fields["pos"] else (
        now if moved or old.still_since is None else old.still_since)
    return replace(old, progress_at=progress, bye_at=None, gaps=gaps, warmup=warmup,
                   still_since=still, **fields)
