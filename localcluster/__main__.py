"""`python -m localcluster up`: start the local control plane and keep it until Ctrl-C.
`python -m localcluster demo`: the main job with scripted faults (localcluster/demo.py).
`python -m localcluster images`: build the images, or take them from the cache, and print
image name -> tarball lines (localcluster/images.py)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from localcluster import demo, images
from localcluster.controlplane import ControlPlane, ControlPlaneError, Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run the control plane until Ctrl-C / SIGTERM")
    up.add_argument("--node-grace", type=int, default=8,
                    help="node-monitor grace period in seconds (default 8)")
    up.add_argument("--keep", action="store_true", help="keep the work directory on exit")
    sub.add_parser("demo", help="run the main job with scripted faults (make demo)")
    sub.add_parser("images", help="build the images (cached), print name -> tarball (make images)")
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "demo":
        return demo.main(rest)
    if args.cmd == "images":
        return images.main(rest)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cp = ControlPlane(Settings(node_monitor_grace_period_s=args.node_grace))
    try:
        cp.start()
    except ControlPlaneError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    print(f"control plane up at {cp.server} (work dir {cp.workdir})")
    print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
    print("Ctrl-C to stop", flush=True)
    code = 0
    try:
        while not stop.wait(1.0):
            cp.check_alive()
    except ControlPlaneError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        code = 1
    finally:
        cp.stop(keep_dir=True if args.keep else None)
    print("control plane stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
