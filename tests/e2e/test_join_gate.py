"""A replacement lost while it joins, with real horovodrun and the driver hook's join gate.

Three workers train the stock script (no checkpoint) on fake hosts; a fourth host is listed as
a spare (max-np 3 keeps it out of the world, so that the driver assigns it in the very reset
that follows the fault, not in a later scale-out). One worker is SIGKILLed and, as the
supervisor would, its ssh client killed and its host unlisted: the two survivors reset, the
driver assigns them and the spare and starts the spare's worker, which is lost as soon as it
appears, long before it reaches its Gloo rendezvous: SIGKILLed (its ssh client killed and its
host unlisted, as the supervisor would), or frozen (nobody notices: the join timeout does).
Stock Horovod 0.28.1 has handed the survivors the world of three already: they wait in Gloo for
the lost one until the Gloo timeout and abort (std::terminate), and horovodrun fails, taking all
progress with it. With the gate the survivors are still held at the driver, which assigns the
world again without the lost host: they resume at size 2 in the same horovodrun, from their
last commit, long before the Gloo timeout. A fresh host listed then joins them at once (the gate
opens when a new worker really arrives), and training ends at size 3 through the stop file.

The killed case runs again with the seeds' TensorFlow script (tests/e2e/stock_tf_train.py, in
the TensorFlow environment): a fault in the middle of a TensorFlow regroup, no checkpoint.

The first reset is quick too: each survivor leaving the failed world cuts that world's
connections (the hook's `fence.left_world`). Without that, one survivor's Horovod thread waited
in the next step's negotiation for the other, which waited to receive from it in the failed
collective, until the Gloo timeout (2 runs in 3).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.proc import kill_ssh_clients
from tests.e2e.fakehosts import (
    STOCK_TF,
    TF_PYTHON,
    Channel,
    HorovodRun,
    HostSet,
    training_at_size_3,
)
from tests.e2e.jobs import check_steps, step_after_reset
from tests.faults import freeze, kill
from tests.helpers import wait_for

GLOO_TIMEOUT_S = 30  # with the gate, far from it (held survivors are not in Gloo yet)
BASELINE_GLOO_TIMEOUT_S = 10  # the unpatched run only has to show the abort
# ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S: short, for the frozen replacement, yet long enough for
# a healthy worker's start on 2 loaded cores (ssh, Python, torch, hvd.init: 5-10 s).
JOIN_TIMEOUT_S = 20
BATCHES = 100_000  # a bound: training ends through the stop file
RESUME_BOUND_S = 20  # from the replacement's loss (or the join timeout) to a step at size 2
FIRST_RESET_BOUND_S = 10  # from the kill to the spare's worker started (0.8-1.1 s measured)
SCALE_OUT_BOUND_S = 60  # from listing a fresh host to a step at size 3 (2 loaded cores)


def training(tmp_path: Path, hosts: HostSet, runs: list[HorovodRun], channel: Channel | None,
             gloo_timeout_s: int, *, env: dict[str, str] | None = None, **kw: Any,
             ) -> tuple[HorovodRun, list[str]]:
    """Three workers at full size past batch 10, a fourth host listed as a spare; `kw` goes to
    HorovodRun (another framework's stock script)."""
    listed = hosts.start(4)
    run = training_at_size_3(tmp_path, hosts, runs, listed, batches=BATCHES, channel=channel,
                             gloo_timeout_s=gloo_timeout_s, env=env, **kw)
    return run, listed


def replacement_lost_while_it_joins(run: HorovodRun, hosts: HostSet, listed: list[str], *,
                                    frozen: bool = False, hooked: bool = True,
                                    ) -> tuple[list[str], str, float, list[int]]:
    """The fault, and the supervisor's part in it. Returns (the survivors, the lost
    replacement, the wall time it was lost at, its pids)."""
    world = [h for h in listed if hosts.training(h)]
    [spare] = [h for h in listed if h not in world]
    coordinator = run.last_step()["host"]  # type: ignore[index]
    victim = next(h for h in world if h != coordinator)  # rank 0 keeps printing the steps
    survivors = [h for h in world if h != victim]
    assert run.proc is not None
    at = time.time()
    kill(p.pid for p in hosts.training(victim))
    kill_ssh_clients(run.proc.pid, {victim})
    run.set_hosts([*survivors, spare])
    joining = [p.pid for p in wait_for(
        lambda: hosts.training(spare), GLOO_TIMEOUT_S + 60, interval=0.01,
        what=f"the replacement's worker on {spare}:\n{run.tail()}")]
    # The survivors' reset: each cuts the failed world's connections as it leaves it (the
    # hook's fence.left_world); without, one waited for the other until the Gloo timeout (2 runs
    # in 3: each Horovod thread waited for the other in another collective).
    reset = time.time() - at
    assert reset < FIRST_RESET_BOUND_S or not hooked, \
        f"the first reset took {reset:.1f}s:\n{run.tail()}"
    if frozen:  # nobody notices: its ssh session stays up, its host listed
        freeze(joining)
    else:
        kill(joining)
        kill_ssh_clients(run.proc.pid, {spare})
        run.set_hosts(survivors)
    lost_at = time.time()
    # (A step can be logged just after `at`: its gradients were reduced before the kill.)
    assert step_after_reset(run.records(), at) is None, \
        f"the survivors trained in a world of their own before:\n{run.tail()}"
    return survivors, spare, lost_at, joining


TORCH: dict[str, Any] = {}
# The seeds' TensorFlow shape (a tf.function step, a commit every batch): its survivors leave the
# failed world through horovod.common.elastic.run_fn, not through a Python collective.
TENSORFLOW = {"python": TF_PYTHON, "script": STOCK_TF}


@pytest.mark.parametrize(("frozen", "framework"), [
    pytest.param(False, TORCH, id="killed: its exit triggers the re-plan"),
    pytest.param(True, TORCH, id="frozen: the join timeout triggers the re-plan"),
    pytest.param(False, TENSORFLOW, id="killed, TensorFlow's stock script"),
])
def test_a_replacement_lost_while_it_joins_is_dropped_and_training_resumes_in_place(
        tmp_path: Path, fake_hosts: tuple[HostSet, list[HorovodRun]], frozen: bool,
        framework: dict[str, Any]) -> None:
    hosts, runs = fake_hosts
    channel = Channel()
    with contextlib.ExitStack() as stack:
        stack.callback(channel.close)
        run, listed = training(
            tmp_path, hosts, runs, channel, GLOO_TIMEOUT_S,
            env={"ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S": str(JOIN_TIMEOUT_S)}, **framework)
        assert channel.of("driver") and channel.of("driver")[0]["ok"], "the driver is armed"
        assert run.proc is not None
        pid = run.proc.pid
        survivors, spare, lost_at, joining = replacement_lost_while_it_joins(
            run, hosts, listed, frozen=frozen)
        stack.callback(kill, joining)  # a frozen one outlives its ssh session

        back = wait_for(lambda: step_after_reset(run.records(), lost_at, size=2),
                        GLOO_TIMEOUT_S + 30, what=f"training resumed at size 2:\n{run.tail()}")
        waited = back["time"] - lost_at
        assert waited <= RESUME_BOUND_S + (JOIN_TIMEOUT_S if frozen else 0), \
            f"resumed {waited:.1f}s after the replacement was lost"
        if frozen:  # (the timeout runs from the assignment, a little before `lost_at`)
            assert waited >= JOIN_TIMEOUT_S - 5, "the survivors were held for the join timeout"
        assert run.proc.pid == pid and run.proc.poll() is None, \
            f"the same horovodrun runs on:\n{run.tail()}"
        why = (f"its new worker did not reach the rendezvous within {JOIN_TIMEOUT_S} s" if frozen
               else "its worker exited")
        out = run.output()
        assert f"elastic-supervisor hook: re-planning the world without {spare}: {spare}: " \
               f"{why}" in out, run.tail()
        assert "terminate called" not in out, "no process aborted"
        assert not [r for r in run.records() if r.get("event") == "resumed"], "no new run"
        check_steps(run.records())  # from step 1: nothing committed was lost
        hello = channel.of("driver")[-1]
        assert hello["world"] == sorted(survivors), hello
        assert (spare in hello["exited"]) is not frozen, "a lost worker's exit is reported"

        [fresh] = hosts.start(1)
        listed_at = time.time()
        run.set_hosts([*survivors, fresh])
        full = wait_for(lambda: step_after_reset(run.records(), listed_at, size=3),
                        SCALE_OUT_BOUND_S, what=f"training at size 3 again:\n{run.tail()}")
        assert run.output().count("re-planning") == 1, "the fresh host joined at first try"

        target = run.stop_at()
        assert run.wait(120) == 0, run.tail()
        steps = run.steps()
        assert steps[-1]["step"] == target and steps[-1]["size"] == 3
        check_steps(run.records())
        print(f"\nreplacement lost at {lost_at:.1f}, training resumed at size 2 {waited:.1f}s "
              f"later at step {back['step']}; a fresh host listed joined in "
              f"{full['time'] - listed_at:.1f}s")


def test_without_the_gate_the_survivors_abort_at_the_gloo_timeout(
        tmp_path: Path, fake_hosts: tuple[HostSet, list[HorovodRun]]) -> None:
    """The same fault under an unmodified horovodrun: what the gate is for (and proof that the
    test above can fail). The survivors' std::terminate reaches the driver as ssh's 255."""
    hosts, runs = fake_hosts
    run, listed = training(tmp_path, hosts, runs, None, BASELINE_GLOO_TIMEOUT_S)
    _, _, lost_at, _ = replacement_lost_while_it_joins(run, hosts, listed, hooked=False)
    assert run.wait(BASELINE_GLOO_TIMEOUT_S + 60) != 0, run.tail()
    out = run.output()
    assert "terminate called after throwing an instance of 'gloo::IoException'" in out, \
        run.tail()
    assert f"Wait timeout after {BASELINE_GLOO_TIMEOUT_S} seconds for key(s): 2" in out
    assert step_after_reset(run.records(), lost_at) is None, "it never resumed"
