"""TensorFlow in your own image, on real nodes: the sidecar overlay's recipe unchanged
(manifests/overlays/sidecar) but for its two YOUR IMAGE lines, which name the TensorFlow trainer
(`elastic-supervisor-trainer-tf`, trainer_tf_image/: TensorFlow and Horovod, nothing of
elastic-supervisor), with the supervisor's shipped defaults (the quarantine on, the hang
thresholds: SUPERVISOR_STUCK_SECONDS=auto) and the tours' restart budgets (`tour_budgets`: faults
seconds apart on one slot). Both stock TensorFlow scripts, which import nothing of ours and keep
no checkpoint (a horovodrun restart would start them over: each fault checks there was none):

`TestSidecarTensorFlowTour`: the seeds' shape (stock_tf_train.py: a `@tf.function` step with
`DistributedGradientTape`, `TensorFlowKerasState`, a commit every batch), one job through a
scale-out to 3, rank 0's worker and another SIGKILLed at once, a scale-in to 2, a force delete,
a replacement killed while it joins, a frozen (SIGSTOPped) training process, a partitioned
worker, a main thread deadlocked while its other threads run (the script's --hang-file), a
silent node with a frozen worker, an eviction, `status`'s step against the printed one, and the
end through the stop file. `TestSidecarKerasTour`: Keras's `model.fit` with `KerasState` and
Horovod's elastic callbacks (stock_keras_train.py, its deadlock in a callback between two
`tf.function` steps) through the same faults.

Each fault asserts what the torch tours assert (no horovodrun restart, no committed batch lost,
one live pod per slot, the decision and its Event) and the resume bounds of issue 38: rank 0's
first batch after the reset within KILL_S of a kill, HANG_S of a frozen process, STUCK_BOUND_S of
a deadlock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.job import SIDECAR_OVERLAY
from localcluster.nodes import Cluster
from supervisor.decide.hang import STUCK_FLOOR_S
from tests.e2e.jobs import (
    CHECKPOINT_MOUNT,
    HANG_FILE,
    SHIPPED_QUARANTINE,
    STOCK_DIR,
    STOCK_KERAS,
    STOCK_TF,
    TOUR_SLEEP,
    TRAINER_TF,
    Job,
    check_training,
    evicted_leaves_gracefully,
    recomputed_since,
    tour_budgets,
    your_image,
)
from tests.e2e.test_sidecar import (
    status_as_printed_with_incidents,
    the_training_image_has_nothing_of_ours,
)
from tests.e2e.test_stock_lane import (
    BATCHES,
    decisions,
    force_deleted_then_replaced,
    frozen_then_replaced,
    moved_within_the_bounds,
    no_gloo_timeout,
    partitioned_then_replaced,
    replacement_killed_while_it_joins,
    silent_node_then_replaced,
    sound,
    stock_job,
    stuck_then_replaced,
    throttled_then_moved,
)
from tests.faults import PodFaults

# Issue 38's targets: rank 0's first batch after the reset, from the fault.
KILL_S = 2.0  # a SIGKILL or a force delete
HANG_S = 5.0  # a frozen process (silent past the 3 s heartbeat timeout, then fenced)
STUCK_BOUND_S = 30.0  # a main thread deadlocked (stuck after STUCK_FLOOR_S=20 s, shipped)
# The straggler job's batch: MNIST-shaped images through two convolutions, mostly compute.
TF_BATCH = 64


def tf_command(stock: Path, *extra: str) -> list[str]:
    """The stock TensorFlow script's command (main_job adds --stop-file)."""
    return ["python", f"{STOCK_DIR}/{stock.name}", "--batches", str(BATCHES), "--sleep", TOUR_SLEEP,
            *extra]


@contextlib.contextmanager
def tf_job(cluster: Cluster, api: client.ApiClient, out: Path, stock: Path, *, workers: int,
           extra: tuple[str, ...] = ()) -> Iterator[tuple[Job, PodFaults]]:
    """The stock TensorFlow script `stock` in sidecar mode with the TensorFlow trainer as the
    user's image, the shipped defaults, the tours' budgets; yielded once it trains at size
    `workers`."""
    with stock_job(cluster, api, out, workers=workers, stock=stock,
                   command=tf_command(stock, *extra), policy=tour_budgets,
                   overlay=SIDECAR_OVERLAY, transform=your_image(TRAINER_TF),
                   **SHIPPED_QUARANTINE) as jf:
        yield jf


