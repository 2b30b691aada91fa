"""The Horovods that `make setup` built are CPU-only Gloo + PyTorch (the project's venv) and Gloo +
TensorFlow (its TensorFlow environment), and really run collectives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.fakehosts import TF_PYTHON

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


TF_ALLREDUCE = """
import tensorflow as tf, horovod.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank={hvd.rank()} size={hvd.size()} sum={float(total[0]):.0f}", flush=True)
"""


def test_the_tensorflow_environment_runs_a_gloo_allreduce(tmp_path: Path) -> None:
    """scripts/build-tf-env.sh's environment: Horovod built against its TensorFlow, Gloo."""
    tf_bin = TF_PYTHON.parent
    out = subprocess.run([tf_bin / "horovodrun", "--check-build"], capture_output=True,
                         text=True, check=True, timeout=180).stdout
    assert "[X] TensorFlow" in out and "[X] Gloo" in out and "[ ] PyTorch" in out, out
    script = tmp_path / "allreduce.py"
    script.write_text(TF_ALLREDUCE)
    proc = subprocess.run(
        [tf_bin / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface",
         "lo", TF_PYTHON, str(script)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line.split("]<stdout>:")[-1] for line in proc.stdout.splitlines()
                   if "sum=" in line)
    assert lines == ["rank=0 size=2 sum=3", "rank=1 size=2 sum=3"], proc.stdout
