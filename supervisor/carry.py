"""ADAPTER: carries out the decisions' script (`decide.script`), one operation at a time, in the
order the pass returned it: say a note, fence hosts through the hook channel, kill horovodrun's
ssh clients to them, restart or stop horovodrun, hand a delete, a save, a create or the
PodDisruptionBudget to the actuator (its outcomes come back to the loop as triggers).

It decides nothing: the one thing an operation changes in the decisions' memory (a restart of
horovodrun opens the start gate again) is `on.gate_opened`'s, returned to the loop to keep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from supervisor.channel import HookChannel
from supervisor.config import Config
from supervisor.decide import fleet, incidents, memory, on, plan, progress, script, stragglers
from supervisor.decide.memory import Memory
from supervisor.decide.script import CreatePod, KeepBudget, Op, SaveState
from supervisor.horovodrun import Horovodrun
from supervisor.metrics import Metrics
from supervisor.model import EventSpec
from supervisor.reports import Reports
from supervisor.workers import disruption_budget, worker_pod


class Carrier:
    """Carries out a script's operations; runs on the loop's thread."""

    def __init__(self, cfg: Config, *, log: Any, events: Callable[[EventSpec], None],
                 metrics: Metrics, reports: Reports, horovodrun: Horovodrun,
                 channel: HookChannel | None, act: Callable[[Op], None],
                 kill_ssh_clients: Callable[[int, Collection[str]], dict[str, list[int]]],
                 owner: Mapping[str, str] | None) -> None:
        self.cfg, self.log, self.events, self.metrics = cfg, log, events, metrics
        self.reports, self.horovodrun, self.channel, self.act = reports, horovodrun, channel, act
        self.kill_ssh_clients, self.owner = kill_ssh_clients, owner

    def budget_left(self, c: Memory) -> int:
        """The job's restart budget left (a metric, and `status`)."""
        return max(0, self.cfg.policy.budgets.restart_limit - (
            c.fleet.ledger.total if c.fleet is not None else 0))

    def carry_out(self, c: Memory, todo: memory.Todo, now: float) -> Memory:
        """One operation of the script; returns the memory (a restart opens the gate)."""
        cfg = self.cfg
        if isinstance(todo, plan.Note):
            self.reports.say((todo,))
        elif isinstance(todo, script.Fence):
            assert self.channel is not None
            t0 = time.perf_counter()
            pushed = self.channel.fence(todo.hosts)
            self.log.info("worker.fenced", hosts=sorted(todo.hosts), pushed_to=pushed,
                          push_ms=round((time.perf_counter() - t0) * 1000, 2))
        elif isinstance(todo, script.KillSsh):
            if self.horovodrun.child is None:
                return c
            # One walk of horovodrun's tree for all of them (a lost node may take 100).
            killed = self.kill_ssh_clients(self.horovodrun.child.pid, todo.pods.keys())
            for host, pod in sorted(todo.pods.items()):
                self.log.info("worker.ssh_clients_killed", pod=pod, host=host,
                              pids=killed.get(host, []))
        elif isinstance(todo, script.RestartHorovodrun):
            if self.horovodrun.restart(todo, now):
                return on.gate_opened(c, now)
        elif isinstance(todo, SaveState):
            self.act(SaveState({**todo.state, "progress": progress.to_dict(c.progress),
                                "incidents": incidents.to_list(c.book),
                                "slow": stragglers.to_list(c.slow, now),
                                "slowMoves": stragglers.moves_to_dict(c.slow)}))
            self.metrics.restart_budget_left.set(self.budget_left(c))
        elif isinstance(todo, script.CreateWorker):
            x = todo.create
            self.act(CreatePod(worker_pod(
                cfg.worker_template, job=cfg.job_name,  # type: ignore[arg-type]
                slot=x.slot, incarnation=x.incarnation, owner=self.owner,
                avoid_node=x.avoid_node, lost_nodes=list(todo.lost_nodes),
                suspect_nodes=list(todo.suspect_nodes), ahead_of=todo.ahead_of,
                hold_in=cfg.worker_container or cfg.worker_template[  # type: ignore[index]
                    "spec"]["containers"][0]["name"])))
        elif isinstance(todo, script.KeepMinAvailable):
            self.act(KeepBudget(disruption_budget(
                fleet.budget_name(cfg.job_name), cfg.job_name, todo.min_available, self.owner)))
        elif isinstance(todo, script.FailJob):
            self.failing(todo, now)
        else:
            self.act(todo)
        return c

    def failing(self, f: script.FailJob, now: float) -> None:
        """The run ends: stop horovodrun (SIGTERM, then the tree after the grace)."""
        self.log.error("job.failing", code=f.code, reason=f.reason)
        if f.event:
            self.events(EventSpec("Warning", "JobFailing", "Fail", f.reason))
        self.horovodrun.stop(now)
