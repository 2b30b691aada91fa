"""One rank of a two-process torch.distributed Gloo job for test_sever_gloo (run as a script).

rank 0: joins, posts a receive from rank 1 (its peer's send can go out at once), writes the
loopback ports its connections use (as the hook's heartbeat reports them) and waits to be
killed, its main thread standing still: the stuck rank.
rank 1: joins, waits for those ports, then cuts its connections to them with the hook's own
`severable` and `sever` (the TCP store's connection kept, as the hook keeps the rendezvous
server's) and, by CASE, posts a send to rank 0 right after the cut (`send`) or waits in a receive
from rank 0 posted before it (`recv`). It prints one JSON line: how long that took, and how it
ended.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from supervisor.hook.elastic_supervisor_hook.worker import local_endpoints, sever, severable


def main(rank: int, port: int, case: str, ports_file: Path, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout_s))
    x = torch.ones(64)
    dist.all_reduce(x)
    if rank == 0:
        dist.irecv(x, src=1)
        _, ports = local_endpoints(psutil.Process().net_connections("tcp"))
        ports_file.write_text(json.dumps(ports))
        time.sleep(3600)
    while not ports_file.exists():
        time.sleep(0.05)
    dead = [("127.0.0.1", tuple(json.loads(ports_file.read_text())))]
    pending = dist.irecv(x, src=0) if case == "recv" else None
    fds = severable(psutil.Process().net_connections("tcp"), dead, [("127.0.0.1", port)])
    cut = sever(fds)
    t = time.monotonic()
    try:
        (pending or dist.isend(x, dst=0)).wait()
        error = ""
    except RuntimeError as e:
        error = str(e)
    print(json.dumps({"cut": cut, "took_s": time.monotonic() - t, "error": error[:300]}),
          flush=True)
    os._exit(0)  # no process group teardown with a peer that never answers


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), float(sys.argv[5]))
