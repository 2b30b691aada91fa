"""The `stuck` verdict on heartbeats recorded from real CUDA training processes (issue 28's device
check): shapes/h200_stuck_work*.jsonl.gz, made by scripts/gpu_stuck_record.py on one NVIDIA
H200 (torch 2.11, CUDA 13): three processes, each with the hook's real Beater and process
watcher, train a loop of CUDA kernels with a `.item()` and an all-reduce (torch.distributed,
Gloo, timed by the hook's Progress wrapper) per step; rank 1, then rank 0, launches a kernel
that spins 32 s and waits for it in `.item()` while the others wait in the all-reduce.
work0: small kernels, ~1 ms steps; work30: thirty 8192x8192 bf16 products a step, ~140 ms.

Each datagram is folded through the supervisor's own record keeping (heartbeats.updated,
heartbeats.watched) at the time it arrived, and hang.assess judges every 0.5 s with the defaults
(SUPERVISOR_STUCK_SECONDS=auto). No GPU is needed to run these tests."""

from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor.decide.beats import Beat
from supervisor.decide.hang import HangSettings, Verdict, assess
from supervisor.heartbeats import updated, watched

S = HangSettings(silence_s=3.0, stall_s=1800.0)
SHAPES = Path(__file__).parent / "shapes"
RECORDINGS = ("h200_stuck_work0", "h200_stuck_work30")
CLK_TCK = 100  # the watcher's CPU time unit (clock ticks) on Linux
FLOOR_S = 20.0  # SUPERVISOR_STUCK_SECONDS=auto: at least 20 s (issue 28)


@dataclass(frozen=True)
class Recording:
    header: dict[str, Any]
    marks: list[dict[str, Any]]
    datagrams: list[dict[str, Any]]  # {"at": seconds since the recording started, "body": ...}

    def at(self, mark: str, rank: int) -> float:
        return next(m["at"] for m in self.marks if m["mark"] == mark and m["rank"] == rank)

    def windows(self) -> list[tuple[int, float, float]]:
        """(rank, its kernel started, it ended) for each stuck rank, in order."""
        return [(r, self.at("stuck", r), self.at("unstuck", r))
                for r in self.header["stuck_ranks"]]

    def host_of(self) -> dict[str, str]:
        return {d["body"]["s"]: d["body"]["host"] for d in self.datagrams
                if d["body"]["t"] == "hb"}


def load(name: str) -> Recording:
    with gzip.open(SHAPES / f"{name}.jsonl.gz", "rt") as f:
        lines = [json.loads(line) for line in f]
    return Recording(lines[0], [x for x in lines[1:] if "mark" in x],
                     sorted((x for x in lines[1:] if "body" in x), key=lambda x: x["at"]))


def replay(rec: Recording, start: float, end: float) -> list[tuple[float, Verdict]]:
    """The verdict every 0.5 s from `start` to `end`, from the datagrams that arrived from
    `start` on (a fold that starts there: as after a reset, which a fence brings)."""
    beats: dict[str, Beat] = {}
    hosts = {f"rank-{r}": 0.0 for r in range(rec.header["world"])}
    out, i, t = [], 0, start
    data = [d for d in rec.datagrams if d["at"] >= start]
    while t <= end:
        while i < len(data) and data[i]["at"] <= t:
            body, at = data[i]["body"], data[i]["at"]
            i += 1
            if body["t"] == "ps":
                if body["of"] in beats:
                    beats[body["of"]] = watched(beats[body["of"]], body, at)
                continue
            new = updated(beats.get(body["s"]), body, ("127.0.0.1", 4000), at)
            if new is None:
                beats.pop(body["s"], None)
            else:
                beats[body["s"]] = new
        out.append((t, assess(beats.values(), hosts, started_at=start, settings=S, now=t)))
        t += 0.5
    return out


@pytest.fixture(scope="module", params=RECORDINGS)
def rec(request: pytest.FixtureRequest) -> Recording:
    return load(request.param)


def test_the_recording_is_what_it_claims(rec: Recording) -> None:
    ready = [m for m in rec.marks if m["mark"] == "ready"]
    assert {m["gpu"] for m in ready} == {"NVIDIA H200"} and rec.header["device"] == "cuda"
    assert rec.header["rcs"] == [0, 0, 0] and len(rec.windows()) == 2
    for _, began, ended in rec.windows():
        assert ended - began == pytest.approx(rec.header["plan"]["stuck_s"], abs=1.5)


