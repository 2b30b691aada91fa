"""The driver hook's join gate on Horovod's real ElasticDriver (no horovodrun, no sockets used).

Horovod 0.28.1's driver, worker registry and host manager run as they are, patched the way
horovodrun's process patches them (DriverHook.patch_driver, on a subclass so that the real class
stays untouched). The parts that talk to the network are played in this process: the
rendezvous store is the real RendezvousHTTPServer's (bound, never served); a survivor asking for
its rank in the next world is Horovod's own handler method in a thread (what a GET
/rank_and_size runs); a worker process is a thread standing for its ssh session, which runs
until the test ends it or the driver kills it (its host's event, the job's shutdown). As in the
real C++, and unlike upstream's unit tests, a new worker does not ask for its rank on its first
init: it publishes /global/<rank> in the store, and that is all the driver sees of it.

The scenario (section 3 of the research notes): hosts a, b, c train; c dies; the driver assigns
a, b, d and starts d; a and b ask for their rank and are held until d is in the rendezvous.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from horovod.runner.elastic import driver as horovod_driver
from horovod.runner.elastic.constants import RESET_LIMIT_EXCEEDED_MESSAGE
from horovod.runner.elastic.discovery import FixedHosts, HostManager
from horovod.runner.elastic.registration import WorkerStateRegistry
from horovod.runner.elastic.rendezvous import create_rendezvous_handler
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

from supervisor.hook.elastic_supervisor_hook import JOIN_TIMEOUT_ENV, DriverHook, join_timeout
from supervisor.hook.elastic_supervisor_hook import driver as hook_driver
from tests.helpers import wait_for

HELD_S = 0.15  # how long a held survivor is watched staying held


class Proc:
    """One worker process as the driver sees it (its ssh session): it runs until ended by the
    test, or killed through one of its events (the job's shutdown, its host's blacklisting)."""

    def __init__(self, slot: Any, events: list[threading.Event]) -> None:
        self.slot, self.events = slot, events
        self.code: int | None = None
        self.woken = threading.Event()
        self.done = threading.Event()

    def run(self) -> tuple[int, float]:
        while self.code is None and not any(e.is_set() for e in self.events):
            self.woken.wait(0.005)
        self.done.set()
        return (255 if self.code is None else self.code), time.time()

    def exit(self, code: int) -> None:
        self.code = code
        self.woken.set()


class Ask(threading.Thread):
    """A survivor's GET /rank_and_size/<host>:0, run by Horovod's own handler method."""

    def __init__(self, job: Job, host: str) -> None:
        super().__init__(daemon=True)
        self.job, self.host = job, host
        self.answer: tuple[int, int] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            raw = self.job.handler._get_rank_and_size(None, self.host, 0)
            rank, size = raw.decode().split(",")[:2]
            self.answer = (int(rank), int(size))
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 2.0) -> tuple[int, int] | None:
        self.join(timeout)
        assert not self.is_alive(), f"{self.host} is still held"
        assert self.error is None, f"the held request failed: {self.error!r}"
        return self.answer


class Job:
    """One driver of the patched class with fake hosts (1 slot each) and fake processes."""

    def __init__(self, cls: type, hosts: list[str], *, min_np: int = 2, max_np: int = 3,
                 reset_limit: int | None = None) -> None:
        self.discovery = FixedHosts({h: 1 for h in hosts})
        self.httpd = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
        rendezvous = types.SimpleNamespace(_httpd=self.httpd, init=self.httpd.init,
                                           stop=lambda: None)
        self.driver = cls(rendezvous, self.discovery, min_num_proc=min_np, max_num_proc=max_np,
                          reset_limit=reset_limit)
        self.handler = create_rendezvous_handler(self.driver)
        self.procs: list[Proc] = []

    def create_worker(self, slot: Any, events: list[threading.Event]) -> tuple[int, float]:
        p = Proc(slot, events)
        self.procs.append(p)
        return p.run()

    def start(self, np: int) -> None:
        self.driver.wait_for_available_slots(np)
        self.driver.start(np, self.create_worker)

    def proc(self, host: str) -> Proc:
        """The last process started on `host` (waits for it)."""
        return wait_for(lambda: [p for p in self.procs if p.slot.hostname == host], 2,
                        interval=0.005, what=f"a process on {host}")[-1]

    def list(self, hosts: list[str]) -> None:
        """Rewrite the discovery and wait until the driver has read it."""
        self.discovery.set({h: 1 for h in hosts})
        wait_for(lambda: set(self.driver._host_manager.current_hosts.host_slots) == set(hosts),
                 2, interval=0.005, what=f"the driver to see {hosts}")

    def publish(self, rank: int) -> None:
        """A new worker reached its Gloo rendezvous: its address under /global/<rank>."""
        with self.httpd.cache_lock:
            self.httpd.cache.setdefault("global", {})[str(rank)] = b"address"

    def world(self) -> list[str]:
        return sorted(self.driver.host_assignments)

    def answered(self, *asks: Ask) -> list[int]:
        """The sizes the survivors were told, each checked against its rank in the world the
        driver assigned (the hosts' order in it is the discovery's: a set's)."""
        sizes = []
        for ask in asks:
            got = ask.result()
            slot = self.driver.get_slot_info(ask.host, 0)
            assert got == (slot.rank, slot.size), ask.host
            sizes.append(slot.size)
        return sizes

    def finish(self) -> Any:
        """End every running process with 0; the driver must stop and every worker thread end
        (none left waiting in a barrier of a discarded round)."""
        for p in self.procs:
            if not p.done.is_set():
                p.exit(0)
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(self.driver.get_results()), daemon=True)
        t.start()
        t.join(3)
        assert not t.is_alive(), "a worker thread never ended (an orphaned barrier?)"
        assert self.driver.finished()
        self.driver.stop()
        return out[0]

    def close(self) -> None:
        if not self.driver.finished():
            self.driver.stop()
        for p in self.procs:
            p.exit(1)
        self.httpd.server_close()


