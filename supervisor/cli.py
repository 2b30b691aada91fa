"""Command line: parses arguments, builds the pieces, maps outcomes to exit codes.

`run -- CMD...`  supervise horovodrun running CMD (the launcher container's entrypoint);
`explain [-- CMD...]`  print the effective configuration and the exact horovodrun argv;
`status` / `scale`  read a job's state / record its desired size, with the user's kubeconfig.
Both exit 2 with one line per problem when the configuration is bad. Exit codes: see
supervisor.model.ExitCode and the README.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor import __version__, fleet, kube, operate, proc
from supervisor.actuator import Actuator
from supervisor.channel import HookChannel
from supervisor.config import (
    DEFAULT_SELECTOR,
    Config,
    ConfigError,
    effective_values,
    parse_config,
)
from supervisor.launch import horovodrun_argv
from supervisor.logs import make_logger
from supervisor.metrics import make_metrics, serve
from supervisor.model import EventSpec, ExitCode, SourceState
from supervisor.observe import Kind, NodeLeases, slim
from supervisor.policy import DEFAULT_RULES
from supervisor.reconcile import Supervisor
from supervisor.reload import PolicyWatcher


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-supervisor",
        description="Fault-tolerance supervisor for elastic Horovod training on Kubernetes. "
                    "Configured by SUPERVISOR_* environment variables (see `explain`).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run horovodrun with CMD and supervise it")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the training command")
    explain = sub.add_parser("explain", help="print the effective configuration and argv")
    explain.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the training command")
    status = sub.add_parser("status", help="show a job's workers, budgets and last decisions "
                            "(reads the cluster with your kubeconfig)")
    scale = sub.add_parser("scale", help="record the desired worker count; the running "
                           "supervisor applies it within a second")
    for p in (status, scale):
        p.add_argument("--job", default=os.environ.get("SUPERVISOR_JOB_NAME"),
                       help="job name (default: $SUPERVISOR_JOB_NAME)")
        p.add_argument("--namespace", help="default: the kubeconfig context's namespace")
    status.add_argument("--watch", action="store_true", help="refresh every 2 s until Ctrl-C")
    status.add_argument("--output", choices=("table", "json"), default="table")
    how = scale.add_mutually_exclusive_group(required=True)
    how.add_argument("--workers", type=int, metavar="N", help="scale to N workers")
    how.add_argument("--add", type=int, metavar="K", help="add K workers (scale out)")
    how.add_argument("--remove", type=int, metavar="K", help="remove K workers (scale in)")
    return parser


def _command(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def load_config(env: Mapping[str, str]) -> Config:
    """Parse the config, deriving the namespace default from the pod or the kubeconfig."""
    pod_ns = kube.in_cluster_namespace()
    kc_ns = None if pod_ns or env.get("SUPERVISOR_NAMESPACE") else kube.kubeconfig_namespace()
    return parse_config(env, pod_namespace=pod_ns, kubeconfig_namespace=kc_ns)


def explain(cfg: Config, command: Sequence[str]) -> str:
    """Return the `explain` text: variables (value, source) and the horovodrun argv."""
    rows = effective_values(cfg)
    width = max(len(r[0]) for r in rows)
    lines = ["effective configuration (variable, value, source):"]
    lines += [f"  {name:<{width}}  {value or '-'}  [{source}]" for name, value, source in rows]
    cmd = list(command) or ["<training command>"]
    argv = horovodrun_argv(cfg, cmd)
    lines += ["", "horovodrun argv (executed directly, never through a shell):",
              "  " + shlex.join(argv)]
    lines += ["", "failure rules (first match wins; the defaults come last):"]
    for rule in (*cfg.policy.rules, *DEFAULT_RULES):
        what = (",".join(sorted(rule.causes)) if rule.causes is not None else
                "exit codes " + ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}"
                                         for lo, hi in rule.exit_codes or ()))
        lines.append(f"  {rule.action.value:<8} {what}  [{rule.name}]")
    b = cfg.policy.budgets
    lines.append(f"budgets: restart limit {b.restart_limit}, per slot "
                 f"{b.per_slot_limit if b.per_slot_limit is not None else 'none'}, rate "
                 + (f"{b.rate_limit}/{b.rate_window_s:g}s" if b.rate_limit else "none")
                 + f", backoff {b.backoff_initial_s:g}s..{b.backoff_max_s:g}s, disruptions "
                 + ("free" if b.disruptions_free else "counted"))
    if cfg.worker_template is None:
        lines.append("workers: created elsewhere (no SUPERVISOR_WORKER_TEMPLATE); a failed "
                     "worker is dropped, never replaced")
    else:
        workers = fleet.workers_for(cfg.np, cfg.slots_per_worker)
        lines.append(f"workers: {workers} created and replaced by the supervisor from "
                     f"{cfg.worker_template_file}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    if args.command in ("status", "scale"):
        return operate_command(args)
    try:
        cfg = load_config(env)
    except ConfigError as e:
        for problem in e.problems:
            print(f"elastic-supervisor: {problem}", file=sys.stderr)
        return ExitCode.CONFIG
    command = _command(args.cmd)
    if args.command == "explain":
        print(explain(cfg, command))
        return ExitCode.OK
    if not command:
        print("elastic-supervisor: run needs the training command: "
              "elastic-supervisor run -- python train.py ...", file=sys.stderr)
        return ExitCode.CONFIG
    return run(cfg, command, env)


def operate_command(args: argparse.Namespace) -> int:
    """`status` / `scale`: read or record, with the user's kubeconfig; never the launcher."""
    if not args.job:
        print("elastic-supervisor: --job is required (or set SUPERVISOR_JOB_NAME)",
              file=sys.stderr)
        return ExitCode.CONFIG
    namespace = args.namespace or kube.kubeconfig_namespace() or "default"
    try:
        api = kube.make_api_client()
    except kube.KubeError as e:
        print(f"elastic-supervisor: {e}", file=sys.stderr)
        return ExitCode.KUBE_FATAL
    try:
        if args.command == "scale":
            return scale_command(api, args.job, namespace, args)
        while True:
            s = job_status(api, args.job, namespace)
            text = (json.dumps(s, indent=2) if args.output == "json" else operate.render(s))
            if not args.watch:
                print(text)
                return ExitCode.OK
            print("\033[H\033[J" + text, flush=True)
            time.sleep(2)
    except kube.KubeError as e:
        print(f"elastic-supervisor: {e}", file=sys.stderr)
        return ExitCode.KUBE_FATAL
    except KeyboardInterrupt:
        return ExitCode.OK
    finally:
        api.close()


