"""PURE: the hook for the workers of a sidecar-mode job: the ConfigMap that carries the
supervisor's own copy of it (`hook_configmap`: a name the API server generates, immutable, owned
by the job, the files' digest in an annotation; with the modules compiled, `hook_bytecode`) and
the worker template with it mounted read-only at SHARED_DIR/hook and named in PYTHONPATH
(`with_hook`). No init container runs before sshd, and the workers load the hook the
supervisor ships, not one a user's image carries.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from supervisor.sidecar import hook_dir
from supervisor.workers import LABEL_JOB, owner_reference

HOOK_VOLUME = "elastic-supervisor-hook"  # the ConfigMap volume the supervisor adds to workers
HOOK_DIGEST = "elastic-supervisor/hook-sha256"  # annotation: the digest of the hook's files


def _hook_key(path: str) -> str:
    """A ConfigMap key for the hook file at `path` (keys hold no "/")."""
    return path.replace("/", ".")


def hook_bytecode(files: Mapping[str, str]) -> dict[str, bytes]:
    """The hook's modules compiled for this interpreter, by the path a Python of the same
    version looks for them (__pycache__/NAME.TAG.pyc): hash-checked pycs (PEP 552), valid
    wherever they sit beside their very source, whatever its mtime. The workers' ConfigMap
    volume is read-only, so without them every process of a worker compiles the hook again
    (0.1-0.4 s here); a Python of another version ignores them and compiles."""
    out = {}
    for path, text in files.items():
        source = text.encode()
        code = compile(source, path, "exec", dont_inherit=True)
        flags = (0b11).to_bytes(4, "little")  # hash-based, checked against the source
        out[importlib.util.cache_from_source(path)] = (
            importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
            + marshal.dumps(code))
    return out


def hook_configmap(job: str, files: Mapping[str, str],
                   owner: Mapping[str, str] | None,
                   bytecode: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    """The ConfigMap that carries the hook's `files` (path -> text) and their `bytecode`
    (hook_bytecode) to the workers: a name the API server generates (nobody can have made it
    before us), immutable (nobody changes it under a running worker), owned by `owner` (the
    launcher Job: it goes with the job), its files' digest in an annotation."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{len(files[path])}\0{files[path]}".encode())
    meta: dict[str, Any] = {
        "generateName": f"{job}-supervisor-hook-",
        "labels": {LABEL_JOB: job, "app.kubernetes.io/managed-by": "elastic-supervisor"},
        "annotations": {HOOK_DIGEST: digest.hexdigest()}}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True,
            "data": {_hook_key(path): text for path, text in sorted(files.items())}}
    if bytecode:
        body["binaryData"] = {_hook_key(path): base64.b64encode(pyc).decode()
                              for path, pyc in sorted(bytecode.items())}
    return body


def with_hook(template: Mapping[str, Any], configmap: str, paths: Iterable[str],
              shared: Path) -> dict[str, Any]:
    """Return the worker template with the hook added: ConfigMap `configmap` (hook_configmap's
    with the files at `paths`) mounted read-only at SHARED_DIR/hook in every container, and
    PYTHONPATH naming it (horovodrun also forwards the launcher's PYTHONPATH to the processes
    it starts)."""
    out = _copy(template)
    spec = out["spec"]
    if any(v.get("name") == HOOK_VOLUME for v in spec.get("volumes") or ()):
        return out  # a template that already has it (rendered before)
    items = [{"key": _hook_key(path), "path": path} for path in sorted(paths)]
    spec.setdefault("volumes", []).append({"name": HOOK_VOLUME, "configMap": {
        "name": configmap, "items": items, "defaultMode": 0o444}})
    path = str(hook_dir(shared))
    mount = {"name": HOOK_VOLUME, "mountPath": path, "readOnly": True}
    for c in spec["containers"]:
        c.setdefault("volumeMounts", []).append(dict(mount))
        env = c.setdefault("env", [])
        old = next((e for e in env if e.get("name") == "PYTHONPATH"), None)
        if old is None:
            env.append({"name": "PYTHONPATH", "value": path})
        elif "value" in old:
            old["value"] = ":".join(p for p in (path, old["value"]) if p)
    return out


def _copy(doc: Any) -> Any:
    if isinstance(doc, Mapping):
        return {k: _copy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_copy(v) for v in doc]
    return doc
