"""What `run` and `explain` do before anything starts: the configuration parsed (the namespace
from the pod or the kubeconfig), `explain`'s text (every variable with its value and source,
the exact horovodrun argv, the failure rules and budgets), and the checks of the files `run`
relies on (the discovery script, the hook in sidecar mode, horovodrun, the discovery file's
directory), each problem one line naming the variable and what it expects. Never writes or
removes a file that is there already.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor import discovery, kube, sidecar
from supervisor.config import Config, Mode, effective_values, parse_config
from supervisor.decide import fleet
from supervisor.decide.policy import DEFAULT_RULES
from supervisor.launch import horovodrun_argv


def load_config(env: Mapping[str, str]) -> Config:
    """Parse the config, deriving the namespace default from the pod or the kubeconfig."""
    pod_ns = kube.in_cluster_namespace()
    kc_ns = None if pod_ns or env.get("SUPERVISOR_NAMESPACE") else kube.kubeconfig_namespace()
    return parse_config(env, pod_namespace=pod_ns, kubeconfig_namespace=kc_ns)


def explain(cfg: Config, command: Sequence[str]) -> str:
    """Return the `explain` text: variables (value, source) and the horovodrun argv."""
    rows = effective_values(cfg)
    width = max(len(r[0]) for r in rows)
    lines = ["effective configuration (variable, value, source):"]
    lines += [f"  {name:<{width}}  {value or '-'}  [{source}]" for name, value, source in rows]
    cmd = list(command) or ["<training command>"]
    argv = horovodrun_argv(cfg, cmd)
    lines += ["", "horovodrun argv (executed directly, never through a shell):",
              "  " + shlex.join(argv)]
    lines += ["", "failure rules (first match wins; the defaults come last):"]
    for rule in (*cfg.policy.rules, *DEFAULT_RULES):
        what = rule.what() if rule.causes is not None else f"exit codes {rule.what()}"
        lines.append(f"  {rule.action.value:<8} {what}  [{rule.name}]")
    b = cfg.policy.budgets
    lines.append(f"budgets: restart limit {b.restart_limit}, per slot "
                 f"{b.per_slot_limit if b.per_slot_limit is not None else 'none'}, rate "
                 + (f"{b.rate_limit}/{b.rate_window_s:g}s" if b.rate_limit else "none")
                 + f", backoff {b.backoff_initial_s:g}s..{b.backoff_max_s:g}s, disruptions "
                 + ("free" if b.disruptions_free else "counted"))
    if cfg.worker_template is None:
        lines.append("workers: created elsewhere (no SUPERVISOR_WORKER_TEMPLATE); a failed "
                     "worker is dropped, never replaced")
    else:
        workers = fleet.workers_for(cfg.np, cfg.slots_per_worker)
        lines.append(f"workers: {workers} created and replaced by the supervisor from "
                     f"{cfg.worker_template_file}")
    return "\n".join(lines)


def problems(cfg: Config) -> list[str]:
    """Return problems with the files `run` relies on (one line each). Never writes or
    removes a file that is there already."""
    problems = []
    script = cfg.discovery_script
    if not (script.is_file() and os.access(script, os.X_OK)):
        problems.append(f"SUPERVISOR_DISCOVERY_SCRIPT={str(script)!r}: expected an executable "
                        "file (the shipped discover_hosts.sh)")
    if cfg.mode == Mode.SIDECAR:
        # horovodrun is the training container's; what es-run loads must be in the shared dir.
        if not (hook := sidecar.hook_dir(cfg.shared_dir) / "sitecustomize.py").is_file():
            problems.append(f"SUPERVISOR_SHARED_DIR={str(cfg.shared_dir)!r}: no hook in it "
                            f"({hook} is missing); run `elastic-supervisor install "
                            f"{cfg.shared_dir}` in an init container before this one, with the "
                            "same emptyDir mounted at that path")
        return problems + discovery_file_problems(cfg.discovery_file)
    hr = cfg.horovodrun
    wanted = "expected the horovodrun executable (a name on PATH or an absolute path)"
    if "/" in hr and not (os.path.isfile(hr) and os.access(hr, os.X_OK)):
        problems.append(f"SUPERVISOR_HOROVODRUN={hr!r}: not an executable file; {wanted}")
    elif "/" not in hr and shutil.which(hr) is None:
        problems.append(f"SUPERVISOR_HOROVODRUN={hr!r}: not found on PATH; {wanted}")
    problems += discovery_file_problems(cfg.discovery_file)
    return problems


def discovery_file_problems(path: Path) -> list[str]:
    var = f"SUPERVISOR_DISCOVERY_FILE={str(path)!r}"
    wanted = "expected a file path in a writable directory (an emptyDir)"
    if path.is_dir():
        return [f"{var}: is a directory; {wanted}"]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Only a real write tells (root passes os.access, a read-only mount does not).
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        return [f"{var}: its directory cannot be written ([Errno {e.errno}] {e.strerror}); "
                f"{wanted}"]
    try:
        content = discovery.read_current(path)
    except (OSError, UnicodeDecodeError) as e:
        return [f"{var}: exists and cannot be read as a host list ({e}); refusing to replace "
                "it: point it at a file of its own (an emptyDir)"]
    if content is not None and (line := discovery.foreign_line(content)) is not None:
        return [f"{var}: exists and is not a host list the supervisor wrote (line "
                f"{content.splitlines().index(line) + 1}: {line[:60]!r}); refusing to replace "
                "it: point it at a file of its own (an emptyDir)"]
    return []
