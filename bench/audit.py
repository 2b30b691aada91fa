"""Who asked the API server for what: the local control plane with kube-apiserver's audit log
on, and per-client request counts read back from it.

Every request except Lease renewals is logged at Metadata level (verb, resource, userAgent,
times; no bodies), once it completed or, for a watch, once it started streaming. Clients are
told apart by their User-Agent: the benchmark sets its own on its clients, the supervisor keeps
the Kubernetes Python client's default. The audit flags are added to the apiserver's command
line by overriding `ControlPlane._define_components` (a private hook of localcluster, so this
breaks loudly, not silently, if it changes: the apiserver component must be found).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.controlplane import ControlPlane

POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    # ResponseStarted (watches) and ResponseComplete are enough to count each request once.
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io",
                                         "resources": ["leases"]}]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*"]},
        {"level": "Metadata"},
    ],
}


class AuditedControlPlane(ControlPlane):
    """The local control plane, with the apiserver writing an audit log to `audit_log`."""

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _define_components(self) -> list[Any]:
        components = super()._define_components()
        apiserver = next(c for c in components if c.name == "apiserver")
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(POLICY))
        apiserver.argv += [f"--audit-policy-file={policy}",
                           f"--audit-log-path={self.audit_log}", "--audit-log-maxsize=0"]
        return components


@dataclass(frozen=True)
class Request:
    """One request as the audit log saw it. Times are wall-clock seconds."""

    agent: str
    verb: str
    what: str  # resource[/subresource], or the URL of a non-resource request
    received: float
    completed: float | None  # None: still open (a watch) when the log was read


def read(log: Path) -> list[Request]:
    """Every logged request once, in the order received."""
    found: dict[str, Request] = {}
    with log.open() as f:
        for line in f:
            ev = json.loads(line)
            ref = ev.get("objectRef") or {}
            what = ref.get("resource", ev.get("requestURI", "?"))
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            done = (_seconds(ev["stageTimestamp"]) if ev["stage"] == "ResponseComplete"
                    else None)
            prev = found.get(ev["auditID"])
            found[ev["auditID"]] = Request(
                ev.get("userAgent", ""), ev["verb"], what,
                _seconds(ev["requestReceivedTimestamp"]),
                done if done is not None else (prev.completed if prev else None))
    return sorted(found.values(), key=lambda r: r.received)


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()