@pytest.fixture
def patched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(the patched ElasticDriver subclass factory, the hook's hellos, the dead file)."""
    monkeypatch.setattr(horovod_driver, "DISCOVER_HOSTS_FREQUENCY_SECS", 0.005)
    monkeypatch.setattr(hook_driver, "JOIN_POLL_S", 0.01)
    said: list[dict[str, Any]] = []
    jobs: list[Job] = []

    def make(hosts: list[str], *, join_timeout_s: float = 30.0, **kw: Any) -> Job:
        module = types.ModuleType("driver")
        module.ElasticDriver = type(  # type: ignore[attr-defined]
            "ElasticDriver", (horovod_driver.ElasticDriver,), {})
        module.WorkerStateRegistry = WorkerStateRegistry  # type: ignore[attr-defined]
        module.HostManager = HostManager  # type: ignore[attr-defined]
        # what the hook's discover_unlocked takes from Horovod's driver module
        module.HostUpdateResult = horovod_driver.HostUpdateResult  # type: ignore[attr-defined]
        module.DISCOVER_HOSTS_FREQUENCY_SECS = (  # type: ignore[attr-defined]
            horovod_driver.DISCOVER_HOSTS_FREQUENCY_SECS)
        hook = DriverHook(b"k" * 32, 9, "0", str(tmp_path / "dead.json"), str(join_timeout_s))
        hook.say = lambda kind, fields: said.append(fields)  # type: ignore[method-assign]
        hook.patch_driver(module)
        job = Job(module.ElasticDriver, hosts, **kw)  # type: ignore[attr-defined]
        jobs.append(job)
        return job

    yield make, said, tmp_path / "dead.json"
    for j in jobs:
        j.close()


def replacement_joining(job: Job) -> tuple[Ask, Ask, Proc]:
    """a, b, c train; c dies and d is listed; a and b reset: the driver starts d, and a and b
    are held (d has not published its address)."""
    job.start(3)
    job.proc("c").exit(1)
    job.list(["a", "b", "d"])
    asks = Ask(job, "a"), Ask(job, "b")
    d = job.proc("d")
    time.sleep(HELD_S)
    assert [a.is_alive() for a in asks] == [True, True], "held while d joins"
    assert job.world() == ["a", "b", "d"]
    return asks[0], asks[1], d


# ---- the pending worker is lost: the survivors get a world without it ---------------------------

@pytest.mark.parametrize(("lose", "timeout_s", "why"), [
    pytest.param("exit", 30.0, "d: its worker exited (exit code 137) before it joined",
                 id="its process exits"),
    pytest.param("dead", 30.0, "d: the supervisor declared it dead",
                 id="the supervisor declares its host dead"),
    pytest.param("late", 0.3, "d: its new worker did not reach the rendezvous within 0.3 s",
                 id="it is not in the rendezvous within the join timeout"),
])
def test_survivors_held_for_a_lost_new_worker_get_the_world_without_it(
        patched: Any, capsys: pytest.CaptureFixture[str], lose: str, timeout_s: float,
        why: str) -> None:
    make, said, dead_file = patched
    job = make(["a", "b", "c"], join_timeout_s=timeout_s)
    a, b, d = replacement_joining(job)
    if lose == "exit":
        d.exit(137)
    elif lose == "dead":
        dead_file.write_text('["d"]')

    assert job.answered(a, b) == [2, 2]
    assert job.world() == ["a", "b"]
    assert said[-1]["world"] == ["a", "b"], "the new world is reported"
    assert d.done.wait(1), "d's ssh session is ended (its host blacklisted)"
    stderr = capsys.readouterr().err
    assert f"elastic-supervisor hook: re-planning the world without d: {why}\n" in stderr
    assert stderr.count("re-planning") == 1
    if lose == "exit":
        assert said[-1]["exited"] == {"c": 1, "d": 137}, "d's exit is reported all the same"
    res = job.finish()
    assert res.error_message is None
    assert {k: v[0] for k, v in res.worker_results.items()} == {"a[0]": 0, "b[0]": 0}


def test_a_new_worker_that_arrives_releases_the_survivors_at_once(patched: Any,
                                                                  capsys: Any) -> None:
    make, _, _ = patched
    job = make(["a", "b", "c"])
    a, b, _ = replacement_joining(job)
    job.publish(2)
    assert job.answered(a, b) == [3, 3], "released within answered()'s 2 s, not the 30 s timeout"
    assert "re-planning" not in capsys.readouterr().err
    res = job.finish()
    assert {k: v[0] for k, v in res.worker_results.items()} == {"a[0]": 0, "b[0]": 0, "d[0]": 0}


def test_a_reset_that_starts_nobody_is_not_gated(patched: Any) -> None:
    make, _, _ = patched
    job = make(["a", "b", "c"])
    job.start(3)
    job.proc("c").exit(1)
    job.list(["a", "b"])
    a, b = Ask(job, "a"), Ask(job, "b")
    assert job.answered(a, b) == [2, 2]
    job.finish()


def test_a_driver_that_waits_for_hosts_says_so_and_what_it_has(patched: Any,
                                                                capsys: Any) -> None:
    """After a round, fewer listed slots than --min-np (b failed: blacklisted by Horovod):
    the driver waits in wait_for_available_slots with a held in hvd.init, and its hook says so
    (the supervisor then lists a new host at once) until a new host lets it assign."""
    make, said, _ = patched
    job = make(["a", "b"], min_np=2)
    job.start(2)
    assert all(h["short"] is None for h in said), "enough hosts at the start: no wait said"
    job.proc("b").exit(1)
    a = Ask(job, "a")
    short = {"need": 2, "slots": 1, "listed": ["a", "b"], "blacklisted": ["b"]}
    wait_for(lambda: said and said[-1]["short"] == short, 2, interval=0.005,
             what=f"the wait said: {said[-1:]}")
    assert a.is_alive(), "a waits for the next world"
    assert ("the driver waits for 2 slot(s) to assign the next world: 1 available; listed "
            "['a', 'b'], blacklisted by Horovod ['b']") in capsys.readouterr().err
    job.list(["a", "c"])
    wait_for(lambda: said[-1]["short"] is None and said[-1]["world"] == ["a", "c"], 2,
             interval=0.005, what=f"the wait's end said: {said[-1:]}")
    job.proc("c")
    job.publish(1)
    assert job.answered(a) == [2]
    job.finish()


def test_a_lost_replacement_is_replaced_by_the_next_listed_host(patched: Any,
                                                                capsys: Any) -> None:
    make, said, _ = patched
    job = make(["a", "b", "c"])
    a, b, d = replacement_joining(job)
    job.list(["a", "b", "d", "e"])  # e waits: max-np 3
    d.exit(255)
    e = job.proc("e")
    time.sleep(HELD_S)
    assert a.is_alive() and b.is_alive(), "held again, now for e"
    assert job.world() == ["a", "b", "e"] and said[-1]["world"] == ["a", "b", "e"]
    job.publish(2)
    assert job.answered(a, b) == [3, 3]
    assert not e.done.is_set()
    assert capsys.readouterr().err.count("re-planning the world without d: ") == 1
    job.finish()


def test_a_survivor_lost_while_held_is_dropped_with_the_new_workers_of_that_world(
        patched: Any, capsys: Any) -> None:
    make, _, _ = patched
    job = make(["a", "b", "c"], min_np=1)
    a, b, d = replacement_joining(job)
    job.proc("b").exit(137)
    assert a.result() == (0, 1)
    assert b.result() == (-1, -1), "b's request (if its process still read it) is refused"
    assert d.done.wait(1), "d is inside the discarded world's rendezvous: ended too"
    assert job.world() == ["a"]
    assert ("re-planning the world without b, d: b: its worker exited (exit code 137) while it "
            "was held; d: started for that world") in capsys.readouterr().err
    job.finish()


def test_the_reset_limit_stops_the_job_instead_of_re_planning(patched: Any,
                                                              capsys: Any) -> None:
    make, _, _ = patched
    job = make(["a", "b", "c"], reset_limit=1)
    a, b, d = replacement_joining(job)  # that reset was the first
    d.exit(137)
    a.result(), b.result()  # released, never failed
    assert job.driver.finished()
    assert "the reset limit (1) is reached: stopping the job" in capsys.readouterr().err
    res = job.finish()
    assert res.error_message == RESET_LIMIT_EXCEEDED_MESSAGE.format(1)


# ---- the hook's settings and its report of exits -------------------------------------------------

@pytest.mark.parametrize(("value", "seconds", "problem"), [
    pytest.param(None, 120.0, "", id="unset: the default"),
    pytest.param("45", 45.0, "", id="a number of seconds"),
    pytest.param("0", 120.0, "is not a number of seconds > 0", id="zero is refused"),
    pytest.param("2m", 120.0, "is not a number of seconds > 0", id="a unit is refused"),
    pytest.param("inf", 120.0, "is not a number of seconds > 0", id="infinity is refused"),
])
def test_the_join_timeout_setting(value: str | None, seconds: float, problem: str) -> None:
    got, why = join_timeout(value)
    assert got == seconds and problem in why and bool(why) is bool(problem)
    if problem:
        hook = DriverHook(b"k" * 32, 9, "0", None, value)
        assert any(p.startswith(f"{JOIN_TIMEOUT_ENV}=") for p in hook.problems())


def test_an_exit_is_reported_before_horovod_handles_it() -> None:
    """Horovod's handling of a failed worker blocks until its round completes (a replacement
    killed while it joins: never, unpatched): the report must not wait for it."""
    got: list[tuple[str, int, int]] = []
    seen: list[list[tuple[str, int, int]]] = []

    class Driver:
        def has_rank_assignment(self, host: str, slot: int) -> bool:
            return True

        def _handle_worker_exit(self, slot_info: Any, exit_code: int, timestamp: float) -> None:
            seen.append(list(got))

    module = types.ModuleType("driver")
    module.ElasticDriver = Driver  # type: ignore[attr-defined]
    hook_driver.report_exits(module, lambda h, r, c: got.append((h, r, c)))
    Driver()._handle_worker_exit(types.SimpleNamespace(hostname="d", local_rank=0), 137, 0.0)
    assert seen == [[("d", 0, 137)]]