def test_a_rank_stuck_in_a_gpu_kernel_is_named_after_the_threshold(rec: Recording) -> None:
    """Each stuck rank (rank 1, then rank 0) is named, alone, 20 to 21.5 s after its kernel
    began (the auto threshold is the 20 s floor: the steps are short), with the frames where
    its main thread waits. Each window is judged from a fold that starts 8 s before it: the
    supervisor fences a rank it names, and the reset that follows starts the step statistics
    afresh (a pause across an init is no step time)."""
    for rank, began, ended in rec.windows():
        verdicts = replay(rec, began - 8.0, ended)
        named = [(t, v.stuck) for t, v in verdicts if v.stuck]
        assert named, f"rank {rank} stuck {ended - began:.0f}s in a kernel was never named"
        first, found = named[0]
        assert [k.host for _, ks in named for k in ks] == [f"rank-{rank}"] * len(named)
        assert FLOOR_S <= first - began <= FLOOR_S + 1.5
        k = found[0]
        assert k.rank == rank and k.threshold_s == FLOOR_S and k.waiting == 2
        assert k.where[0] == f"scripts/gpu_stuck_record.py:{where_spin(rec)} spin"
        assert k.where[1].endswith(" rank_main")
        assert "outside any collective, with no I/O, while 2 peer process(es) waited in a " \
               "collective" in k.detail
        assert not any(v.hung or v.busy for _, v in verdicts)


def where_spin(rec: Recording) -> int:
    """The line of `.item()` in spin() as the recording's heartbeats name it."""
    wheres = {w for d in rec.datagrams for w in d["body"].get("where") or ()
              if w.endswith(" spin")}
    assert len(wheres) == 1, wheres
    return int(next(iter(wheres)).split(":")[1].split()[0])


def test_healthy_gpu_training_is_never_stuck_nor_hung(rec: Recording) -> None:
    """Over the whole recording, one fold: nobody is named outside the stuck windows, and
    inside them only the stuck rank (or nobody: after rank 1's 32 s pause counted as a step,
    the auto threshold is 4 x 32 s for a while, so rank 0's window ends unnamed; see the
    previous test for why that pause is no step time in a job)."""
    end = max(m["at"] for m in rec.marks)
    windows = rec.windows()
    for t, v in replay(rec, 0.0, end):
        assert not v.hung and not v.busy and v.stall is None, (t, v)
        inside = [r for r, began, ended in windows if began <= t <= ended + 1.0]
        assert {k.host for k in v.stuck} <= {f"rank-{r}" for r in inside}, (t, v.stuck)


def test_a_stuck_gpu_rank_burns_a_core_and_its_position_and_io_stand_still(
        rec: Recording) -> None:
    """What the verdict relies on, as the H200 showed it: while its main thread waits in
    `.item()` for a kernel that does not finish, the process keeps heartbeating (its other
    thread runs), its position and I/O bytes do not change, and it burns a whole core (CUDA
    spin-waits: a CPU-idle heuristic cannot see this hang); its watcher says running (R)."""
    host_of = rec.host_of()
    for rank, began, ended in rec.windows():
        host = f"rank-{rank}"
        during = [d["body"] for d in rec.datagrams if began + 1 < d["at"] < ended - 1]
        beats = [b for b in during if b["t"] == "hb" and b["host"] == host]
        ps = [(d["at"], d["body"]) for d in rec.datagrams if began + 1 < d["at"] < ended - 1
              and d["body"]["t"] == "ps" and host_of.get(d["body"]["of"]) == host]
        assert len(beats) >= 2 * (ended - began - 2) * 0.9  # a heartbeat every 0.5 s
        assert len({b["pos"] for b in beats}) == 1 and len({b["io"] for b in beats}) == 1
        assert {b["in"] for b in beats} == {None}
        assert {b["state"] for _, b in ps} == {"R"}
        cores = (ps[-1][1]["cpu"] - ps[0][1]["cpu"]) / CLK_TCK / (ps[-1][0] - ps[0][0])
        assert cores >= 0.9
        peers = [b for b in during if b["t"] == "hb" and b["host"] != host]
        assert {b["in"] for b in peers} == {"c"}


def test_a_healthy_gpu_loop_moves_its_position_through_its_locals(rec: Recording) -> None:
    """A healthy CUDA loop sits at its `.item()` most of the time, so its file and line alone
    repeat (with ~140 ms steps: one line in every heartbeat); the position the hook sends also
    digests the frame's local variables, and that moves from one heartbeat to the next."""
    _, first, _ = rec.windows()[0]
    beats = [d["body"] for d in rec.datagrams if first - 15 < d["at"] < first - 1
             and d["body"]["t"] == "hb" and d["body"]["host"] == "rank-2"]
    lines = {b["pos"].rsplit(":", 2)[0] for b in beats}
    moved = sum(a["pos"] != b["pos"] for a, b in itertools.pairwise(beats))
    assert len(beats) >= 25 and len(lines) < len(beats) / 2
    assert moved >= 0.9 * (len(beats) - 1)
    if rec.header["work"]:
        assert len(lines) == 1


def test_the_hook_costs_under_one_percent(rec: Recording) -> None:
    """Measured in each CUDA process: the wrapper around a collective (the training thread)
    against the median step, and one heartbeat's body (the heartbeat thread, twice a second)
    against a core."""
    ready = {m["rank"]: m for m in rec.marks if m["mark"] == "ready"}
    ends = {m["rank"]: m for m in rec.marks if m["mark"] == "end"}
    for rank, m in ready.items():
        assert m["wrapper_s"] / ends[rank]["step_p50_s"] <= 0.01
        assert m["heartbeat_s"] * 2 <= 0.01
