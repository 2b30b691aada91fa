"""`run` and `explain` (supervisor.cli parses them): builds the pieces of the supervisor from
the configuration (checked first by preflight.py), supervises horovodrun, maps outcomes to exit
codes.

`run -- CMD...`  supervise horovodrun running CMD (the launcher container's entrypoint);
`explain [-- CMD...]`  print the effective configuration and the exact horovodrun argv.
Both exit 2 with one line per problem when the configuration is bad. Exit codes: see
supervisor.model.ExitCode and the README.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from supervisor import (
    __version__,
    cleanup,
    hookmap,
    kube,
    model,
    preflight,
    proc,
    sidecar,
    startup,
)
from supervisor.actuator import Actuator
from supervisor.channel import HookChannel
from supervisor.collector import Collector
from supervisor.config import Config, ConfigError, Mode, SshHostKeys
from supervisor.decide import fleet
from supervisor.hook.elastic_supervisor_hook import KEY_ENV, PORT_ENV, RUN_ENV
from supervisor.hook.elastic_supervisor_hook.owner import OWNER_ENV
from supervisor.leader import LeaderElector, lease_name
from supervisor.logs import make_logger
from supervisor.loop import Supervisor
from supervisor.metrics import make_metrics, serve
from supervisor.model import EventSpec, ExitCode
from supervisor.nodeleases import NodeLeases
from supervisor.observe import Kind, slim
from supervisor.reload import PolicyWatcher


def _command(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def main(args: argparse.Namespace) -> int:
    """`run` / `explain`: the configuration from the environment, then the supervisor."""
    env = dict(os.environ)
    try:
        cfg = preflight.load_config(env)
    except ConfigError as e:
        for problem in e.problems:
            print(f"elastic-supervisor: {problem}", file=sys.stderr)
        return ExitCode.CONFIG
    command = _command(args.cmd)
    if args.command == "explain":
        print(preflight.explain(cfg, command))
        return ExitCode.OK
    if cfg.mode == Mode.SIDECAR:
        if command:
            print("elastic-supervisor: SUPERVISOR_MODE=sidecar: run takes no training command "
                  f"(got {shlex.join(command)!r}): it is the training container's, which runs "
                  f"{sidecar.wrapper(cfg.shared_dir)} with it as its args", file=sys.stderr)
            return _stopped_with(cfg, ExitCode.CONFIG)
        return run_sidecar(cfg, env)
    if not command:
        print("elastic-supervisor: run needs the training command: "
              "elastic-supervisor run -- python train.py ...", file=sys.stderr)
        return ExitCode.CONFIG
    return run(cfg, command, env)


def _stopped_with(cfg: Config, code: int) -> int:
    """Sidecar mode: hand the job's exit code to es-run (best effort) and return it."""
    try:
        sidecar.Link(cfg.shared_dir).stop(code)
    except OSError as e:
        print(f"elastic-supervisor: SUPERVISOR_SHARED_DIR={str(cfg.shared_dir)!r}: cannot hand "
              f"es-run the exit code {code} ([Errno {e.errno}] {e.strerror})", file=sys.stderr)
    return code


WRAPPER_EXIT_WAIT_S = 30.0  # after the stop: how long es-run may take to see it and exit


def run_sidecar(cfg: Config, env: Mapping[str, str]) -> int:
    """`run` in sidecar mode: the job's outcome goes to es-run, which exits with it (the pod's
    result is the training container's). A sidecar started again after the job ended (its
    restartPolicy is Always) only waits for the pod to stop."""
    link = sidecar.Link(cfg.shared_dir)
    if not os.path.ismount(cfg.shared_dir):  # an emptyDir is a mount in the container
        print(f"elastic-supervisor: SUPERVISOR_SHARED_DIR={str(cfg.shared_dir)!r}: not mounted "
              "in this container; mount there the emptyDir the training container mounts, "
              "filled by `elastic-supervisor install` in an init container", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        link.announce()
    except OSError as e:
        print(f"elastic-supervisor: SUPERVISOR_SHARED_DIR={str(cfg.shared_dir)!r}: cannot be "
              f"written ([Errno {e.errno}] {e.strerror}); mount the emptyDir the training "
              "container mounts there, filled by `elastic-supervisor install` in an init "
              "container", file=sys.stderr)
        return ExitCode.CONFIG
    stopping = startup.Stopping()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping.handle)
    if (ended := link.stopped()) is not None:
        print(f"elastic-supervisor: the job ended already with {ended} (es-run has it); "
              "waiting for the pod to stop", file=sys.stderr)
        while not stopping.wait(3600):
            pass
        return ExitCode.OK
    code = run(cfg, [], env, link=link)
    _stopped_with(cfg, code)
    for sig in (signal.SIGTERM, signal.SIGINT):  # the loop's handlers are gone with it
        signal.signal(sig, stopping.handle)
    end = time.monotonic() + WRAPPER_EXIT_WAIT_S
    while link.wrapper_alive() and time.monotonic() < end and not stopping.wait(0.1):
        pass
    return code


