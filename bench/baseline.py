"""The baseline users have today, as a small poller: every PERIOD seconds list the job's worker
pods by label selector, keep the pods in phase Running (et-operator's host rule), and rewrite a
host file (`<pod-name>:<slots>` lines, sorted; temp file + rename) when that set changed.

What it does NOT look at, like et-operator: the pod's Ready condition, its deletionTimestamp
(a pod being deleted stays Running until the kubelet is done) and the node's health (pods on a
NotReady node stay Running). Those changes never reach its file.
The period starts after each poll ends (a requeue, not a fixed rate). One JSON line per poll
goes to stdout (perf_counter times, which are CLOCK_MONOTONIC and comparable across processes
on Linux), so the benchmark can tell which polls could have seen a change.

Run: python -m bench.baseline --kubeconfig K --namespace NS --selector S --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

USER_AGENT = "es-bench-poller"  # how the benchmark tells its requests apart in the audit log


def running_hosts(pods: Iterable[Mapping[str, Any]], slots: int = 1) -> tuple[str, ...]:
    """Return the sorted `<pod-name>:<slots>` lines of the pods in phase Running."""
    return tuple(sorted(f"{p['metadata']['name']}:{slots}" for p in pods
                        if (p.get("status") or {}).get("phase") == "Running"))


def write_atomic(path: Path, lines: Iterable[str]) -> None:
    """Replace `path` with `lines` (one per line) by writing a temp file and renaming it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{line}\n" for line in lines)
    os.replace(tmp, path)


def poll(core: client.CoreV1Api, *, namespace: str, selector: str, out: Path, slots: int,
         period_s: float, stop: threading.Event) -> None:
    """Poll until `stop` is set, writing `out` on each change and one log line per poll."""
    last: tuple[str, ...] | None = None
    while not stop.is_set():
        start = time.perf_counter()
        entry: dict[str, Any] = {"event": "poll", "start": start}
        try:
            resp = core.list_namespaced_pod(namespace, label_selector=selector,
                                            _preload_content=False)
            data = resp.data
            items = json.loads(data)["items"]
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            entry.update(end=time.perf_counter(), error=str(e)[:200])
        else:
            entry.update(end=time.perf_counter(), pods=len(items), bytes=len(data))
            hosts = running_hosts(items, slots)
            entry["running"] = len(hosts)
            if hosts != last:
                write_atomic(out, hosts)
                last = hosts
                entry["wrote"] = time.perf_counter()
        print(json.dumps(entry), flush=True)
        stop.wait(period_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--selector", required=True, help="label selector of the worker pods")
    parser.add_argument("--out", required=True, type=Path, help="the host file to maintain")
    parser.add_argument("--period", type=float, default=5.0, help="seconds between polls (5)")
    parser.add_argument("--slots", type=int, default=1, help="slots per host line (1)")
    args = parser.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    api.user_agent = USER_AGENT
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        poll(client.CoreV1Api(api), namespace=args.namespace, selector=args.selector,
             out=args.out, slots=args.slots, period_s=args.period, stop=stop)
    except KeyboardInterrupt:
        pass
    finally:
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
