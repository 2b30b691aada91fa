"""What the local node agent runs for a pod, and the status it reports. No processes here.

- `admit(pod)`: the agent's admission check. Only what it can run honestly is accepted:
  restartPolicy Never, one container, no init containers. Others are rejected the way a kubelet
  rejects a pod (phase Failed, a reason and a message naming what is unsupported).
- `container_env` / `container_command`: env from the pod spec (`value`, `valueFrom.fieldRef`)
  and command + args, with the kubelet's `$(VAR)` expansion. Anything else is a ConfigError,
  shown as the container waiting with reason CreateContainerConfigError.
- `write_volumes`: emptyDir, configMap, secret, downwardAPI and projected volumes (the
  kube-api-access volume every pod gets) are written under a per-pod root, a volumeMount at
  /etc/x landing at <root>/etc/x; the container gets ES_VOLUME_ROOT=<root>. A real mount at /etc
  cannot be made on a shared machine without namespaces; programs that must run both here and in
  a cluster read paths as `$ES_VOLUME_ROOT/etc/x` (empty in a cluster).
- `pod_status`: the pod status a kubelet writes for the local container state.
API reads go through the `Sources` given by the agent; values are API-shaped dicts.
"""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

VOLUME_ROOT_ENV = "ES_VOLUME_ROOT"
HOST_IP = "127.0.0.1"
REJECTED_REASON = "UnsupportedByLocalNodeAgent"
DEFAULT_MODE = 0o644
_EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_MAP = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class Rejected(Exception):
    """The agent cannot run this pod at all (the message says what is unsupported)."""


class ConfigError(Exception):
    """A container cannot be configured; `retry`: it may work later (a ConfigMap may appear)."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


class Sources(Protocol):
    """API reads for volumes; each raises ConfigError(retry=True) when the API fails."""

    def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None: ...

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None: ...

    def token(self, pod: Mapping[str, Any], audience: str | None, expiration_s: int) -> str: ...


def admit(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Return the pod's one container, or raise Rejected naming what the agent cannot do."""
    spec = pod["spec"]
    problems = []
    policy = spec.get("restartPolicy", "Always")
    if policy != "Never":
        problems.append(f"restartPolicy {policy} (only Never)")
    if len(spec.get("containers") or ()) != 1:
        problems.append(f"{len(spec.get('containers') or ())} containers (only one)")
    if spec.get("initContainers"):
        problems.append("initContainers")
    if problems:
        raise Rejected("Pod was rejected: the local node agent (localcluster/nodeagent.py) does "
                       "not support " + ", ".join(problems))
    return spec["containers"][0]


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand $(VAR) from `env` like a kubelet: unknown names stay as written, $$ is a $."""
    return _EXPANSION.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1),
                                                                        m.group(0)), text)


def field_value(pod: Mapping[str, Any], path: str, ip: str | None) -> str:
    """Return the downward-API value of `path` for `pod` (ConfigError if unsupported)."""
    meta, spec = pod["metadata"], pod["spec"]
    if m := _FIELD_MAP.fullmatch(path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    values = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"], "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ip or "", "status.hostIP": HOST_IP,
    }
    if path not in values:
        raise ConfigError(f"fieldRef {path} is not supported by the local node agent "
                          f"(supported: {', '.join(sorted(values))}, metadata.labels['k'], "
                          "metadata.annotations['k'])")
    return str(values[path])


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], ip: str | None,
                  base: Mapping[str, str]) -> dict[str, str]:
    """Return `base` plus the container's env (later entries may use $(EARLIER) ones)."""
    if container.get("envFrom"):
        raise ConfigError("envFrom is not supported by the local node agent (use env)")
    env = dict(base)
    for entry in container.get("env") or ():
        name, source = entry["name"], entry.get("valueFrom")
        if source is None:
            env[name] = expand(entry.get("value", ""), env)
        elif "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], ip)
        else:
            kind = next(iter(source), "?")
            raise ConfigError(f"env {name}: valueFrom.{kind} is not supported by the local node "
                              "agent (value and valueFrom.fieldRef are)")
    return env


