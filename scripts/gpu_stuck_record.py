"""Record what the hook's heartbeats say about a rank stuck in a real GPU kernel (issue 28's
device check; run it on a machine with an NVIDIA GPU, never in CI).

Three training processes (torch.distributed over Gloo, one GPU shared) run a loop of small CUDA
kernels with a `.item()` per step and one all-reduce per step, the all-reduce timed by the hook's
own `Progress` wrapper (as the hook wraps Horovod's collectives), each with the hook's real
`Beater` (heartbeat thread) and process watcher. This process receives their datagrams on UDP,
as the supervisor's channel does, and writes each one with its arrival time (seconds since the
recording started) as a JSON line. Plan:

  healthy HEALTHY_S; rank 1 launches a kernel that spins STUCK_S (torch.cuda._sleep) and waits
  for it in `.item()` while the others wait in the all-reduce; healthy GAP_S; the same for
  rank 0; healthy GAP_S; all stop together.

A "mark" line records when each stuck kernel starts and ends (the rank's monotonic clock, the
same clock as this process's on Linux). `tests/unit/test_stuck.py` replays the recording through
the supervisor's own record keeping and verdict (heartbeats.updated, heartbeats.watched,
hang.assess).

    python3 scripts/gpu_stuck_record.py --out gpu_stuck.jsonl        # on the GPU machine
    python3 scripts/gpu_stuck_record.py --device cpu --out /tmp/x.jsonl  # plumbing check, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time

HOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "supervisor", "hook")
sys.path.insert(0, HOOK_DIR)

from elastic_supervisor_hook import KEY_ENV, RUN_ENV, wire, worker  # noqa: E402

WORLD = 3
PLAN = {"healthy_s": 20.0, "stuck_s": 32.0, "gap_s": 10.0}
STUCK = (1, 0)  # the ranks that get stuck, in this order


def mark(what: str, **fields: object) -> None:
    print(json.dumps({"mark": what, "mono": time.monotonic(), **fields}), flush=True)


def spin(device: str, seconds: float, cycles_per_s: float) -> None:
    """A GPU kernel that runs `seconds`, waited for in `.item()` (CUDA spin-waits: the thread
    burns a core); on the CPU, a C call that sleeps (the plumbing check)."""
    import torch  # noqa: PLC0415 (the ranks only: the recorder stays light)
    if device == "cpu":
        time.sleep(seconds)
        return
    torch.cuda._sleep(int(seconds * cycles_per_s))
    torch.ones((), device=device).add_(1).item()


def calibrate(device: str) -> float:
    """GPU clock cycles per second of torch.cuda._sleep."""
    import torch  # noqa: PLC0415 (the ranks only: the recorder stays light)
    if device == "cpu":
        return 0.0
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 200_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def rank_main(rank: int, args: argparse.Namespace) -> int:
    from datetime import timedelta  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    key = bytes.fromhex(args.key)
    progress = worker.Progress()
    init = progress.wrap(lambda: dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.master_port}", rank=rank,
        world_size=WORLD, timeout=timedelta(seconds=300)), "i")
    beater = worker.Beater(progress, key=key, supervisor=("127.0.0.1", args.port), run="0",
                           host=f"rank-{rank}", local_rank=rank, keep=())
    beater.start(watch_env={**os.environ, KEY_ENV: args.key, RUN_ENV: "0"})
    init()
    progress.inits, progress.rank, progress.size = progress.inits + 1, rank, WORLD
    allreduce = progress.wrap(dist.all_reduce, "c")

    # The hook's own cost here: one heartbeat's body (the heartbeat thread), one wrapped call
    # (the training thread: a separate Progress, so that the counts the heartbeats carry stay
    # the training's).
    t = time.perf_counter()
    for _ in range(200):
        beater.heartbeat()
    beat_s = (time.perf_counter() - t) / 200
    plain, wrapped = (lambda: None), worker.Progress().wrap(lambda: None, "c")
    t = time.perf_counter()
    for _ in range(20000):
        plain()
    t_plain = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(20000):
        wrapped()
    wrap_s = (time.perf_counter() - t - t_plain) / 20000

    device = args.device
    cycles = calibrate(device)
    torch.manual_seed(rank)
    w = torch.randn(1024, 1024, device=device) / 32
    x = torch.randn(256, 1024, device=device)
    n = 8192 if device != "cpu" else 256
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    big = torch.randn(n, n, device=device, dtype=dtype) / n ** 0.5
    big_w = torch.eye(n, device=device, dtype=dtype)
    mark("ready", rank=rank, heartbeat_s=beat_s, wrapper_s=wrap_s, cycles_per_s=cycles,
         torch=torch.__version__,
         gpu=torch.cuda.get_device_name(0) if device != "cpu" else "none")

    flag = torch.zeros(2)
    allreduce(flag)  # everyone ready: the plan's clock starts here
    start = time.monotonic()
    stuck_at = {r: start + PLAN["healthy_s"] + i * (PLAN["stuck_s"] + PLAN["gap_s"])
                for i, r in enumerate(STUCK)}
    end = start + PLAN["healthy_s"] + len(STUCK) * (PLAN["stuck_s"] + PLAN["gap_s"])
    step, step_times, done_stuck = 0, [], False
    while True:
        t0 = time.perf_counter()
        y = torch.tanh(x @ w)
        for _ in range(args.work):  # a heavier step: large matrix products
            big = big @ big_w
        if args.work:
            y = y + big[:1, :1].float()
        loss = y.square().mean().item()  # the step's sync, where a healthy loop mostly sits
        if rank in stuck_at and not done_stuck and time.monotonic() >= stuck_at[rank]:
            done_stuck = True
            mark("stuck", rank=rank, step=step)
            spin(device, PLAN["stuck_s"], cycles)
            mark("unstuck", rank=rank, step=step)
        flag[0], flag[1] = loss, float(time.monotonic() >= end)
        allreduce(flag)
        step += 1
        step_times.append(time.perf_counter() - t0)
        if flag[1] > 0:
            break
    step_times.sort()
    mark("end", rank=rank, steps=step, step_p50_s=step_times[len(step_times) // 2],
         step_p99_s=step_times[int(0.99 * len(step_times))])
    dist.destroy_process_group()
    beater.close()
    return 0


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(args: argparse.Namespace) -> int:
    key = wire.new_key()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    t0 = time.monotonic()
    lines: list[dict] = []
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                data, _ = sock.recvfrom(wire.MAX_DATAGRAM)
            except TimeoutError:
                continue
            body = wire.decode(key, data)
            if body is not None:
                lines.append({"at": round(time.monotonic() - t0, 4), "body": body})

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    master = free_port(socket.SOCK_STREAM)
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--key", key.hex(),
         "--port", str(sock.getsockname()[1]), "--master-port", str(master),
         "--device", args.device, "--scale", str(args.scale),
         "--work", str(args.work)], stdout=subprocess.PIPE, text=True) for r in range(WORLD)]
    marks: list[dict] = []

    def read_marks(p: subprocess.Popen) -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            with_mark = json.loads(line) if line.startswith('{"mark"') else None
            if with_mark is None:
                print(line, end="", flush=True)
                continue
            with_mark["at"] = round(with_mark.pop("mono") - t0, 4)
            marks.append(with_mark)
            print(json.dumps(with_mark), flush=True)

    readers = [threading.Thread(target=read_marks, args=(p,), daemon=True) for p in procs]
    for r in readers:
        r.start()
    rcs = [p.wait(timeout=args.timeout) for p in procs]
    for r in readers:
        r.join(5)
    time.sleep(1.0)
    stop.set()
    receiver.join(5)
    header = {"recording": "gpu_stuck", "plan": PLAN, "stuck_ranks": STUCK, "world": WORLD,
              "device": args.device,
              "work": args.work, "python": platform.python_version(), "rcs": rcs,
              "date": time.strftime("%Y-%m-%d", time.gmtime())}
    with open(args.out, "w") as f:
        f.write(json.dumps(header) + "\n")
        for m in sorted(marks, key=lambda m: m["at"]):
            f.write(json.dumps(m) + "\n")
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(json.dumps({"datagrams": len(lines), "marks": len(marks), "rcs": rcs}), flush=True)
    return 0 if rcs == [0] * WORLD else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_stuck.jsonl")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=400.0)
    p.add_argument("--work", type=int, default=0,
                   help="large matrix products per step (0: small kernels only)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the plan's times")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    PLAN.update({k: v * args.scale for k, v in PLAN.items()})
    if args.rank is not None:
        return rank_main(args.rank, args)
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
