"""Elastic Horovod + PyTorch training: the workload of elastic-supervisor's tests and demo.

Run by horovodrun in elastic mode (under `elastic-supervisor run -- python train.py ...`):
    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover_hosts.sh \
        python train.py --steps 1000 --commit-every 10

- Model, optimizer and step counter live in `hvd.elastic.TorchState`, committed every
  --commit-every steps. When a worker dies, the survivors roll back to the last commit: at most
  commit-every steps are computed again, none that was committed is lost.
- `state.check_host_updates()` runs after every step, so added or removed hosts are picked up
  between commits, without a rollback.
- The learning rate follows the linear scaling rule, base lr x world size, and is set again on
  every reset (the world size changed).
- Data is synthetic and deterministic: the batch of (step, rank) depends only on --seed, so a
  step computed again sees the same data.
- With --checkpoint PATH (on a volume every worker mounts), rank 0 also writes the committed
  state there (atomically: temp file + rename), and a new run starts from it: a job whose
  launcher was restarted goes on from its last commit instead of from step 0.
- Rank 0 prints one JSON line per step {"step", "size", "loss", "lr", "committed", "host",
  "time", "step_s"}, and event lines {"event": "reset" | "done", ...}.
- With --stop-file PATH (on a volume every worker mounts), the file's content, a step number, ends
  training there instead of at --steps: read at every step, so every rank stops at the same one.
- Exit code 0 once --steps are done, non-zero on any failure, and 143 on SIGTERM at once: a worker
  that exits 0 mid-job makes horovodrun end the whole job (horovod issues #3852, #1994).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)  # the workers of one machine share its few cores

import horovod.torch as hvd  # noqa: E402  (after set_num_threads, before any torch work)

FEATURES = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="train until this many steps are done")
    p.add_argument("--commit-every", type=int, default=10, help="commit the state every k steps")
    p.add_argument("--batch-size", type=int, default=256, help="samples per worker and step")
    p.add_argument("--hidden", type=int, default=1024, help="width of the two hidden layers")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
    p.add_argument("--seed", type=int, default=1234, help="seed of the model and the data")
    p.add_argument("--checkpoint", default=None,
                   help="file for the committed state (a shared volume); resumed from if present")
    p.add_argument("--stop-file", default=None,
                   help="a file holding the step to end at (a shared volume); read every step")
    return p.parse_args(argv)


def emit(**fields: object) -> None:
    """Print one JSON line from rank 0."""
    if hvd.rank() == 0:
        print(json.dumps(fields), flush=True)


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the (inputs, targets) of `rank` at `step`: a function of the seed only."""
    teacher = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, 1, generator=teacher)
    g = torch.Generator().manual_seed(seed + 1_000_003 * (step + 1) + rank)
    x = torch.randn(size, FEATURES, generator=g)
    return x, torch.tanh(x @ weights)


def save_checkpoint(path: str, state: hvd.elastic.TorchState) -> None:
    """Write the committed model, optimizer and step to `path` atomically (rank 0 only)."""
    if hvd.rank() != 0:
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"step": state.step, "model": state.model.state_dict(),
                "optimizer": state.optimizer.state_dict()}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | None, state: hvd.elastic.TorchState) -> None:
    """Load `path` into rank 0's state if it exists (the first sync gives it to every rank)."""
    if path is None or hvd.rank() != 0 or not os.path.exists(path):
        return
    saved = torch.load(path, weights_only=True)
    state.model.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.step = int(saved["step"])
    state.save()  # the first sync hands out the saved state, not the live attributes
    emit(event="resumed", step=state.step, checkpoint=path, time=time.time())


def steps_to_train(args: argparse.Namespace) -> int:
    """--steps, or the step --stop-file names if it is earlier."""
    if args.stop_file:
        try:
            with open(args.stop_file) as f:
                return min(args.steps, int(f.read()))
        except (OSError, ValueError):
            pass
    return int(args.steps)


def exit_on_sigterm(signum: int, _frame: object) -> None:
    # Leave non-zero and at once: exiting 0 here would end the whole job (see the docstring).
    print(json.dumps({"event": "sigterm", "pid": os.getpid()}), file=sys.stderr, flush=True)
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    hvd.init()
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def on_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        emit(event="reset", size=hvd.size(), step=state.step, lr=args.lr * hvd.size(),
             time=time.time())

    state.register_reset_callbacks([on_reset])
    load_checkpoint(args.checkpoint, state)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        host = os.environ.get("HOROVOD_HOSTNAME", "")
        while state.step < steps_to_train(args):
            one_step(state, host)

    def one_step(state: hvd.elastic.TorchState, host: str) -> None:
        """Train one step; commit every --commit-every steps; pick up host changes."""
        started = time.monotonic()
        x, y = batch(args.seed, state.step, hvd.rank(), args.batch_size)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()  # allreduces the gradients: fails when a peer died
        state.step += 1
        committed = state.step % args.commit_every == 0
        if committed:
            state.save()
            if args.checkpoint:
                save_checkpoint(args.checkpoint, state)
        emit(step=state.step, size=hvd.size(), loss=round(loss.item(), 6),
             lr=optimizer.param_groups[0]["lr"], committed=committed, host=host,
             time=time.time(), step_s=round(time.monotonic() - started, 4))
        state.check_host_updates()

    train(state)
    emit(event="done", step=state.step, size=hvd.size(), time=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