@pytest.fixture(scope="class")
def tour(request: pytest.FixtureRequest, cluster: Cluster, cluster_api: client.ApiClient,
         main_images: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Job, PodFaults]]:
    """The job of the tour class asking: its stock script (`STOCK`), 2 workers."""
    stock: Path = request.cls.STOCK
    with tf_job(cluster, cluster_api, tmp_path_factory.mktemp(f"sidecar-{stock.stem}-tour"),
                stock, workers=2,
                extra=("--hang-file", f"{CHECKPOINT_MOUNT}/{HANG_FILE}")) as jf:
        yield jf


def runs_the_tensorflow_image_without_us(job: Job, size: int) -> None:
    """The pods run the TensorFlow trainer, which holds nothing of ours; the hook in it fences
    TensorFlow (no HookFrameworkUnfenced) and hang detection is on."""
    job.settled(size)
    the_training_image_has_nothing_of_ours(job, TRAINER_TF)
    reasons = job.reasons()
    assert "HangDetectionOff" not in reasons and "HookFrameworkUnfenced" not in reasons, reasons
    assert job.logs("sidecar.found"), "the supervisor checked its pod"
    env = {e["name"]: e.get("value") for e in job.launcher_env()}
    assert env["SUPERVISOR_QUARANTINE_FAILURES"] == SHIPPED_QUARANTINE[
        "SUPERVISOR_QUARANTINE_FAILURES"], "the shipped quarantine"
    assert "SUPERVISOR_STUCK_SECONDS" not in env, "the shipped (auto) stuck threshold"


def rank0_and_another_killed(job: Job, faults: PodFaults, size: int,
                             within: float = KILL_S) -> float:
    """At `size` (3), rank 0's worker and another SIGKILLed at once: the survivor resumes
    within `within` (horovodrun not restarted), both are replaced, back at `size`; returns the
    resume time."""
    job.settled(size)
    rank0 = job.rank0_host()
    live = sorted(job.live_workers().items())
    first = next(n for n, p in live if p["status"]["podIP"] == rank0)
    victims = [first, next(n for n, _ in live if n != first)]
    t0 = time.time()
    faults.kill(*victims)
    took = no_gloo_timeout(job, t0, within)
    job.back_to(size, t0)
    d = decisions(job)
    assert {v: (d[v]["cause"], d[v]["exit_code"], d[v]["action"]) for v in victims} == \
        dict.fromkeys(victims, ("ExitCode", 137, "Restart"))
    assert all(job.successor(v) in job.live_workers() for v in victims)
    print(f"{victims}: resumed {took:.2f}s after the kill")
    sound(job, t0)
    return took


def scaled(job: Job, size: int, to: int) -> None:
    """`elastic-supervisor scale` from `size` to `to` workers: an elastic reset to `to`, no
    failure, not a batch computed again (the host change commits first)."""
    job.settled(size)
    t0 = time.time()
    job.scale(to)
    job.back_to(to, t0)
    assert job.logs_since("worker.failed", t0) == [], "a scale is never taken for a failure"
    assert recomputed_since(job.records(), t0) == 0, "a host change commits first"
    sound(job, t0)


def ends_through_the_stop_file(job: Job, size: int) -> None:
    """Training ends at the stop file's step with exit 0 (es-run's, the supervisor's verdict);
    the whole run lost no committed batch; under the shipped defaults no node was quarantined
    (none of the faults is a node's)."""
    job.settled(size)
    target = job.stop_at()
    assert job.wait_exit(300) == 0, job.tail()
    check_training(job.records(), target, final_size=size)
    assert [e["code"] for e in job.logs("supervisor.exited")] == [0]
    assert job.logs("node.quarantined") == [] and "NodeQuarantined" not in job.reasons()
    assert len(job.logs("horovodrun.started")) == 1, "one horovodrun for the whole tour"


