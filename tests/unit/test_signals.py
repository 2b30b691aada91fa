"""Signal handlers that cannot deadlock the main thread (issue 27, item 7).

A Python signal handler runs in the main thread between two bytecodes of whatever it
interrupted. If it takes a Lock that the interrupted code holds (queue.Queue.put while the main
thread is inside the same queue's get; threading.Event.set inside Event.wait), it waits for good,
or, under a burst of signals, recurses until RecursionError. Both the loop's handler
(Supervisor.handle_signal -> its trigger queue) and the start-up handler (startup.Stopping) are
driven here by a burst of real signals while the main thread sits in the very calls they
interrupt, in a child process with a deadline: a deadlock fails the test instead of hanging
it. Against the code before (queue.Queue, threading.Event) the loop's case failed in 2 of 4
runs and the start-up's in every run; with SimpleQueue both pass.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BURST = textwrap.dedent("""
    import os, signal, sys, threading, time
    from supervisor import startup
    from supervisor.config import parse_config
    from supervisor.metrics import make_metrics
    from supervisor.loop import Supervisor
    from supervisor.model import SignalReceived

    def storm():
        for _ in range(100000):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.00001)

    which, got = sys.argv[1], 0
    end = time.monotonic() + 3
    if which == "loop":
        cfg = parse_config({"SUPERVISOR_JOB_NAME": "j", "SUPERVISOR_NAMESPACE": "n",
                            "SUPERVISOR_NP": "2"})
        loop = Supervisor(cfg, log=None, metrics=make_metrics(), events=print, start_child=None,
                    base_env={}, act=print, kill_ssh_clients=None, count_ssh_clients=None)
        signal.signal(signal.SIGUSR1, loop.handle_signal)
        threading.Thread(target=storm, daemon=True).start()
        while time.monotonic() < end:
            got += sum(isinstance(t, SignalReceived) for t in loop._drain(0.00001))
    else:
        stopping = startup.Stopping()
        signal.signal(signal.SIGUSR1, stopping.handle)
        threading.Thread(target=storm, daemon=True).start()
        while time.monotonic() < end:
            got += stopping.wait(0.0001)
    print("received", got)
""")


@pytest.mark.parametrize("which", ["loop", "stopping"])
def test_a_burst_of_signals_never_deadlocks_the_main_thread(which: str) -> None:
    done = subprocess.run([sys.executable, "-c", BURST, which], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0, done.stdout
