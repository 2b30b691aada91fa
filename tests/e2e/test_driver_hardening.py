"""The hang in horovodrun's driver (notes: "A SECOND HANG"), with real horovodrun and the hook.

Three workers train the stock script on fake hosts; then what happened in the field: rank 0 (the
coordinator, the only worker the driver notifies of host changes) freezes, or its host is
partitioned; the supervisor's part is played by the test: it kills horovodrun's ssh client to
that host and rewrites the discovery file (the dead host out, a replacement in). Horovod's
driver then notifies the coordinator of the change from its discovery thread, holding the
host-update lock. Unhardened, that call never returns (the frozen process's kernel accepts the
connection, nobody answers; a partitioned host never answers a SYN), and when the survivors come
back from the Gloo timeout the driver cannot take the lock to regroup them: the job hangs for
good. With the hook the call gives up after its timeouts (or is skipped: the host was declared
dead), and training resumes at full size with the replacement. `TestHardenedDriver` is a tour:
one hardened horovodrun whose coordinator hangs three times, each time in another way, each
time replaced by a fresh host.

The survivors leave the frozen collective through the Gloo timeout here (10 s; the worker half
of the hook is off), so the driver alone is what is tested.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from supervisor import hostkeys
from supervisor.hook.elastic_supervisor_hook import KNOWN_HOSTS_ENV
from supervisor.proc import kill_ssh_clients
from tests.e2e.fakehosts import (
    Channel,
    HorovodRun,
    HostSet,
    tour_on_fake_hosts,
    training_at_size_3,
)
from tests.e2e.jobs import TOUR_SLEEP
from tests.faults import freeze, kill, partitioned
from tests.helpers import wait_for

GLOO_TIMEOUT_S = 10
BATCHES = 100_000  # a bound: training ends through the stop file once it resumed
# Gloo timeout + the driver's notification (at most 3 attempts x 2 s) + the replacement's start
# (ssh, Python, torch, hvd.init: 5-10 s on 2 loaded cores) + the reset.
RESUME_BOUND_S = GLOO_TIMEOUT_S + 6 + 25


def training(tmp_path: Path, hosts: HostSet, runs: list[HorovodRun],
             channel: Channel | None) -> tuple[HorovodRun, list[str]]:
    """Three workers at full size past batch 10, and a fourth host for the replacement."""
    addresses = hosts.start(4)
    run = training_at_size_3(tmp_path, hosts, runs, addresses[:3], batches=BATCHES,
                             timeout=120, channel=channel, worker_hook=False,
                             gloo_timeout_s=GLOO_TIMEOUT_S)
    return run, addresses


def fail_coordinator(run: HorovodRun, listed: list[str], spare: str, *,
                     declare: bool) -> tuple[str, float]:
    """What the supervisor does about a dead coordinator: (declare it dead,) kill its ssh
    client, replace it in the discovery file by `spare`. Returns its address and when."""
    coordinator = run.last_step()["host"]  # type: ignore[index]
    if declare:
        run.declare_dead([coordinator])
    assert run.proc is not None
    assert kill_ssh_clients(run.proc.pid, {coordinator}), "its ssh client was found and killed"
    survivors = [a for a in listed if a != coordinator]
    at = time.time()
    listed[:] = [*survivors, spare]
    run.set_hosts(listed)
    return coordinator, at


def resumed_at_full_size(run: HorovodRun, after: float) -> float | None:
    """When rank 0 reported the first step at size 3 after a reset that came after `after`."""
    records = run.records()
    for i, r in enumerate(records):
        if r.get("event") == "reset" and r["time"] > after and r["size"] == 3:
            later = [s for s in records[i:] if "loss" in s]
            return later[0]["time"] if later else None
    return None


class Tour:
    """One hardened horovodrun on fake hosts, hurt again and again by TestHardenedDriver."""

    def __init__(self, tmp_path: Path, hosts: HostSet, runs: list[HorovodRun], channel: Channel,
                 stack: ExitStack) -> None:
        self.hosts, self.channel, self.stack = hosts, channel, stack
        self.run, addresses = training(tmp_path, hosts, runs, self.channel)
        self.listed = addresses[:3]


@pytest.fixture(scope="class")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    yield from tour_on_fake_hosts(tmp_path_factory, "driver-tour", Tour)


@pytest.mark.tour
class TestHardenedDriver:
    """The coordinator hangs three times in a row, each time in another way; each time the
    hardened driver gives up on it and training resumes at full size with a fresh host."""

    @pytest.mark.parametrize(("fault", "declare"), [
        pytest.param("frozen", False, id="frozen coordinator: its notification times out"),
        pytest.param("frozen", True, id="frozen coordinator declared dead: not notified at all"),
        pytest.param("partitioned", False, id="partitioned coordinator: the connect times out"),
    ])
    def test_the_hardened_driver_resumes_after_its_coordinator_hangs(
            self, tour: Tour, fault: str, declare: bool) -> None:
        run, hosts = tour.run, tour.hosts
        assert tour.channel.of("driver") and tour.channel.of("driver")[0]["ok"], "armed"
        coordinator = run.last_step()["host"]  # type: ignore[index]
        victims = [p.pid for p in hosts.training(coordinator)]
        assert victims, f"no training process on {coordinator}"
        [spare] = hosts.start(1)
        with ExitStack() as stack:
            stack.callback(kill, victims)  # orphaned once their ssh client is killed
            if fault == "frozen":
                freeze(victims)
            else:
                stack.enter_context(partitioned(victims, coordinator))
            _, at = fail_coordinator(run, tour.listed, spare, declare=declare)
            back = wait_for(lambda: resumed_at_full_size(run, at), RESUME_BOUND_S + 30,
                            what=f"training resumed at size 3:\n{run.tail()}")

        assert back - at <= RESUME_BOUND_S, f"resumed {back - at:.1f}s after the fault"
        skipped = f"not notifying {coordinator}[0]: the supervisor declared its host dead"
        assert (skipped in run.output()) is declare, run.tail()
        assert coordinator not in {s["host"] for s in run.steps() if s["time"] > back}
        assert run.proc is not None and run.proc.poll() is None, run.tail()

    def test_the_tour_ends_at_full_size_through_the_stop_file(self, tour: Tour) -> None:
        target = tour.run.stop_at()
        assert tour.run.wait(120) == 0, tour.run.tail()
        steps = tour.run.steps()
        assert steps[-1]["step"] == target and steps[-1]["size"] == 3


def test_each_host_is_pinned_to_its_own_key_and_no_host_answers_for_another(
        tmp_path: Path, fake_hosts: tuple[HostSet, list[HorovodRun]]) -> None:
    """SUPERVISOR_SSH_HOST_KEYS=worker as the supervisor does it (supervisor/hostkeys.py):
    every host shows a key of its own, and the known_hosts file the driver's ssh checks
    strictly (ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS) pins each listed address to its host's key
    (hostkeys.known_hosts, `[address]:port` as horovodrun -p connects). An impostor at a listed
    address that shows another host's key, a valid key of the job, gets no training process; a
    host with its own key joins."""
    hosts, runs = fake_hosts

    def made(name: str) -> tuple[hostkeys.HostKey, Path]:
        key = hostkeys.generate(name)
        path = tmp_path / f"{name}.key"
        path.write_text(key.private)
        path.chmod(0o600)
        return key, path

    known = tmp_path / "hostfile.known_hosts"

    def pin(by_host: dict[str, hostkeys.HostKey]) -> None:
        text, missing = hostkeys.known_hosts(
            {h: {"metadata": {"annotations": {hostkeys.ANNOTATION: k.public}}}
             for h, k in by_host.items()}, hosts.port)
        assert not missing and text.count("\n") == len(by_host)
        known.write_text(text)

    (key_a, path_a), (key_b, _), (key_c, path_c) = made("a"), made("b"), made("c")
    [first] = hosts.start(1, host_key=path_a)
    pin({first: key_a})
    channel = Channel()
    try:
        run = HorovodRun(tmp_path, hosts, np=1, min_np=1, max_np=2, batches=BATCHES,
                         channel=channel, worker_hook=False, script_args=["--sleep", TOUR_SLEEP])
        run.env[KNOWN_HOSTS_ENV] = str(known)
        runs.append(run)
        run.set_hosts([first])
        run.start()
        wait_for(lambda: (s := run.last_step()) and s["step"] > 10, 120,
                 what=f"training on the first host:\n{run.tail()}")
        [impostor] = hosts.start(1, host_key=path_a)  # the first host's key, at its own address
        pin({first: key_a, impostor: key_b})
        run.set_hosts([first, impostor])
        wait_for(lambda: "Host key verification failed" in run.output(), 60,
                 what=f"the impostor refused:\n{run.tail()}")
        [joined] = hosts.start(1, host_key=path_c)
        pin({first: key_a, joined: key_c})
        run.set_hosts([first, joined])
        wait_for(lambda: (s := run.last_step()) and s["size"] == 2, 120,
                 what=f"training at size 2 with the second host:\n{run.tail()}")
        assert not hosts.training(impostor), "the impostor never ran a training process"
        assert impostor not in {s["host"] for s in run.steps()}
        assert hosts.training(joined), "the host with its own key did"
        target = run.stop_at()
        assert run.wait(120) == 0, run.tail()
        assert run.steps()[-1]["step"] == target
    finally:
        channel.close()


def test_without_the_hook_the_driver_hangs_for_good(
        tmp_path: Path, fake_hosts: tuple[HostSet, list[HorovodRun]]) -> None:
    """The same fault under an unmodified horovodrun: what the hook is for (and proof that the
    test above can fail)."""
    hosts, runs = fake_hosts
    run, addresses = training(tmp_path, hosts, runs, channel=None)
    victims = [p.pid for p in hosts.training(run.last_step()["host"])]  # type: ignore[index]
    try:
        freeze(victims)
        _, at = fail_coordinator(run, addresses[:3], addresses[3], declare=False)
        time.sleep(RESUME_BOUND_S)  # the hardened driver is back at full size by then
        assert run.proc is not None and run.proc.poll() is None, "horovodrun still runs"
        assert resumed_at_full_size(run, at) is None, "and never regrouped"
        assert not [s for s in run.steps() if s["time"] > at + GLOO_TIMEOUT_S + 1], run.tail()
    finally:
        kill(victims)  # orphaned once their ssh client is killed