def run(cfg: Config, command: Sequence[str], env: Mapping[str, str],
        link: sidecar.Link | None = None) -> int:
    """Build the adapters and the loop, run it, and return the process exit code. `link`:
    sidecar mode (the command comes from es-run)."""
    log = make_logger(cfg.log_format, cfg.log_level, job=cfg.job_name)
    if problems := preflight.problems(cfg):
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
    # Sidecar mode: a horovodrun started for an earlier supervisor of this pod (it died, the
    # kubelet started this one) goes on under this one, on the same channel; one that exited
    # meanwhile is adopted as exited: its code is the job's (never trained again).
    running = link.running() if link is not None else None
    port = cfg.fence_port or (_env_int(running.env, PORT_ENV) if running is not None else 0)
    try:
        channel = HookChannel(port, dead_file=dead_file(cfg),
                              worker_hook=cfg.worker_hook, key_file=cfg.hook_key_file,
                              log=log,
                              **({"hook_dir": sidecar.hook_dir(cfg.shared_dir)} if link
                                 else {}))
    except OSError as e:
        print(f"elastic-supervisor: SUPERVISOR_FENCE_PORT={cfg.fence_port}: cannot listen "
              f"(UDP: {e}); set another port or 0 for any free one", file=sys.stderr)
        return ExitCode.CONFIG
    if running is not None and running.code is None and not sidecar.owned(running.pid,
                                                                          running.marker):
        log.warning("sidecar.pid_not_ours", pid=running.pid, why="the run directory names a "
                    "process that is not a horovodrun es-run started: not adopted, not killed")
        running = None
    if running is not None and running.code is None:
        try:
            channel.adopt(running.env.get(RUN_ENV, ""), running.env.get(KEY_ENV))
        except ValueError as e:
            log.warning("sidecar.not_adoptable", pid=running.pid, reason=str(e))
            running = None
    # Received only now: a heartbeat of the run taken before would be of another run (told
    # to exit).
    channel.start()
    try:
        return _run(cfg, command, env, log=log, metrics=metrics, channel=channel, link=link,
                    running=running)
    finally:
        channel.close()


def dead_file(cfg: Config) -> Path:
    """The hosts declared dead, for horovodrun's driver: next to the discovery file."""
    return cfg.discovery_file.with_name(cfg.discovery_file.name + ".dead")


def _env_int(env: Mapping[str, str], key: str) -> int:
    value = env.get(key, "")
    return int(value) if value.isdigit() else 0