@pytest.mark.tour
class TestSidecarTensorFlowTour:
    STOCK = STOCK_TF

    def test_the_pods_run_the_tensorflow_image_and_it_holds_nothing_of_ours(
            self, tour: tuple[Job, PodFaults]) -> None:
        runs_the_tensorflow_image_without_us(tour[0], 2)

    def test_a_scale_out_to_3_loses_no_batch(self, tour: tuple[Job, PodFaults]) -> None:
        scaled(tour[0], 2, 3)

    def test_rank_0s_worker_and_another_sigkilled_at_once_are_replaced(
            self, tour: tuple[Job, PodFaults]) -> None:
        rank0_and_another_killed(*tour, size=3)

    def test_a_scale_in_to_2_loses_no_batch(self, tour: tuple[Job, PodFaults]) -> None:
        scaled(tour[0], 3, 2)

    def test_a_force_deleted_worker_is_replaced(self, tour: tuple[Job, PodFaults]) -> None:
        force_deleted_then_replaced(*tour, within=KILL_S)

    def test_a_replacement_killed_while_it_joins_is_replaced_again(
            self, tour: tuple[Job, PodFaults]) -> None:
        replacement_killed_while_it_joins(*tour)

    def test_a_frozen_training_process_is_found_by_its_silence(
            self, tour: tuple[Job, PodFaults]) -> None:
        frozen_then_replaced(*tour, within=HANG_S)

    def test_a_partitioned_worker_is_found_and_cut_off(
            self, tour: tuple[Job, PodFaults]) -> None:
        partitioned_then_replaced(*tour, within=HANG_S)

    def test_a_main_thread_deadlocked_while_its_threads_run_is_named_stuck(
            self, tour: tuple[Job, PodFaults]) -> None:
        """Inside the `tf.function` only the hook's graph signals tell that the survivor waits
        in the collective: the deadlocked rank is named stuck with the script's frame."""
        stuck_then_replaced(*tour, rank0=False, stuck_s=STUCK_FLOOR_S, within=STUCK_BOUND_S)

    def test_a_silent_node_with_a_frozen_worker_is_found(
            self, tour: tuple[Job, PodFaults]) -> None:
        silent_node_then_replaced(*tour, within=HANG_S)

    def test_an_evicted_worker_leaves_without_a_batch_computed_again(
            self, tour: tuple[Job, PodFaults]) -> None:
        evicted_leaves_gracefully(tour[0])

    def test_status_counts_the_steps_the_script_printed(
            self, tour: tuple[Job, PodFaults]) -> None:
        """The hook counts the optimizer steps of a `tf.function` step (its graph signals):
        `status`'s step is the printed one within 2 %, after every fault of the tour, each an
        incident."""
        status_as_printed_with_incidents(tour[0], size=2, failures=9)

    def test_the_job_ends_through_the_stop_file_with_exit_0(
            self, tour: tuple[Job, PodFaults]) -> None:
        ends_through_the_stop_file(tour[0], 2)


@pytest.mark.tour
class TestSidecarKerasTour(TestSidecarTensorFlowTour):
    """The same faults for Keras's `model.fit` with the elastic callbacks."""
    STOCK = STOCK_KERAS


def tf_straggler_job() -> dict[str, Any]:
    """stock_job's arguments for three workers of the seeds' TensorFlow script in your image
    (sidecar mode), compute-bound, no checkpoint, the shipped defaults."""
    return {"workers": 3, "stock": STOCK_TF, "overlay": SIDECAR_OVERLAY,
            "transform": your_image(TRAINER_TF), "command": [
                "python", f"{STOCK_DIR}/{STOCK_TF.name}", "--batches", str(BATCHES),
                "--batch-size", str(TF_BATCH)], **SHIPPED_QUARANTINE}


def test_a_throttled_tensorflow_worker_is_named_and_moved(
        cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
        tmp_path: Path) -> None:
    """Issue 42 in TensorFlow: the seeds' shape (stock_tf_train.py: a `tf.function` step with
    DistributedGradientTape, no checkpoint) in your image, sidecar mode, three workers,
    compute-bound (no extra sleep, batches of TF_BATCH): one given THROTTLE_PERCENT of a CPU is
    timed by the hook between two reductions of a step's gradients (the signals in the graph),
    named, moved and the rate comes back, as the torch script's (test_stock_lane)."""
    with stock_job(cluster, cluster_api, tmp_path, **tf_straggler_job()) as (job, faults):
        m = throttled_then_moved(job, faults)
        print(f"straggler (TensorFlow): {m}")
        moved_within_the_bounds(job, m)
