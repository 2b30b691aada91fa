"""The Horovod that `make setup` built is CPU-only Gloo + PyTorch and really runs collectives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_check_build_shows_pytorch_and_gloo() -> None:
    out = subprocess.run([BIN / "horovodrun", "--check-build"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "[X] PyTorch" in out
    assert "[X] Gloo" in out
    assert "[ ] MPI" in out
    assert "[ ] TensorFlow" in out


ALLREDUCE = """
import torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank={hvd.rank()} size={hvd.size()} sum={total.item():.0f}", flush=True)
"""


def test_two_process_gloo_allreduce(tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    proc = subprocess.run(
        [BIN / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line.split("]<stdout>:")[-1] for line in proc.stdout.splitlines()
                   if "sum=" in line)
    assert lines == ["rank=0 size=2 sum=3", "rank=1 size=2 sum=3"], proc.stdout