def container_command(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """Return command + args with $(VAR) expanded; there are no image entrypoints here."""
    if not container.get("command"):
        raise ConfigError("the container has no command; the local node agent has no images "
                          "and so no entrypoints: set command")
    return [expand(a, env) for a in [*container["command"], *(container.get("args") or ())]]


# -- volumes ----------------------------------------------------------------------------------

Files = dict[str, tuple[bytes, int]]  # relative path -> (content, mode)


def _select(data: Mapping[str, bytes] | None, source: Mapping[str, Any], what: str,
            default_mode: int) -> Files:
    """Return the files of a configMap/secret source: all keys, or its `items` only."""
    if data is None:
        if source.get("optional"):
            return {}
        raise ConfigError(f"{what} not found", retry=True)
    items = source.get("items")
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    out: Files = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ConfigError(f"{what} has no key {item['key']}", retry=True)
        out[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
    return out


def _downward(pod: Mapping[str, Any], source: Mapping[str, Any], ip: str | None,
              default_mode: int) -> Files:
    out: Files = {}
    for item in source.get("items") or ():
        if "fieldRef" not in item:
            raise ConfigError("downwardAPI: only fieldRef items are supported by the local node "
                              "agent")
        value = field_value(pod, item["fieldRef"]["fieldPath"], ip).encode()
        out[item["path"]] = (value, item.get("mode", default_mode))
    return out


def volume_files(pod: Mapping[str, Any], volume: Mapping[str, Any], sources: Sources,
                 ip: str | None) -> Files:
    """Return the files of one pod volume (emptyDir: none); ConfigError if unsupported."""
    ns = pod["metadata"]["namespace"]
    if "emptyDir" in volume:
        return {}
    if cm := volume.get("configMap"):
        return _select(sources.config_map(ns, cm["name"]), cm, f"configMap {cm['name']}",
                       cm.get("defaultMode", DEFAULT_MODE))
    if secret := volume.get("secret"):
        return _select(sources.secret(ns, secret["secretName"]), secret,
                       f"secret {secret['secretName']}", secret.get("defaultMode", DEFAULT_MODE))
    if down := volume.get("downwardAPI"):
        return _downward(pod, down, ip, down.get("defaultMode", DEFAULT_MODE))
    if projected := volume.get("projected"):
        mode = projected.get("defaultMode", DEFAULT_MODE)
        out: Files = {}
        for src in projected.get("sources") or ():
            if cm := src.get("configMap"):
                out |= _select(sources.config_map(ns, cm["name"]), cm,
                               f"configMap {cm['name']}", mode)
            elif secret := src.get("secret"):
                out |= _select(sources.secret(ns, secret["name"]), secret,
                               f"secret {secret['name']}", mode)
            elif down := src.get("downwardAPI"):
                out |= _downward(pod, down, ip, mode)
            elif token := src.get("serviceAccountToken"):
                value = sources.token(pod, token.get("audience"),
                                      token.get("expirationSeconds", 3600))
                out[token["path"]] = (value.encode(), mode)
            else:
                raise ConfigError(f"volume {volume['name']}: projected source "
                                  f"{next(iter(src), '?')} is not supported by the local node "
                                  "agent")
        return out
    kind = next((k for k in volume if k != "name"), "?")
    raise ConfigError(f"volume {volume['name']}: {kind} is not supported by the local node agent "
                      "(emptyDir, configMap, secret, downwardAPI, projected are)")


def write_volumes(pod: Mapping[str, Any], container: Mapping[str, Any], root: Path,
                  sources: Sources, ip: str | None) -> dict[str, Path]:
    """Write the container's mounted volumes under `root`; return volume name -> directory."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
    written: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or ():
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise ConfigError(f"volumeMount {mount['mountPath']}: subPath is not supported by "
                              "the local node agent")
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for rel, (content, mode) in volume_files(pod, volumes[mount["name"]], sources,
                                                 ip).items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(mode)
        written[mount["name"]] = target
    return written


def decode_secret(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def decode_config_map(obj: Mapping[str, Any]) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    return out | decode_secret(obj.get("binaryData"))


# -- status -----------------------------------------------------------------------------------

class State(enum.StrEnum):
    """The local state of a pod's container. Transitions: WAITING -> CREATING -> RUNNING ->
    EXITED; CREATING -> EXITED (start error); REJECTED is final, and so is EXITED."""

    REJECTED = "rejected"  # admission failed: never started
    WAITING = "waiting"    # cannot be configured (yet): CreateContainerConfigError
    CREATING = "creating"  # podinit spawned, the main process not started yet
    RUNNING = "running"
    EXITED = "exited"


@dataclass(frozen=True)
class Observed:
    """What the agent knows about a pod's container; times are RFC 3339 strings."""

    state: State
    container: str
    image: str
    start_time: str
    ip: str | None = None
    message: str = ""
    container_id: str = ""
    started_at: str | None = None
    ready_at: str | None = None
    exit_code: int | None = None
    start_error: bool = False
    finished_at: str | None = None


def _condition(kind: str, ok: bool, at: str, reason: str | None = None) -> dict[str, str]:
    out = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": at}
    if reason:
        out["reason"] = reason
    return out


def _container_state(o: Observed) -> dict[str, Any]:
    if o.state is State.RUNNING:
        return {"running": {"startedAt": o.started_at}}
    if o.state is State.EXITED:
        reason = "StartError" if o.start_error else "Completed" if o.exit_code == 0 else "Error"
        term = {"exitCode": o.exit_code, "reason": reason, "containerID": o.container_id,
                "startedAt": o.started_at or o.finished_at, "finishedAt": o.finished_at}
        return {"terminated": term | ({"message": o.message} if o.message else {})}
    if o.state is State.WAITING:
        return {"waiting": {"reason": "CreateContainerConfigError", "message": o.message}}
    return {"waiting": {"reason": "ContainerCreating"}}


OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def status_digest(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """Return what the agent owns of a pod status, to notice when the API's copy drifted
    (others add fields and conditions; the API server adds defaults)."""
    conditions = sorted((c["type"], c["status"]) for c in status.get("conditions") or ()
                        if c["type"] in OWN_CONDITIONS)
    container = (status.get("containerStatuses") or [{}])[0]
    state = container.get("state") or {}
    code = (state.get("terminated") or {}).get("exitCode")
    return (status.get("phase"), status.get("podIP"), tuple(conditions),
            container.get("ready"), tuple(sorted(state)), code)


def pod_status(o: Observed) -> dict[str, Any]:
    """Return the pod status a kubelet would write for `o` (restartPolicy Never)."""
    if o.state is State.REJECTED:
        return {"phase": "Failed", "reason": REJECTED_REASON, "message": o.message,
                "startTime": o.start_time}
    exited = o.state is State.EXITED
    ready = o.state is State.RUNNING and o.ready_at is not None
    if exited:
        phase, ready_at, why = ("Succeeded" if o.exit_code == 0 else "Failed",
                                o.finished_at, "PodCompleted")
    else:
        phase = "Running" if o.state is State.RUNNING else "Pending"
        ready_at, why = (o.ready_at, None) if ready else (o.start_time, "ContainersNotReady")
    status: dict[str, Any] = {
        "phase": phase, "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}],
        "startTime": o.start_time,
        "conditions": [
            _condition("PodReadyToStartContainers", o.ip is not None and not exited,
                       o.finished_at if exited else o.start_time),
            _condition("Initialized", True, o.start_time),
            _condition("ContainersReady", ready, ready_at, why),
            _condition("Ready", ready, ready_at, why),
            _condition("PodScheduled", True, o.start_time),
        ],
        "containerStatuses": [{
            "name": o.container, "image": o.image, "imageID": "", "ready": ready,
            "started": o.state is State.RUNNING, "restartCount": 0,
            "state": _container_state(o),
            **({"containerID": o.container_id} if o.container_id else {}),
        }],
    }
    if o.ip:
        status |= {"podIP": o.ip, "podIPs": [{"ip": o.ip}]}
    return status