def job_status(api: Any, job: str, namespace: str) -> dict[str, Any]:
    pods = kube.list_pods(api, namespace, DEFAULT_SELECTOR.format(job=job))
    state, _ = kube.StateStore(api, namespace, fleet.state_name(job), None).load()
    scale, _ = kube.StateStore(api, namespace, fleet.scale_name(job), None,
                               key=fleet.SCALE_KEY).load()
    return operate.status(job, namespace, pods=pods, state=state, scale=scale,
                          events=kube.list_events(api, namespace))


def scale_command(api: Any, job: str, namespace: str, args: argparse.Namespace) -> int:
    state, _ = kube.StateStore(api, namespace, fleet.state_name(job), None).load()
    if state is None or "limits" not in state:
        print(f"elastic-supervisor: no supervisor state for job {job} in {namespace} "
              f"(configmap {fleet.state_name(job)}): scaling needs a running supervisor that "
              "owns its workers (SUPERVISOR_WORKER_TEMPLATE)", file=sys.stderr)
        return ExitCode.CONFIG
    store = kube.StateStore(api, namespace, fleet.scale_name(job), None, key=fleet.SCALE_KEY)
    current, rv = store.load()
    # --add / --remove count from what the supervisor keeps now: after a rollback or a
    # dropped worker that is less than the last request.
    have = int(state.get("desiredWorkers", (current or {}).get("workers", 0)))
    try:
        want = operate.target_workers(have, workers=args.workers, add=args.add,
                                      remove=args.remove)
        operate.check_range(want, state["limits"])
    except operate.ScaleError as e:
        print(f"elastic-supervisor: scale {job}: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        store.save({"workers": want, "requestedAt": time.time()}, rv)
    except kube.Conflict:
        print(f"elastic-supervisor: scale {job}: another scale request was recorded meanwhile; "
              "run `status` and try again", file=sys.stderr)
        return ExitCode.CONFIG
    print(f"{job}: desired workers {have} -> {want} (configmap {namespace}/"
          f"{fleet.scale_name(job)}); the running supervisor applies it within a second")
    return ExitCode.OK


def _preflight(cfg: Config) -> list[str]:
    """Return problems with the files `run` relies on (one line each)."""
    problems = []
    script = cfg.discovery_script
    if not (script.is_file() and os.access(script, os.X_OK)):
        problems.append(f"SUPERVISOR_DISCOVERY_SCRIPT={str(script)!r}: expected an executable "
                        "file (the shipped discover_hosts.sh)")
    try:
        cfg.discovery_file.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(cfg.discovery_file.parent, os.W_OK):
            raise PermissionError("not writable")
    except OSError as e:
        problems.append(f"SUPERVISOR_DISCOVERY_FILE={str(cfg.discovery_file)!r}: its directory "
                        f"cannot be written ({e})")
    return problems


def run(cfg: Config, command: Sequence[str], env: Mapping[str, str]) -> int:
    """Build the adapters and the loop, run it, and return the process exit code."""
    log = make_logger(cfg.log_format, cfg.log_level, job=cfg.job_name)
    if problems := _preflight(cfg):
        for p in problems:
            print(f"elastic-supervisor: {p}", file=sys.stderr)
        return ExitCode.CONFIG
    metrics = make_metrics()
    if cfg.metrics_port:
        try:
            serve(metrics, cfg.metrics_port)
        except OSError as e:
            print(f"elastic-supervisor: SUPERVISOR_METRICS_PORT={cfg.metrics_port}: cannot "
                  f"listen ({e}); set another port or 0 to disable", file=sys.stderr)
            return ExitCode.CONFIG
    try:
        channel = HookChannel(cfg.fence_port, dead_file=dead_file(cfg),
                              worker_hook=cfg.worker_hook).start()
    except OSError as e:
        print(f"elastic-supervisor: SUPERVISOR_FENCE_PORT={cfg.fence_port}: cannot listen "
              f"(UDP: {e}); set another port or 0 for any free one", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        return _run(cfg, command, env, log=log, metrics=metrics, channel=channel)
    finally:
        channel.close()


def dead_file(cfg: Config) -> Path:
    """The hosts declared dead, for horovodrun's driver: next to the discovery file."""
    return cfg.discovery_file.with_name(cfg.discovery_file.name + ".dead")


def _run(cfg: Config, command: Sequence[str], env: Mapping[str, str], *, log: Any,
         metrics: Any, channel: HookChannel) -> int:
    try:
        api = kube.make_api_client()
    except kube.KubeError as e:
        log.error("kube.fatal", reason=str(e))
        return ExitCode.KUBE_FATAL

    def event_failed(err: kube.KubeError) -> None:
        log.warning("event.failed", reason=str(err), retryable=err.retryable)

    # Events regard the launcher pod; without one (a local run), the job's launcher Job.
    regarding = {"apiVersion": "batch/v1", "kind": "Job", "namespace": cfg.namespace,
                 "name": cfg.job_name}
    if cfg.pod_name:
        try:
            regarding = kube.pod_reference(api, cfg.namespace, cfg.pod_name)
        except kube.KubeError as e:
            log.warning("event.no_regarding", pod=cfg.pod_name, reason=str(e))
    instance = cfg.pod_name or f"{cfg.job_name}-{socket.gethostname()}"
    recorder = kube.EventRecorder(api, cfg.namespace, regarding=regarding, instance=instance,
                                  on_error=event_failed)

    owner = regarding if regarding.get("kind") == "Pod" else None
    store = kube.StateStore(api, cfg.namespace, fleet.state_name(cfg.job_name), owner)
    workers, rv = None, None
    if cfg.worker_template is not None:
        try:
            workers, rv = load_fleet(cfg, store)
        except (kube.KubeError, ValueError) as e:
            log.error("kube.fatal", reason=str(e))
            recorder.record(EventSpec("Warning", "KubernetesAccessDenied"
                                      if isinstance(e, kube.Forbidden) else "StateDamaged",
                                      "Start", str(e)))
            recorder.close()
            api.close()
            return ExitCode.KUBE_FATAL
    actuator = Actuator(kube.Pods(api, cfg.namespace), store, resource_version=rv,
                        writer=f"{instance}/{os.getpid()}", sink=lambda _: None)
    proc.become_subreaper()
    leases = NodeLeases() if cfg.node_lease_s is not None else None
    sup = Supervisor(cfg, log=log, metrics=metrics, events=recorder.record,
                     start_child=proc.Child.start, base_env=env, act=actuator.submit,
                     kill_ssh_clients=proc.kill_ssh_clients,
                     count_ssh_clients=lambda pid, host: len(proc.ssh_clients_for(pid, host)),
                     channel=channel,
                     workers=workers, owner=owner, leases=leases)
    actuator.sink = sup.submit
    actuator.start()
    settings = kube.WatchSettings(read_timeout_s=cfg.watch_read_timeout_s)
    reflectors = [
        kube.Reflector(kind, kube.lister(api, kind, cfg.namespace, cfg.worker_selector),
                       sup.submit, settings, transform=slim)
        for kind in (Kind.POD, Kind.NODE)
    ]
    reflectors.append(kube.Reflector(
        Kind.SCALE, kube.lister(api, Kind.SCALE, cfg.namespace,
                                f"metadata.name={fleet.scale_name(cfg.job_name)}"),
        sup.submit, settings, transform=slim))
    if leases is not None:
        # Not part of the view: renewals (every 10 s per node) must not wake the loop; it
        # reads the ages on its tick. A broken lease watch only switches this signal off.
        def lease_news(item: object) -> None:
            leases.submit(item)
            if isinstance(item, SourceState) and item.fatal:  # e.g. 403: the option cannot work
                sup.submit(item)

        reflectors.append(kube.Reflector(
            Kind.LEASE, kube.lister(api, Kind.LEASE, cfg.namespace, ""), lease_news,
            settings, transform=slim))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sup.handle_signal)
    log.info("supervisor.started", version=__version__, namespace=cfg.namespace,
             selector=cfg.worker_selector, np=cfg.np, min_np=cfg.min_np, max_np=cfg.max_np)
    for r in reflectors:
        r.start()
    watcher = None
    if cfg.policy_file is not None:
        watcher = PolicyWatcher(
            cfg.policy_file, parse=lambda: load_config(env).policy, sink=sup.submit,
            clock=time.monotonic,
            problems_of=lambda e: tuple(e.problems) if isinstance(e, ConfigError) else (
                f"{type(e).__name__}: {e}",)).start()
    try:
        outcome = sup.run(command)
    except Exception as e:  # a bug: report it once, clean up, exit distinctly
        log.exception("supervisor.crashed", error=str(e))
        if sup.state.child is not None:
            sup.state.child.kill_tree()
        outcome_code = ExitCode.INTERNAL
    else:
        log.info("supervisor.exited", code=outcome.code, reason=outcome.reason)
        outcome_code = outcome.code
    finally:
        if watcher is not None:
            watcher.stop()
        for r in reflectors:
            r.stop()
        if abandoned := actuator.close():
            log.warning("actuator.abandoned", operations=abandoned)
        recorder.close()
        api.close()
    return int(outcome_code)


def load_fleet(cfg: Config, store: kube.StateStore) -> tuple[fleet.Fleet, str | None]:
    """Return the stored fleet (or a new one) and its resourceVersion; raise KubeError or
    ValueError naming the ConfigMap when the stored state cannot be used."""
    stored, rv = store.load()
    if stored is None:
        return fleet.initial(fleet.workers_for(cfg.np, cfg.slots_per_worker)), None
    try:
        return fleet.fleet_from_dict(stored), rv
    except ValueError as e:
        raise ValueError(f"configmap {cfg.namespace}/{store.name}: {store.KEY}: {e}; fix or "
                         "delete it deliberately (deleting resets the restart budgets)") from e


if __name__ == "__main__":
    sys.exit(main())