def _run(cfg: Config, command: Sequence[str], env: Mapping[str, str], *, log: Any,
         metrics: Any, channel: HookChannel, link: sidecar.Link | None = None,
         running: sidecar.Running | None = None) -> int:
    """The start sequence (supervisor.startup), then the loop; map every way out to a code."""
    try:
        api = kube.make_api_client()
    except kube.KubeError as e:
        log.error("kube.fatal", reason=str(e))
        return ExitCode.KUBE_FATAL
    stopping = startup.Stopping()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping.handle)
    instance = cfg.pod_name or f"{cfg.job_name}-{socket.gethostname()}"
    identity = f"{instance}/{os.getpid()}"
    retry = startup.ApiRetry(cfg.start_timeout_s, log=log, stopping=stopping)
    leadership = startup.Relay()  # the elector thread's news, held until the loop runs
    elector = LeaderElector(kube.Leases(api, cfg.namespace, cfg.api_timeout_s),
                            lease_name(cfg.job_name), identity, cfg.leader_lease_s,
                            api_timeout_s=cfg.api_timeout_s,
                            on_lost=lambda why: leadership(model.LeadershipLost(why)),
                            on_paused=lambda why: leadership(model.LeadershipPaused(why)),
                            on_resumed=lambda s: leadership(model.LeadershipResumed(s)),
                            # sidecar mode: a dead supervisor of this pod is seen to be dead
                            gone=(functools.partial(sidecar.holder_gone, instance=instance)
                                  if link is not None else lambda _: False))

    def event_failed(err: kube.KubeError) -> None:
        log.warning("event.failed", reason=str(err), retryable=err.retryable)

    recorder = None
    try:
        regarding, owner, pod = startup.references(cfg, api, retry)
        if link is not None:
            _as_sidecar(cfg, pod, log=log)
        recorder = kube.EventRecorder(api, cfg.namespace, regarding=regarding,
                                      instance=instance, on_error=event_failed,
                                      timeout_s=cfg.api_timeout_s)
        startup.lead(cfg, elector, retry, stopping, log=log, events=recorder.record)
        elector.start()
        if link is not None:
            cfg = _with_hook(cfg, api, owner, retry, log=log)
        store = kube.StateStore(api, cfg.namespace, fleet.state_name(cfg.job_name), owner,
                                timeout_s=cfg.api_timeout_s, window=elector.window)
        workers, rv, stored = None, None, None
        if cfg.worker_template is not None:
            workers, rv, stored = retry.call("read the state",
                                             lambda: startup.load_fleet(cfg, store))
            if cleanup.already_succeeded(stored, owner):
                # A standby whose leader ended the job with success: done, not trained again.
                log.info("leader.job_succeeded", job=cfg.job_name)
                recorder.record(EventSpec("Normal", "AlreadySucceeded", "Start",
                                          f"job {cfg.job_name} already succeeded under another "
                                          "launcher: exiting 0"))
                return ExitCode.OK
            rv = startup.adopt(cfg, api, store, stored, rv, owner=owner, identity=identity,
                               retry=retry, log=log, events=recorder.record)
            rejected = startup.dry_run_template(
                cfg, kube.Pods(api, cfg.namespace, cfg.api_timeout_s), owner=owner,
                retry=retry, log=log)
            if rejected is not None:
                print(f"elastic-supervisor: {rejected}", file=sys.stderr)
                recorder.record(EventSpec("Warning", "TemplateRejected", "Start", rejected))
                return ExitCode.CONFIG
        stopping.check()
        adopted, base_env = None, env
        if link is not None:
            # horovodrun gets the training container's environment there, not ours.
            command, base_env = _wrapped_command(cfg, link, stopping, log=log,
                                                 events=recorder.record, running=running), {}
            if running is not None:
                adopted = sidecar.RemoteChild.adopt(link, running)
        return _supervise(cfg, command, base_env, api=api, log=log, metrics=metrics,
                          channel=channel, recorder=recorder, elector=elector,
                          leadership=leadership, stopping=stopping, store=store,
                          workers=workers, rv=rv, identity=identity, owner=owner,
                          stored=stored, link=link, adopted=adopted, config_env=env)
    except startup.Stopped as e:
        log.info("start.stopped", signal=e.signum, leader=elector.is_leader())
        return 128 + e.signum
    except startup.StartTimedOut as e:
        log.error("start.timeout", reason=str(e))
        if recorder is not None:
            recorder.record(EventSpec("Warning", "StartTimeout", "Start", str(e)))
        return ExitCode.START_TIMEOUT
    except (startup.LauncherMissing, PodUnfit) as e:
        print(f"elastic-supervisor: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    except (kube.KubeError, ValueError) as e:
        log.error("state.damaged" if isinstance(e, kube.Damaged | ValueError) else "kube.fatal",
                  reason=str(e))
        if recorder is not None:
            recorder.record(EventSpec("Warning", "KubernetesAccessDenied"
                                      if isinstance(e, kube.Forbidden) else "StateDamaged",
                                      "Start", str(e)))
        return ExitCode.KUBE_FATAL
    finally:
        if elector.release():
            log.info("leader.released", lease=elector.name)
        if recorder is not None:
            recorder.close()
        api.close()


class PodUnfit(Exception):
    """Sidecar mode: the launcher pod lacks what the mode needs (exit 2, one line each)."""


def _as_sidecar(cfg: Config, pod: Mapping[str, Any] | None, *, log: Any) -> sidecar.Sidecar:
    """Check the launcher pod for sidecar mode; return what was found. Raise PodUnfit."""
    if pod is None:
        raise PodUnfit("SUPERVISOR_MODE=sidecar: SUPERVISOR_POD_NAME is not set; expected the "
                       "launcher pod's own name (downward API metadata.name)")
    problems, found = sidecar.pod_problems(pod, cfg.shared_dir)
    if found is None:
        raise PodUnfit("\nelastic-supervisor: ".join(problems))
    log.info("sidecar.found", container=found.container, image=found.image,
             training_container=found.wrapped, volume=found.volume)
    return found


def _with_hook(cfg: Config, api: Any, owner: Mapping[str, str] | None,
               retry: startup.ApiRetry, *, log: Any) -> Config:
    """Sidecar mode, once leader: put this supervisor's own hook in a ConfigMap of its own and
    return the configuration whose worker template mounts it (supervisor.hookmap.with_hook)."""
    if cfg.worker_template is None:
        return cfg
    files = {path: src.read_text() for path, src in sidecar.hook_sources().items()}
    bytecode = hookmap.hook_bytecode(files)
    body = hookmap.hook_configmap(cfg.job_name, files, owner, bytecode)
    made = retry.call("create the hook's ConfigMap", lambda: kube.create_config_map(
        api, cfg.namespace, body, cfg.api_timeout_s))
    name = made["metadata"]["name"]
    log.info("sidecar.hook_configmap", configmap=name, files=len(files),
             sha256=body["metadata"]["annotations"][hookmap.HOOK_DIGEST],
             bytecode=sys.implementation.cache_tag)
    return replace(cfg, worker_template=hookmap.with_hook(
        cfg.worker_template, name, [*files, *bytecode], cfg.shared_dir))


def _wrapped_command(cfg: Config, link: sidecar.Link, stopping: startup.Stopping, *,
                     log: Any, events: Callable[[EventSpec], None],
                     running: sidecar.Running | None) -> list[str]:
    """The training command es-run was given. A horovodrun an earlier supervisor of this pod
    left running that is not `running` (adopted) is killed first: nobody would supervise it."""
    left = link.running()
    if left is not None and left.code is None and not sidecar.owned(left.pid, left.marker):
        left = None  # said at the adoption (sidecar.pid_not_ours): never killed
    if left is not None and (running is None or left.pid != running.pid):
        killed = sidecar.kill_tree(left.pid, left.marker)
        log.warning("sidecar.leftover_killed", pid=left.pid, processes=killed)
        events(EventSpec("Warning", "HorovodrunLeftoverKilled", "Start",
                         f"horovodrun (pid {left.pid}) started for an earlier supervisor of "
                         "this pod could not be adopted: killed, started again"))
    command = sidecar.wait_for_command(link, stopping=stopping.wait,
                                       timeout_s=cfg.start_timeout_s)
    stopping.check()
    if command is None:
        raise startup.StartTimedOut(
            f"es-run ({sidecar.wrapper(cfg.shared_dir)}) did not start in the training "
            f"container within SUPERVISOR_START_TIMEOUT_SECONDS={cfg.start_timeout_s:g}")
    log.info("sidecar.command", command=command)
    return command


def _supervise(cfg: Config, command: Sequence[str], env: Mapping[str, str], *, api: Any,
               log: Any, metrics: Any, channel: HookChannel, recorder: kube.EventRecorder,
               elector: LeaderElector, leadership: startup.Relay, stopping: startup.Stopping,
               store: kube.StateStore, workers: fleet.Fleet | None, rv: str | None,
               identity: str, owner: Mapping[str, str] | None,
               stored: Mapping[str, Any] | None = None, link: sidecar.Link | None = None,
               adopted: sidecar.RemoteChild | None = None,
               config_env: Mapping[str, str]) -> int:
    """Run the loop as the job's leader; clean up (CLEAN_POD_POLICY) on the way out. `env`:
    horovodrun's base environment; `config_env`: the supervisor's own, which the policy is
    parsed from again."""
    # Each write's timeout ends at the leader's renew deadline (elector.window): none lands
    # after a standby may have taken the job over (the StateStore's too: _run).
    actuator = Actuator(kube.Pods(api, cfg.namespace, cfg.api_timeout_s, elector.window), store,
                        resource_version=rv, writer=identity, sink=lambda _: None,
                        may_act=elector.is_leader,
                        budgets=kube.Budgets(api, cfg.namespace, cfg.api_timeout_s,
                                             elector.window),
                        secrets=(kube.Secrets(api, cfg.namespace, cfg.api_timeout_s,
                                              elector.window)
                                 if cfg.ssh_host_keys == SshHostKeys.WORKER else None))
    proc.become_subreaper()
    collector = Collector(lambda gen, s: metrics.gc_pause.labels(str(gen)).observe(s))
    leases = NodeLeases() if cfg.node_lease_s is not None else None
    sup = Supervisor(cfg, log=log, metrics=metrics, events=recorder.record,
                     start_child=(proc.Child.start if link is None else functools.partial(
                         sidecar.RemoteChild.start, link)),
                     # The leader's term: its horovodruns' training processes claim their
                     # workers with it, and those of a supervisor that lost the job to this
                     # one die (hook owner.py): never two horovodruns' training on a worker.
                     base_env={**env, OWNER_ENV: elector.term()},
                     act=actuator.submit,
                     kill_ssh_clients=proc.kill_ssh_clients,
                     count_ssh_clients=lambda pid, host: len(proc.ssh_clients_for(pid, host)),
                     channel=channel, collector=collector,
                     workers=workers, owner=owner, leases=leases, stored=stored)
    actuator.sink = sup.submit
    actuator.start()
    leadership.attach(sup.submit)
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
            # A fatal one (e.g. 403: the option cannot work) ends the run through the loop.
            if isinstance(item, model.SourceState) and item.fatal:
                sup.submit(item)

        reflectors.append(kube.Reflector(
            Kind.LEASE, kube.lister(api, Kind.LEASE, cfg.namespace, ""), lease_news,
            settings, transform=slim))

    def resumed(paused_s: float) -> None:
        # The connections may have died silently through the same outage (a partition): the
        # writes held meanwhile must not wait out their timeout on one, and the watches resume
        # at once, so what changed meanwhile is reconciled now.
        kube.drop_connections(api)
        for r in reflectors:
            r.reconnect()
        leadership(model.LeadershipResumed(paused_s))

    elector.on_resumed = resumed
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sup.handle_signal)
    if stopping.signum is not None:  # arrived between the start and the handlers above
        sup.handle_signal(stopping.signum)
    if link is not None:
        # es-run got the pod's stop signal (the supervisor's own comes last): ours to handle.
        threading.Thread(target=_relay_signals, args=(link, sup.handle_signal),
                         name="sidecar-signals", daemon=True).start()
    log.info("supervisor.started", version=__version__, mode=cfg.mode.value,
             namespace=cfg.namespace, selector=cfg.worker_selector, np=cfg.np,
             min_np=cfg.min_np, max_np=cfg.max_np)
    watcher = None
    if cfg.policy_file is not None:
        # Before the watches: the policy the file holds now (a standby read it at its start,
        # maybe hours ago) is the loop's first trigger, ahead of any failure it would judge.
        watcher = PolicyWatcher(
            cfg.policy_file, parse=lambda: preflight.load_config(config_env).policy,
            sink=sup.submit, clock=time.monotonic, current=cfg.policy,
            problems_of=lambda e: tuple(e.problems) if isinstance(e, ConfigError) else (
                f"{type(e).__name__}: {e}",)).start()
    for r in reflectors:
        r.start()
    collector.install()
    try:
        outcome = sup.run(command, adopted)
    except Exception as e:  # a bug: report it once, clean up, exit distinctly
        log.exception("supervisor.crashed", error=str(e))
        if sup.horovodrun.child is not None:
            sup.horovodrun.child.kill_tree()
        outcome_code = ExitCode.INTERNAL
    else:
        log.info("supervisor.exited", code=outcome.code, reason=outcome.reason)
        outcome_code = outcome.code
    finally:
        collector.uninstall()
        if watcher is not None:
            watcher.stop()
        for r in reflectors:
            r.stop()
        if abandoned := actuator.close():
            log.warning("actuator.abandoned", operations=abandoned)
        if cfg.worker_template is not None and elector.is_leader():
            cleanup.clean_up(cfg, api, store, int(outcome_code), owner=owner, log=log,
                     events=recorder.record)
    return int(outcome_code)


def _relay_signals(link: sidecar.Link, handle: Callable[[int], None]) -> None:
    while True:
        if (signum := link.take_signal()) is not None:
            handle(signum)
        time.sleep(sidecar.POLL_S * 2)


