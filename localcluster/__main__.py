"""`python -m localcluster up`: a control plane with real nodes (kubelet + containerd each) until
Ctrl-C; `--nodes 0` for the control plane alone.
`python -m localcluster demo`: the main job with scripted faults (localcluster/demo.py).
`python -m localcluster images`: build the images, or take them from the cache, import them
into the nodes' image store (localcluster/images.py, localcluster/nodestore.py) and print
image name -> tarball lines."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from localcluster import demo, images, nodestore
from localcluster.controlplane import ControlPlane, ControlPlaneError, Settings
from localcluster.nodes import Cluster, ClusterError, ClusterSettings
from localcluster.tarimage import toolbox_image


def build_images() -> int:
    """Build what is missing, make the nodes' image store, print name -> tarball lines."""
    try:
        tarballs = images.build()
        nodestore.seed((images.pause()[1], toolbox_image()[1], *tarballs.values()),
                       images.Settings().cache, lambda line: print(f"images: {line}",
                                                                   file=sys.stderr))
    except (images.ImagesError, nodestore.StoreError) as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    for name, path in tarballs.items():
        print(f"{name} {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run the cluster until Ctrl-C / SIGTERM")
    up.add_argument("--nodes", type=int, default=3,
                    help="real nodes (kubelet + containerd each; default 3; 0: control plane "
                         "only, on loopback)")
    up.add_argument("--node-grace", type=int, default=20,
                    help="node-monitor grace period in seconds (default 20; the kubelets renew "
                         "their Leases every 10 s)")
    up.add_argument("--images", action="store_true",
                    help="also give every node the launcher, worker, trainer, sidecar and "
                         "TensorFlow trainer images (built and stored once, cached: "
                         "localcluster/nodestore.py)")
    up.add_argument("--keep", action="store_true", help="keep the work directory on exit")
    sub.add_parser("demo", help="run the main job with scripted faults (make demo)")
    sub.add_parser("images", help="build the images and the nodes' image store (cached), print "
                   "name -> tarball (make images)")
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "demo":
        return demo.main(rest)
    if args.cmd == "images":
        return build_images()

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.nodes > 0:
        return run_cluster(args, stop)
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


def run_cluster(args: argparse.Namespace, stop: threading.Event) -> int:
    extra = tuple(sorted(set(images.build().values()))) if args.images else ()
    cluster = Cluster(ClusterSettings(nodes=args.nodes, images=extra,
                                      node_monitor_grace_period_s=args.node_grace))
    try:
        cluster.start()
    except (ClusterError, ControlPlaneError, OSError, RuntimeError) as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    assert cluster.cp is not None
    print(f"cluster up in {cluster.timings['total_s']:.1f}s: {cluster.cp.server}, nodes "
          f"{', '.join(f'{n.name} ({n.spec.ip})' for n in cluster.nodes)}; work dir "
          f"{cluster.workdir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
    print("Ctrl-C to stop", flush=True)
    code = 0
    try:
        while not stop.wait(1.0):
            cluster.check_alive()
    except ClusterError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        code = 1
    finally:
        problems = cluster.stop(keep_dir=True if args.keep else None)
    print("cluster stopped" + (f"; host state NOT restored: {problems}" if problems else ""))
    return code or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
