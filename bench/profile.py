"""Where the supervisor's time goes at N workers: py-spy on the running supervisor while pod
Ready flips arrive one at a time (the latency step of bench/discovery.py), then the hottest
frames of its main thread (the loop).

Run: .venv/bin/python -m bench.profile 10000   (py-spy: pip install the `bench` extra; the
control plane, kwok and the pods as in bench/discovery.py; about 3 minutes at 10,000)
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import audit, discovery
from localcluster import kwok
from localcluster.controlplane import Settings
from supervisor import kube


def hottest(raw: Path, top: int = 25) -> list[tuple[float, str]]:
    """(share of the loop's samples, frame) of the frames on the loop's stacks."""
    total: Counter[str] = Counter()
    n = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or not any("supervisor/loop.py" in f for f in frames):
            continue
        n += int(count)
        for f in set(frames):
            total[f] += int(count)
    return [(round(100 * c / max(1, n), 1), f) for f, c in total.most_common(top)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("workers", type=int)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/profile.txt"))
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    rng = random.Random(3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with (tempfile.TemporaryDirectory() as tmp,
          audit.AuditedControlPlane(Settings(node_monitor_grace_period_s=40)) as cp,
          kwok.Kwok(cp)):
        api = kube.make_api_client(str(cp.kubeconfig))
        api.user_agent = discovery.DRIVER_AGENT
        s = discovery.Scenario(cp, api, args.workers, Path(tmp) / "work")
        try:
            time.sleep(3)
            rec = subprocess.Popen([spy, "record", "-p", str(s.sup.pid), "-r", "200", "-f",
                                    "raw", "-o", str(args.out), "-d", str(int(args.seconds) + 3),
                                    "--nonblocking"])
            time.sleep(1)
            pods, samples = sorted(s.ips), []
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                pod = rng.choice(pods)
                for ready in (False, True):
                    samples.append(s.measure(
                        "flip", lambda pod=pod, ready=ready: s.set_ready(pod, ready),
                        lambda c, pod=pod, ready=ready: (s.line(pod) in c) == ready))
                time.sleep(0.1)
            rec.wait()
        finally:
            s.close()
            api.close()
    print(f"{args.workers} workers: startup {s.startup_s} s, latency "
          f"{discovery.percentiles(samples)}; hottest frames of the loop ({args.out}):")
    for share, frame in hottest(args.out):
        print(f"{share:6.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
