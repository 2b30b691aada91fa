"""The fence's cut on a real Gloo pair (torch.distributed's Gloo, the transport Horovod's is a copy
of): a survivor whose peer is stuck leaves its collective at once, whichever way it waits.

A send posted right after the cut, to a peer whose receive is pending, is the case that once cost
60 s on real nodes: shutting the writing side down too made that send meet EPIPE and sit in Gloo's
queue until the Gloo timeout (`Timed out waiting ...ms for send operation`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PEER = Path(__file__).with_name("gloo_peer.py")
ROOT = PEER.parents[2]
GLOO_TIMEOUT_S = 20.0
AT_ONCE_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("case", ["send", "recv"])
def test_a_cut_frees_a_survivor_waiting_on_a_stuck_peer_at_once(case: str, tmp_path: Path) -> None:
    port, ports_file = free_port(), tmp_path / "ports.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [str(port), case, str(ports_file), str(GLOO_TIMEOUT_S)]
    stuck = subprocess.Popen([sys.executable, str(PEER), "0", *argv], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        survivor = subprocess.run([sys.executable, str(PEER), "1", *argv], env=env, check=False,
                                  capture_output=True, text=True, timeout=GLOO_TIMEOUT_S + 60)
    finally:
        stuck.kill()
        stuck.wait()
    assert survivor.returncode == 0, survivor.stderr[-2000:]
    got = json.loads(survivor.stdout.strip().splitlines()[-1])
    assert got["cut"] >= 1, f"nothing cut: {got}"
    if case == "recv":  # the stuck peer never sends: only the cut can end it
        assert got["error"], f"the receive completed: {got}"
    # A send may also complete (into the kernel's buffer, the writing side being open): what
    # matters is that it does not wait for the stuck peer.
    assert got["took_s"] < AT_ONCE_S and "Timed out" not in got["error"], got
