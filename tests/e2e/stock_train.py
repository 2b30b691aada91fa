"""A stock elastic Horovod + PyTorch training script, written the way Horovod's own elastic
examples are (examples/elastic/pytorch: hvd.elastic.run, TorchState, commit every few batches,
check_host_updates in between, the learning rate rescaled on reset, rank 0 prints and
checkpoints). It imports nothing of elastic-supervisor: whatever the supervisor guarantees must
hold for it as it is. Synthetic data, so that it runs anywhere.

Output (rank 0 only): one JSON line per batch {"step", "size", "loss", "lr", "committed",
"host", "time"} and events {"event": "reset" | "resumed" | "done", ...}; that is all the tests
read. --slow-step N:S:KIND (repeatable) makes rank 0 spend S seconds after batch N, once per
run, sleeping (KIND sleep), writing and fsyncing a file (KIND write) or computing in Python only
(KIND python: an evaluation) or in C calls that hold the GIL throughout (KIND gil: what a long
garbage-collector pass does; a real 5 s one needs a heap of ~90 million objects, ~10 GB here),
while the other ranks wait in the next allreduce: a slow step, a long checkpoint, an evaluation,
a pause; KIND sleepall: every rank sleeps. --hang-file PATH: a file on a
volume every rank sees; the rank whose host (HOROVOD_HOSTNAME) it holds blocks its main thread
for good at its next batch (a lock it already holds: a deadlock in a rank-only code path) while
its other threads run on. --stop-file PATH: a file on a
volume every rank sees, holding a batch number: training ends there instead of at --batches (the
file is read at every batch, so every rank stops at the same one).
"""

import argparse
import itertools
import json
import os
import sys
import threading
import time

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser(description="stock elastic Horovod training")
parser.add_argument("--batches", type=int, default=400, help="batches to train in total")
parser.add_argument("--batches-per-commit", type=int, default=5)
parser.add_argument("--batches-per-host-check", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--checkpoint", default=None, help="rank 0 saves here at every commit")
parser.add_argument("--sleep", type=float, default=0.0, help="seconds of extra work per batch")
parser.add_argument("--stop-file", default=None, help="a file holding the batch to end at")
parser.add_argument("--slow-step", action="append", default=[],
                    help="N:SECONDS:sleep|write|python|gil|sleepall, rank 0 is slow once after "
                         "batch N (sleepall: every rank)")
parser.add_argument("--hang-file", default=None, help="a file holding the host whose rank "
                    "deadlocks")
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(42)

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
slow = {int(n): (float(s), kind) for n, s, kind in (x.split(":") for x in args.slow_step)}


def log(**fields):
    if hvd.rank() == 0:
        print(json.dumps(fields), flush=True)


def hold_the_gil(seconds):
    """Hold the GIL for `seconds` of wall time while computing, as a long garbage-collector
    pass does: the other threads (the hook's heartbeat) cannot run. Short C calls in a loop
    until the deadline, with the interpreter's switch interval set past it, so no waiting
    thread asks for the GIL in between. (One C call sized from a calibration, used before,
    held it for as long as the load on the two cores made it: 8.6 s once for 6 s.)"""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 60)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(itertools.repeat(1, 1 << 16))
    finally:
        sys.setswitchinterval(interval)


def slow_down(seconds, kind):
    if kind == "gil":
        hold_the_gil(seconds)
        return
    if kind in ("sleep", "sleepall"):
        time.sleep(seconds)
        return
    if kind == "python":
        end, total = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            total += sum(i * i for i in range(1000))
        return
    # Rewrites the same 16 MiB over and over: the time, not the size, of a long checkpoint (a
    # disk that takes 300 MB/s would otherwise fill with 12 GB in 40 s).
    path = f"{args.checkpoint or '/tmp/stock'}.slow.{os.getpid()}"
    end, block = time.monotonic() + seconds, os.urandom(1 << 20)
    with open(path, "wb") as f:
        while time.monotonic() < end:
            if f.tell() >= 16 << 20:
                f.seek(0)
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
    os.remove(path)


def save_checkpoint(state):
    if hvd.rank() != 0 or not args.checkpoint:
        return
    tmp = f"{args.checkpoint}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "batch": state.batch}, tmp)
    os.replace(tmp, args.checkpoint)


def deadlock_if_named(host):
    if not args.hang_file:
        return
    try:
        with open(args.hang_file) as f:
            named = f.read().strip()
    except OSError:
        return
    if named and named == host:
        print(f"rank {hvd.rank()} on {host}: deadlocking", flush=True)
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()


def batches_to_train():
    if args.stop_file:
        try:
            with open(args.stop_file) as f:
                return min(args.batches, int(f.read()))
        except (OSError, ValueError):
            pass
    return args.batches


@hvd.elastic.run
def train(state):
    host = os.environ.get("HOROVOD_HOSTNAME", "")
    while state.batch < batches_to_train():
        g = torch.Generator().manual_seed(state.batch * 1000 + hvd.rank())
        data = torch.randn(args.batch_size, 64, generator=g)
        target = data.sum(dim=1, keepdim=True).tanh()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if args.sleep:
            time.sleep(args.sleep)
        if state.batch + 1 in slow and state.batch + 1 not in state.slowed:
            state.slowed = [*state.slowed, state.batch + 1]
            if hvd.rank() == 0 or slow[state.batch + 1][1] == "sleepall":
                slow_down(*slow[state.batch + 1])
        deadlock_if_named(host)
        state.batch += 1
        committed = state.batch % args.batches_per_commit == 0
        log(step=state.batch, size=hvd.size(), loss=round(loss.item(), 6),
            lr=optimizer.param_groups[0]["lr"], committed=committed, host=host, time=time.time())
        if committed:
            state.commit()
            save_checkpoint(state)
        elif state.batch % args.batches_per_host_check == 0:
            state.check_host_updates()


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()
    log(event="reset", size=hvd.size(), step=state.batch, time=time.time())


state = hvd.elastic.TorchState(model, optimizer, batch=0, slowed=[])
if args.checkpoint and hvd.rank() == 0 and os.path.exists(args.checkpoint):
    saved = torch.load(args.checkpoint, weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    state.batch = saved["batch"]
    state.save()
    log(event="resumed", step=state.batch, checkpoint=args.checkpoint, time=time.time())
state.register_reset_callbacks([on_state_reset])
train(state)
log(event="done", step=state.batch, size=hvd.size(), time=time.time())
