"""Command line: parses arguments, maps outcomes to exit codes; `status` and `scale` here.

`run -- CMD...`  supervise horovodrun running CMD (the launcher container's entrypoint);
`explain [-- CMD...]`  print the effective configuration and the exact horovodrun argv;
`status` / `scale`  read a job's state / record its desired size, with the user's kubeconfig;
`timeline`  draw a job's world size, step rate and incidents into a PNG (supervisor.timeline,
            timeline_png).
Both exit 2 with one line per problem when the configuration is bad. Exit codes: see
supervisor.model.ExitCode and docs/operating.md. `run` and `explain` are supervisor.runner, imported
only for them: `status` is a command a user waits for, and must not import the whole supervisor.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from supervisor import __version__, kube, operate
from supervisor.config import DEFAULT_SELECTOR
from supervisor.decide import fleet
from supervisor.model import ExitCode


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
    install = sub.add_parser("install", help="sidecar mode: put the wrapper es-run, the "
                             "discovery script and the hook into DIR (an emptyDir)")
    install.add_argument("dir", type=Path, metavar="DIR")
    status = sub.add_parser("status", help="show a job's workers, budgets and last decisions "
                            "(reads the cluster with your kubeconfig)")
    scale = sub.add_parser("scale", help="record the desired worker count; the running "
                           "supervisor applies it within a second")
    drawing = sub.add_parser("timeline", help="draw a job's world size, step rate and "
                             "incidents by phase into a PNG (reads the cluster with your "
                             "kubeconfig)")
    for p in (status, scale, drawing):
        p.add_argument("--job", default=os.environ.get("SUPERVISOR_JOB_NAME"),
                       help="job name (default: $SUPERVISOR_JOB_NAME)")
        p.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    drawing.add_argument("-o", "--output", dest="png", type=Path, metavar="FILE",
                         help="the PNG to write (default: <job>-timeline.png)")
    status.add_argument("--watch", action="store_true", help="refresh every 2 s until Ctrl-C")
    status.add_argument("--output", choices=("table", "json"), default="table")
    how = scale.add_mutually_exclusive_group(required=True)
    how.add_argument("--workers", type=int, metavar="N", help="scale to N workers")
    how.add_argument("--add", type=int, metavar="K", help="add K workers (scale out)")
    how.add_argument("--remove", type=int, metavar="K", help="remove K workers (scale in)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("status", "scale", "timeline"):
        return operate_command(args)
    if args.command == "install":
        return install_command(args.dir)
    # The supervisor proper is imported for run and explain only: `status` answers within a
    # second at 1,000 workers, a fifth of which its modules took to import (bench/status.py).
    from supervisor import runner  # noqa: PLC0415
    return runner.main(args)


def install_command(dest: Path) -> int:
    """`install DIR`: what a training container needs from the supervisor in sidecar mode
    (supervisor.sidecar), copied into the shared emptyDir by an init container."""
    from supervisor import sidecar  # noqa: PLC0415 (psutil: not for status)
    from supervisor.config import packaged_discovery_script  # noqa: PLC0415
    try:
        written = sidecar.install(dest, packaged_discovery_script())
    except OSError as e:
        print(f"elastic-supervisor: install {str(dest)!r}: cannot write there ([Errno {e.errno}] "
              f"{e.strerror}); mount a writable emptyDir at it", file=sys.stderr)
        return ExitCode.CONFIG
    print(f"elastic-supervisor: installed {len(written)} files into {dest}: "
          f"{sidecar.wrapper(dest)}, {sidecar.discovery_script(dest)}, {sidecar.hook_dir(dest)}/")
    return ExitCode.OK


def operate_command(args: argparse.Namespace) -> int:
    """`status` / `scale` / `timeline`: read or record, with the user's kubeconfig; never
    the launcher."""
    if not args.job:
        print("elastic-supervisor: --job is required (or set SUPERVISOR_JOB_NAME)",
              file=sys.stderr)
        return ExitCode.CONFIG
    if args.command == "timeline":
        from supervisor import timeline_png  # noqa: PLC0415 (not for status: see main)
        if (missing := timeline_png.renderer_missing()) is not None:
            print(f"elastic-supervisor: {missing}", file=sys.stderr)
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
        if args.command == "timeline":
            code, line = draw_timeline(args.job, namespace,
                                       *timeline_sources(api, args.job, namespace),
                                       args.png or Path(f"{args.job}-timeline.png"))
            print(line if code == ExitCode.OK else f"elastic-supervisor: {line}",
                  file=sys.stdout if code == ExitCode.OK else sys.stderr)
            return code
        with collector_paused():
            while True:
                s = job_status(api, args.job, namespace)
                text = (json.dumps(s, indent=2) if args.output == "json"
                        else operate.render(s))
                if not args.watch:
                    print(text)
                    return ExitCode.OK
                print("\033[H\033[J" + text, flush=True)
                gc.collect()  # what this refresh left in cycles, while it waits
                time.sleep(2)
    except kube.KubeError as e:
        print(f"elastic-supervisor: {e}", file=sys.stderr)
        return ExitCode.KUBE_FATAL
    except KeyboardInterrupt:
        return ExitCode.OK
    finally:
        api.close()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector meanwhile: a status at 1,000 workers is
    millions of small objects parsed from the API's JSON, none of them in a cycle, and the
    collector, run again and again while they are built, doubled the parse (bench/status.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def job_status(api: Any, job: str, namespace: str) -> dict[str, Any]:
    """The job's status from its four reads, made at once: each is mostly the API server's
    time (the workers, the state, the scale request, the supervisor's Events)."""
    with ThreadPoolExecutor(4, thread_name_prefix="status") as pool:
        pods = pool.submit(kube.list_pods, api, namespace, DEFAULT_SELECTOR.format(job=job))
        state = pool.submit(kube.StateStore(api, namespace, fleet.state_name(job), None).load)
        scale = pool.submit(kube.StateStore(api, namespace, fleet.scale_name(job), None,
                                            key=fleet.SCALE_KEY).load)
        events = pool.submit(kube.list_events, api, namespace,
                             controller=kube.REPORTING_CONTROLLER)
        return operate.status(job, namespace, pods=pods.result(), state=state.result()[0],
                              scale=scale.result()[0], events=events.result())


def timeline_sources(api: Any, job: str, namespace: str
                     ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """What `timeline` draws: the job's stored state (None if none) and the supervisor's
    Events of the namespace (supervisor.timeline picks the job's); the demo reads them the
    same way."""
    state, _ = kube.StateStore(api, namespace, fleet.state_name(job), None).load()
    return state, kube.list_events(api, namespace, controller=kube.REPORTING_CONTROLLER)


def draw_timeline(job: str, namespace: str, state: Mapping[str, Any] | None,
                  events: Sequence[Mapping[str, Any]], png: Path) -> tuple[int, str]:
    """Draw the job's timeline into `png`; return the exit code and the one line to print
    (1: nothing to draw yet, or a state that cannot be drawn; 2: no matplotlib)."""
    from supervisor import timeline, timeline_png  # noqa: PLC0415 (not for status: see main)

    where = f"configmap {namespace}/{fleet.state_name(job)}"
    if state is None:
        return 1, f"no supervisor state for job {job} in {namespace} ({where}): nothing to draw"
    try:
        drawn = timeline_png.render(timeline.plan(job, state, events), png)
    except timeline_png.RendererMissing as e:
        return ExitCode.CONFIG, str(e)
    except timeline.NoProgress as e:
        return 1, f"{e} ({where})"
    except timeline.TimelineError as e:
        return 1, f"{where}: {e}"
    return ExitCode.OK, f"wrote {png} ({len(drawn.labels)} incidents)"


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


if __name__ == "__main__":
    sys.exit(main())
