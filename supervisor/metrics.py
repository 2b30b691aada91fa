"""Prometheus metrics on an injected registry (never the global one), and the HTTP endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Event -> discovery-file latency buckets, seconds: the target is p99 <= 0.1 s at 1000 workers.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# One pass of the loop, seconds: the target is <= 0.02 s idle at 10,000 workers (issue 41).
PASS_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
                0.075, 0.1, 0.2, 0.5, 1.0)
# One collection of Python's cyclic garbage collector, seconds (collector.py).
GC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0)
# Detection -> each phase of an incident (incidents.py), seconds.
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    discovery_writes: Counter
    discovery_withdrawals: Counter
    discovery_latency: Histogram
    watch_connects: Counter
    watch_relists: Counter
    watch_last_event_age: Gauge
    workers_listed: Gauge
    workers_usable: Gauge
    workers_desired: Gauge
    workers_live: Gauge
    horovodrun_up: Gauge
    worker_failures: Counter
    workers_created: Counter
    worker_leaves: Counter
    nodes_quarantined: Gauge
    slow_workers: Gauge
    straggler_factor_max: Gauge
    restart_budget_left: Gauge
    replacement_latency: Histogram
    heartbeating_processes: Gauge
    last_progress_age: Gauge
    horovodrun_restarts: Counter
    restart_lost_training: Counter
    hook_datagrams: Gauge
    training_steps: Counter
    steps_recomputed: Counter
    training_step_rate: Gauge
    world_size: Gauge
    world_size_desired: Gauge
    goodput: Gauge
    productive_worker_seconds: Counter
    lost_worker_seconds: Counter
    incidents: Counter
    incident_phase: Histogram
    loop_pass: Histogram
    api_write: Histogram
    gc_pause: Histogram


def make_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """Return the supervisor's metrics registered on `registry` (a new one by default)."""
    r = registry or CollectorRegistry()
    p = "elastic_supervisor_"
    return Metrics(
        registry=r,
        discovery_writes=Counter(f"{p}discovery_writes", "Discovery file rewrites", registry=r),
        discovery_withdrawals=Counter(f"{p}discovery_withdrawals",
                                      "Discovery file withdrawals (script fails)", registry=r),
        discovery_latency=Histogram(
            f"{p}discovery_latency_seconds",
            "Watch event received -> discovery file renamed", buckets=LATENCY_BUCKETS,
            registry=r),
        watch_connects=Counter(f"{p}watch_connects", "Watch connections opened", ["kind"],
                               registry=r),
        watch_relists=Counter(f"{p}watch_relists", "Full lists (start, 410 Gone)", ["kind"],
                              registry=r),
        watch_last_event_age=Gauge(
            f"{p}watch_last_event_age_seconds",
            "Seconds since the watch delivered anything (event or bookmark)", ["kind"],
            registry=r),
        workers_listed=Gauge(f"{p}workers_listed", "Worker pods in the view", registry=r),
        workers_usable=Gauge(f"{p}workers_usable", "Worker pods in the discovery file",
                             registry=r),
        workers_desired=Gauge(f"{p}workers_desired", "Worker pods the supervisor keeps "
                              "(active slots; 0 when it does not own the workers)", registry=r),
        workers_live=Gauge(f"{p}workers_live", "Worker pods not terminated and not being "
                           "deleted", registry=r),
        horovodrun_up=Gauge(f"{p}horovodrun_up", "1 while horovodrun runs", registry=r),
        worker_failures=Counter(f"{p}worker_failures", "Worker failures by cause and the "
                                "action taken", ["cause", "action"], registry=r),
        workers_created=Counter(f"{p}workers_created", "Worker pods created", registry=r),
        worker_leaves=Counter(f"{p}worker_leaves", "Workers announced to go that left "
                              "gracefully (no failure), by why", ["why"], registry=r),
        nodes_quarantined=Gauge(f"{p}nodes_quarantined", "Nodes that get no new worker of "
                                "the job now (bad-node quarantine)", registry=r),
        slow_workers=Gauge(f"{p}slow_workers", "Workers said slow now (stragglers: their "
                           "own work per step SUPERVISOR_SLOW_FACTOR times the others')",
                           registry=r),
        straggler_factor_max=Gauge(
            f"{p}straggler_factor_max", "The highest factor of a worker's own work per step "
            "over the other workers' median measured in a settled world so far (the margin "
            "below SUPERVISOR_SLOW_FACTOR)", registry=r),
        restart_budget_left=Gauge(f"{p}restart_budget_left",
                                  "Replacements left under the job-wide restart limit",
                                  registry=r),
        replacement_latency=Histogram(
            f"{p}replacement_latency_seconds",
            "Failure observed -> replacement pod created (without backoff waits)",
            buckets=LATENCY_BUCKETS, registry=r),
        heartbeating_processes=Gauge(f"{p}heartbeating_processes", "Training processes whose "
                                     "hook heartbeats now", registry=r),
        last_progress_age=Gauge(f"{p}last_progress_age_seconds", "Seconds since a training "
                                "process last completed a collective", registry=r),
        horovodrun_restarts=Counter(f"{p}horovodrun_restarts", "Restarts of horovodrun (a "
                                    "stalled job, a broken or stuck rendezvous)", ["reason"],
                                    registry=r),
        restart_lost_training=Counter(
            f"{p}restart_lost_training_seconds", "Seconds the runs of horovodrun that were "
            "restarted had trained: what a script without a checkpoint lost", registry=r),
        hook_datagrams=Gauge(f"{p}hook_datagrams", "Datagrams of the hook channel since start, "
                             "by outcome (received, rejected: not authentic or replayed, "
                             "invalid: authentic but a field the hook does not send, failed: "
                             "raised while recorded, stale: an earlier run, unbound: not from "
                             "the address of the host it speaks for, pushed: fence pushes sent, "
                             "replies)",
                             ["outcome"], registry=r),
        training_steps=Counter(f"{p}training_steps", "The job's training steps (world rank "
                               "0's optimizer steps, or commits; progress.py)", registry=r),
        steps_recomputed=Counter(f"{p}steps_recomputed", "Steps computed again after a "
                                 "failed world rolled the state back", registry=r),
        training_step_rate=Gauge(f"{p}training_step_rate", "Steps per second over the last "
                                 "10 s (0 when not training)", registry=r),
        world_size=Gauge(f"{p}world_size", "Processes in the training world (world rank "
                         "0's size; 0: none)", registry=r),
        world_size_desired=Gauge(f"{p}world_size_desired", "Processes asked for (desired "
                                 "workers x slots per worker)", registry=r),
        goodput=Gauge(f"{p}goodput_ratio", "Share of the wall time since the first step "
                      "spent training at the size asked for (of=full) or at all (of=any)",
                      ["of"], registry=r),
        productive_worker_seconds=Counter(
            f"{p}productive_worker_seconds", "Process-seconds spent training (steps computed "
            "again not included)", registry=r),
        lost_worker_seconds=Counter(
            f"{p}lost_worker_seconds", "Process-seconds asked for and not spent training",
            registry=r),
        incidents=Counter(f"{p}incidents", "Incidents (failures, graceful leaves, scales, "
                          "horovodrun restarts) by cause and kind", ["cause", "kind"],
                          registry=r),
        loop_pass=Histogram(
            f"{p}loop_pass_seconds", "One pass of the loop (triggers applied, the host list, "
            "the decisions, their script), by whether triggers came (idle: none)", ["batch"],
            buckets=PASS_BUCKETS, registry=r),
        incident_phase=Histogram(
            f"{p}incident_phase_seconds", "Detection -> each phase of an incident (fenced, "
            "resumed, created, scheduled, started, joined, full)", ["phase", "kind"],
            buckets=PHASE_BUCKETS, registry=r),
        api_write=Histogram(
            f"{p}api_write_seconds", "A write of the actuator that succeeded, from its first "
            "try (retries included; not the wait before it) until done: the state ConfigMap "
            "(save), a pod with its host key's Secret (create), a delete, the budget", ["what"],
            buckets=PASS_BUCKETS, registry=r),
        gc_pause=Histogram(
            f"{p}gc_pause_seconds", "One collection of Python's cyclic garbage collector, by "
            "generation: the whole process waits for it (collector.py)", ["generation"],
            buckets=GC_BUCKETS, registry=r),
    )


def serve(metrics: Metrics, port: int, addr: str = "0.0.0.0") -> object:
    """Serve /metrics on `port` from a daemon thread; return the server."""
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return server
