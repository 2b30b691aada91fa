"""The discovery file: what Horovod's host-discovery script prints.

PURE part: `render` turns the cluster view into sorted `host:slots` lines, and `decide` says
whether to publish them or withdraw the file (view not synced, watch stale, or no usable worker:
horovodrun treats empty output as "every host is gone", but keeps its previous host set when the
script fails). ADAPTER part, the only file I/O here: `write_atomic` (temp file in the same
directory, fsync, rename, fsync of the directory) and `withdraw`.

Host names: by default a worker is its pod IP (HostMode.POD_IP). A pod IP is routable at once,
needs no DNS, and a replacement pod gets a new one. Horovod blacklists a failed host string for
the rest of the job, so a string must never come back for a later pod: if a pod shows up with a
host string an earlier pod (other UID) already had, it is left out and reported (HOST_REUSED).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.config import HostMode
from supervisor.observe import ClusterView, Obj, Unusable, pod_problem


@dataclass(frozen=True)
class Rendered:
    """Discovery lines plus the workers left out and why (pod name -> reason)."""

    lines: tuple[str, ...]
    hosts: Mapping[str, str]  # host -> pod name, for the usable workers
    left_out: Mapping[str, Unusable]

    @property
    def content(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)

    def slots(self, per_worker: int) -> int:
        return len(self.lines) * per_worker


def host_of(pod: Obj, mode: HostMode) -> str | None:
    """Return the host string Horovod uses for this pod, or None if it has none yet."""
    if mode is HostMode.POD_IP:
        ip = pod.get("status", {}).get("podIP")
        # IPv6 literals break horovodrun's host:slots parser (it splits on ':').
        return ip if ip and ":" not in ip else None
    meta, spec = pod["metadata"], pod.get("spec", {})
    subdomain = spec.get("subdomain")
    if not subdomain:
        return None
    return f"{spec.get('hostname') or meta['name']}.{subdomain}.{meta['namespace']}.svc"


def render(
    view: ClusterView, slots: int, mode: HostMode, first_owner: Mapping[str, str], *,
    retiring: frozenset[str] = frozenset(), failed: frozenset[str] = frozenset(),
) -> Rendered:
    """Return the sorted `host:slots` lines of the usable workers in `view`.

    `first_owner` maps every host string ever published to the UID of the pod that had it; a
    different pod with the same string is left out (Horovod would treat it as blacklisted).
    `retiring`: pods being scaled in, left out first so that horovodrun lets them go.
    `failed`: UIDs of pods the supervisor found failed while they still look Running and
    Ready (Hung), never listed again.
    """
    hosts: dict[str, str] = {}
    left_out: dict[str, Unusable] = {}
    for name, pod in view.pods.items():
        problem = pod_problem(pod, view.nodes)
        host = host_of(pod, mode)
        if problem is None and host is None:
            problem = Unusable.NO_ADDRESS
        if problem is None and first_owner.get(host, pod["metadata"]["uid"]) != pod[
                "metadata"]["uid"]:
            problem = Unusable.HOST_REUSED
        if problem is None and name in retiring:
            problem = Unusable.SCALING_IN
        if problem is None and pod["metadata"].get("uid") in failed:
            problem = Unusable.HUNG
        if problem is None:
            hosts[host] = name
        else:
            left_out[name] = problem
    lines = tuple(sorted(f"{h}:{slots}" for h in hosts))
    return Rendered(lines=lines, hosts=hosts, left_out=left_out)


def hold_back(rendered: Rendered, hosts: frozenset[str], slots: int) -> Rendered:
    """Return `rendered` without `hosts` (left out as HELD; see regroup.py)."""
    if not hosts:
        return rendered
    kept = {h: name for h, name in rendered.hosts.items() if h not in hosts}
    left_out = {**rendered.left_out,
                **{name: Unusable.HELD for h, name in rendered.hosts.items() if h in hosts}}
    return Rendered(lines=tuple(sorted(f"{h}:{slots}" for h in kept)), hosts=kept,
                    left_out=left_out)


@dataclass(frozen=True)
class Publish:
    content: str


@dataclass(frozen=True)
class Withdraw:
    reason: str


def decide(synced: bool, broken_for_s: float, staleness_s: float,
           rendered: Rendered) -> Publish | Withdraw:
    """Return whether to publish the rendered hosts or withdraw the file (and why)."""
    if not synced:
        return Withdraw("view not synced")
    if broken_for_s > staleness_s:
        return Withdraw(f"watch broken for {broken_for_s:.0f}s (> {staleness_s:g}s)")
    if not rendered.lines:
        return Withdraw("no usable worker")
    return Publish(rendered.content)


def write_atomic(path: Path, content: str) -> None:
    """Replace `path` with `content` atomically: readers see the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def withdraw(path: Path) -> bool:
    """Remove the discovery file so the script fails; return whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    _fsync_dir(path.parent)
    return True


def read_current(path: Path) -> str | None:
    """Return the file's content, or None if it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
