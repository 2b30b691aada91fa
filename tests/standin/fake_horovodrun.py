#!/usr/bin/env python3
"""Stand-in for horovodrun in supervisor tests (real Horovod is used by the e2e tests).

Does what the supervisor relies on horovodrun doing with discovery: runs the
--host-discovery-script about every 0.2 s and records each call (time, exit code, output) as a
JSON line in $FAKE_RECORD, plus its argv and the signals it got. Behaviour knobs (env):
  FAKE_EXIT_AFTER=SECONDS  exit on its own after this long with FAKE_EXIT_CODE (default 0)
  FAKE_IGNORE_TERM=1       ignore SIGTERM (to test the supervisor's grace-then-kill)
  FAKE_TERM_CODE=N         exit code on SIGTERM (default 143)
  FAKE_GRANDCHILD=1        start a `sleep` grandchild (in its own session, like horovod's
                           middlemen) whose pid is recorded, to test tree killing
  FAKE_POLL_S=SECONDS      discovery poll period (default 0.2; horovodrun's own is 1.0)
  FAKE_ORPHAN=1            leave an orphan (`sleep 1` whose parent shell exits at once): it is
                           re-parented to the supervisor, which must reap it when it exits
"""

import json
import os
import signal
import subprocess
import sys
import time

record = open(os.environ["FAKE_RECORD"], "a", buffering=1)  # noqa: SIM115 (whole run)


def rec(**kw):
    record.write(json.dumps({"t": time.time(), **kw}) + "\n")


argv = sys.argv[1:]
script = argv[argv.index("--host-discovery-script") + 1]
rec(event="start", argv=argv, pid=os.getpid(),
    discovery_file=os.environ.get("SUPERVISOR_DISCOVERY_FILE"),
    hook={k: v for k, v in os.environ.items() if k.startswith("ELASTIC_SUPERVISOR_HOOK_")})

term_code = int(os.environ.get("FAKE_TERM_CODE", "143"))


def on_term(signum, _frame):
    rec(event="signal", signum=signum)
    if os.environ.get("FAKE_IGNORE_TERM") != "1":
        sys.exit(term_code)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)
if os.environ.get("FAKE_GRANDCHILD") == "1":
    g = subprocess.Popen(["sleep", "600"], start_new_session=True)
    rec(event="grandchild", pid=g.pid)

if os.environ.get("FAKE_ORPHAN") == "1":
    sh = subprocess.run(["sh", "-c", "sleep 1 & echo $!"], capture_output=True, text=True,
                        check=True)
    rec(event="orphan", pid=int(sh.stdout.strip()))

deadline = None
if "FAKE_EXIT_AFTER" in os.environ:
    deadline = time.monotonic() + float(os.environ["FAKE_EXIT_AFTER"])
while True:
    p = subprocess.run([script], capture_output=True, text=True, check=False)
    rec(event="discover", rc=p.returncode, out=p.stdout)
    if deadline is not None and time.monotonic() >= deadline:
        rec(event="exit", code=int(os.environ.get("FAKE_EXIT_CODE", "0")))
        sys.exit(int(os.environ.get("FAKE_EXIT_CODE", "0")))
    time.sleep(float(os.environ.get("FAKE_POLL_S", "0.2")))
