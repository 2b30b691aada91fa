"""The main job end to end, for the scenario tests: nothing here is a stand-in.

`ElasticJob` runs the real `elastic-supervisor run` (a subprocess, like in a launcher pod) with
the real horovodrun, which trains worker_image/train.py over ssh on worker pods that the
supervisor creates from its template; the node agent runs those pods as sshds on their own
loopback addresses, on nodes whose Leases it renews, and the real controller-manager and
scheduler do the rest. Faults are injected through the agent (signals, exit codes, frozen
processes, silent nodes) and the API (force deletes), the way they happen in a cluster.

What the job did is read back from the supervisor's output: its JSON log lines (decisions) and
horovodrun's lines (`[rank]<stdout>:{...}`, rank 0's JSON line per step). `check_training`
asserts what every scenario promises: the target step reached, no committed step lost, steps
computed again after a reset at most the commit interval.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from localcluster.controlplane import ControlPlane
from tests.helpers import wait_for
from tests.integration.harness import SupervisorProcess, event_reasons
from tests.pods import JOB_LABELS, SSH_PORT, AgentPods, agent_pods, worker_pod

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "worker_image" / "train.py"
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
COMMIT_EVERY = 5
JOB = JOB_LABELS["elastic-supervisor/job"]
Record = dict[str, Any]


def horovod_records(output: str) -> list[Record]:
    """Rank 0's JSON lines in horovodrun's output, in order (steps and events)."""
    out = []
    for line in output.splitlines():
        _, sep, text = line.partition("]<stdout>:")
        if sep and text.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(text))
    return out


def steps_of(records: list[Record]) -> list[Record]:
    return [r for r in records if "loss" in r]


def step_after_reset(records: list[Record], t0: float, size: int | None = None) -> Record | None:
    """Rank 0's first step after the first reset (to world size `size`, if given) that came
    after wall time `t0`; None if there is none yet."""
    for i, r in enumerate(records):
        if r.get("event") == "reset" and r["time"] > t0 and size in (None, r["size"]):
            later = steps_of(records[i:])
            return later[0] if later else None
    return None


@dataclass
class ElasticJob:
    """One training job: worker pods on the node agent, a supervisor process (restartable)."""

    cp: ControlPlane
    api: client.ApiClient
    pods: AgentPods
    tmp: Path
    steps: int
    env: dict[str, str]
    # The training command; None: worker_image/train.py for `steps` steps with a checkpoint.
    command: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.supervisors: list[SupervisorProcess] = []
        self.template = self.tmp / "worker-template.json"
        pod = worker_pod("template", self.pods.agent.node_selector)
        del pod["metadata"]["name"]
        self.template.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", **pod}))
        if self.command is None:
            self.command = (sys.executable, str(TRAIN), "--steps", str(self.steps),
                            "--commit-every", str(COMMIT_EVERY),
                            "--checkpoint", str(self.tmp / "checkpoint.pt"))

    @property
    def sup(self) -> SupervisorProcess:
        return self.supervisors[-1]

    @property
    def namespace(self) -> str:
        return self.pods.namespace

    def start(self) -> SupervisorProcess:
        """Start (or start again) the supervisor; it creates the workers and runs horovodrun."""
        env = {
            "SUPERVISOR_HOROVODRUN": str(HOROVODRUN),
            "SUPERVISOR_WORKER_TEMPLATE": str(self.template),
            "SUPERVISOR_SSH_IDENTITY_FILE": str(self.pods.key.private),
            "SUPERVISOR_SSH_PORT": str(SSH_PORT),
            "SUPERVISOR_NETWORK_INTERFACE": "lo",
            "SUPERVISOR_NP": "2", "SUPERVISOR_MIN_NP": "1", "SUPERVISOR_MAX_NP": "3",
            # A replacement must finish hvd.init() within it on a loaded 2-core machine.
            "SUPERVISOR_GLOO_TIMEOUT_SECONDS": "60",
            "SUPERVISOR_HOROVODRUN_EXTRA_ARGS": "--start-timeout 60 --elastic-timeout 120",
            "SUPERVISOR_LOG_LEVEL": "info",
            # The scenarios look at the workers after the end (the cleanup has its own tests),
            # and a launcher restarted after a SIGKILL waits out the killed one's lease.
            "SUPERVISOR_CLEAN_POD_POLICY": "None", "SUPERVISOR_LEADER_LEASE_SECONDS": "10",
            **self.env,
        }
        sup = SupervisorProcess(self.cp, self.namespace, self.tmp, command=self.command,
                                **env)
        self.supervisors.append(sup)
        return sup.start()

    # -- what happened ----------------------------------------------------------------------

    def output(self) -> str:
        """Everything every supervisor process (and its horovodrun) printed, in order."""
        return "\n".join(s.output() for s in self.supervisors if s.log_path.exists())

    def records(self) -> list[Record]:
        return horovod_records(self.output())

    def last_step(self) -> Record | None:
        steps = steps_of(self.records())
        return steps[-1] if steps else None

    def logs(self, event: str) -> list[Record]:
        return [e for s in self.supervisors for e in s.logs() if e.get("event") == event]

    def reasons(self) -> list[str]:
        return event_reasons(self.api, self.namespace)

    def worker_pods(self) -> dict[str, Any]:
        """The job's worker pods by name, as API dicts."""
        selector = ",".join(f"{k}={v}" for k, v in JOB_LABELS.items())
        resp = self.pods.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                                  _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(resp.data)["items"]}

    def live_workers(self) -> dict[str, Any]:
        """Worker pods Running and not being deleted."""
        return {n: p for n, p in self.worker_pods().items()
                if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")}

    # -- waits ------------------------------------------------------------------------------

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def wait(self, what: str, predicate: Any, timeout: float) -> Any:
        """Wait for `predicate`; fail with the output's tail, or at once if the supervisor
        exited meanwhile."""
        def check() -> Any:
            got = predicate()
            if not got and self.sup.proc is not None and self.sup.proc.poll() is not None:
                raise AssertionError(f"the supervisor exited {self.sup.proc.returncode} while "
                                     f"waiting for {what}:\n{self.tail()}")
            return got
        try:
            return wait_for(check, timeout, interval=0.2, what=what)
        except BaseException as e:
            raise AssertionError(f"{e}\n--- output tail:\n{self.tail()}") from e

    def wait_training(self, past: int, size: int, timeout: float = 120) -> Record:
        """Wait until rank 0 reported a step > `past` at world size `size`; return it."""
        def check() -> Record | None:
            last = self.last_step()
            return last if last and last["step"] > past and last["size"] == size else None
        return self.wait(f"a step past {past} at world size {size}", check, timeout)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.sup.wait_exit(timeout)
        except Exception as e:
            raise AssertionError(f"the supervisor still runs after {timeout}s:\n"
                                 f"{self.tail()}") from e

    def rank0_host(self) -> str:
        last = self.last_step()
        assert last is not None
        return str(last["host"])

    def victim(self) -> tuple[str, dict[str, Any]]:
        """A live worker pod that does not host rank 0 (so rank 0's output stays whole)."""
        rank0 = self.rank0_host()
        for name, pod in sorted(self.live_workers().items()):
            if pod["status"].get("podIP") != rank0:
                return name, pod
        raise AssertionError(f"no live worker besides rank 0's {rank0}")

    def close(self) -> None:
        for s in self.supervisors:
            s.close()


def check_training(records: list[Record], target: int, *, final_size: int,
                   resumed_from: int = 0) -> None:
    """Assert that training reached `target` without losing a committed step (at most
    COMMIT_EVERY steps computed again after a rollback), ending at world size `final_size`."""
    steps = steps_of(records)
    assert steps, "rank 0 reported no step"
    assert records[-1].get("event") == "done", f"no done event; last: {records[-1]}"
    assert records[-1]["step"] == target
    assert steps[-1]["step"] == target and steps[-1]["size"] == final_size, steps[-1]
    committed, rerun, prev = resumed_from, 0, resumed_from
    checkpointed = resumed_from
    for r in records:
        if r.get("event") == "resumed":  # a new run, from the checkpoint of the last commit
            committed = checkpointed = max(checkpointed, r["step"])
            continue
        if "loss" not in r:
            continue
        if r["step"] != prev + 1:
            # A rollback: back to the step after the last commit, never further.
            assert r["step"] == committed + 1, (
                f"step {r['step']} after {prev}: expected {committed + 1} (the last commit + 1)")
            rerun = max(rerun, prev - committed)
        if r["committed"]:
            committed = r["step"]
        prev = r["step"]
    assert rerun <= COMMIT_EVERY, f"{rerun} steps computed again, more than {COMMIT_EVERY}"
    # A step's line can be lost with a killed launcher after its commit was checkpointed: the
    # checkpoint a later run resumed from proves the steps up to it were computed.
    seen = {r["step"] for r in steps} | set(range(resumed_from + 1, checkpointed + 1))
    assert seen == set(range(resumed_from + 1, target + 1)), "a step was never computed"


@contextlib.contextmanager
def elastic_job(cp: ControlPlane, api: client.ApiClient, namespace: str, tmp: Path, *,
                steps: int, nodes: tuple[str, ...] = ("node-a", "node-b", "node-c"),
                command: tuple[str, ...] | None = None, **env: str) -> Iterator[ElasticJob]:
    """A node agent for `namespace` (its own nodes) and an ElasticJob on it (not started)."""
    core = client.CoreV1Api(api)
    prefix = namespace[-6:]
    with agent_pods(cp, core, namespace, tmp / "keys",
                    nodes=tuple(f"{prefix}-{n}" for n in nodes),
                    workdir=tmp / "agent") as pods:
        job = ElasticJob(cp, api, pods, tmp, steps, dict(env), command)
        try:
            yield job
        finally:
            job.close()

