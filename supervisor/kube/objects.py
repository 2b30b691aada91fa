"""ADAPTER: the objects the supervisor reads and writes: the launcher's references and Job,
the state ConfigMap, worker pods, their Secrets, the PodDisruptionBudget and the leader Lease."""

from __future__ import annotations

import base64
import binascii
import contextlib
import gzip
import json
import math
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from supervisor.kube.errors import AlreadyExists, Damaged, map_error, request_timeout, write_timeout
from supervisor.model import JsonText
from supervisor.workers import owner_reference

# ---- ownership ----------------------------------------------------------------------------------

def read_pod(api: client.ApiClient, namespace: str, pod: str,
             timeout_s: float = 30.0) -> dict[str, Any]:
    """Return the pod as the API server has it (a dict); NotFound if it does not exist."""
    try:
        resp = client.CoreV1Api(api).read_namespaced_pod(
            pod, namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return dict(json.loads(resp.data))
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"get pod {namespace}/{pod}") from e


def launcher_refs(api: client.ApiClient, namespace: str, pod: str,
                  timeout_s: float = 30.0) -> tuple[dict[str, str], dict[str, str]]:
    """Return (the launcher pod, the owner of the job's objects) as references (refs_of)."""
    return refs_of(read_pod(api, namespace, pod, timeout_s))


def refs_of(obj: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Return (the launcher pod `obj`, the owner of the job's objects) as references.

    The owner is the batch/v1 Job that controls the launcher pod: its next pod (a Job retry)
    has the same one, and a finished launcher pod can go (PodGC, node removal) without taking
    the workers or the budgets. A launcher pod without a Job owns them itself."""
    meta = obj["metadata"]
    namespace = meta["namespace"]
    regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                 "name": meta["name"], "uid": meta["uid"]}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and (ref.get("apiVersion"), ref.get("kind")) == (
                "batch/v1", "Job"):
            return regarding, {"apiVersion": "batch/v1", "kind": "Job", "namespace": namespace,
                               "name": ref["name"], "uid": ref["uid"]}
    return regarding, regarding


def drop_connections(api: client.ApiClient) -> None:
    """Close the client's pooled connections: after a partition they may be silently dead,
    and a call on one would wait its whole timeout; the next calls connect anew."""
    with contextlib.suppress(Exception):
        api.rest_client.pool_manager.clear()


def read_job(api: client.ApiClient, namespace: str, name: str,
             timeout_s: float = 30.0) -> dict[str, Any]:
    """The batch/v1 Job `name` as a dict; raise KubeError (NotFound if it is gone)."""
    try:
        resp = client.BatchV1Api(api).read_namespaced_job(
            name, namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return json.loads(resp.data)  # type: ignore[no-any-return]
    except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        raise map_error(e, f"get job {namespace}/{name}") from e


def pod_reference(api: client.ApiClient, namespace: str, name: str,
                  timeout_s: float = 30.0) -> dict[str, str]:
    """Return an ObjectReference to the pod `name` (with its UID); raise KubeError."""
    return launcher_refs(api, namespace, name, timeout_s)[0]


def create_config_map(api: client.ApiClient, namespace: str, body: Mapping[str, Any],
                      timeout_s: float = 30.0) -> dict[str, Any]:
    """Create ConfigMap `body` (its name may be a generateName); return it as created."""
    meta = body["metadata"]
    what = f"create configmap {namespace}/{meta.get('name') or meta.get('generateName', '')}"
    try:
        resp = client.CoreV1Api(api).create_namespaced_config_map(
            namespace, body, _preload_content=False, _request_timeout=request_timeout(timeout_s))
        return dict(json.loads(resp.data))
    except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        raise map_error(e, what) from e


# ---- state --------------------------------------------------------------------------------------

# A state larger than this is stored gzip-compressed, under binaryData `<key>.gz`; a smaller one
# stays readable with kubectl under data `<key>`. 10,000 slots that each failed once come to
# ~0.7-0.9 MB of JSON, near a ConfigMap's 1 MiB; compressed, ~0.1 MB, and each save before a
# create costs the API server a quarter as much (docs/benchmarks.md).
PLAIN_MAX_BYTES = 64 * 1024
# What a compressed state may grow to once decompressed: a hand-made bomb is refused, not read.
INFLATED_MAX_BYTES = 64 * 1024 * 1024


def encode_state(state: Mapping[str, Any], key: str) -> dict[str, dict[str, str]]:
    """The ConfigMap fields that hold `state` under `key`: {"data": ...} while it is small
    (JSON as json.dumps writes it by default, as it always was), else {"binaryData": {key +
    ".gz": base64 of gzip}} (mtime 0: the same state, the same bytes)."""
    text = state_text(state)
    if len(text) <= PLAIN_MAX_BYTES:
        return {"data": {key: text}}
    packed = gzip.compress(text.encode(), compresslevel=1, mtime=0)
    return {"binaryData": {key + ".gz": base64.b64encode(packed).decode()}}


def state_text(state: Mapping[str, Any]) -> str:
    """`json.dumps(state, sort_keys=True)`, with each top-level value that is a model.JsonText
    put in as the text it is (the same result, not encoded again)."""
    raw = {k: v for k, v in state.items() if isinstance(v, JsonText)}
    if not raw:
        return json.dumps(state, sort_keys=True)
    marks = {k: f"\x00JsonText {k}\x00" for k in raw}
    text = json.dumps({**state, **marks}, sort_keys=True)
    for k, mark in marks.items():
        spelled = json.dumps(mark)
        if text.count(spelled) != 1:  # (some other value holds the mark: encode it all)
            return json.dumps({**state, **{k: json.loads(v) for k, v in raw.items()}},
                              sort_keys=True)
        text = text.replace(spelled, raw[k])
    return text


def stored_text(cm: Mapping[str, Any], key: str, where: str) -> str | None:
    """The state's JSON text in ConfigMap `cm` (as the API server returns it), plain or
    compressed (encode_state), or None if it holds neither; raise Damaged with one line when
    it holds both or the compressed one cannot be read."""
    plain = (cm.get("data") or {}).get(key)
    packed = (cm.get("binaryData") or {}).get(key + ".gz")
    if packed is None:
        return None if plain is None else str(plain)
    if plain is not None:
        raise Damaged(f"{where} holds both data {key} and binaryData {key}.gz; keep the one "
                      "the supervisor wrote last, or delete the ConfigMap deliberately")
    try:
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip
        raw = inflate.decompress(base64.b64decode(str(packed), validate=True),
                                 INFLATED_MAX_BYTES)
        if inflate.unconsumed_tail:
            raise ValueError(f"it inflates to more than {INFLATED_MAX_BYTES} bytes")
        if not inflate.eof:
            raise ValueError("the gzip stream is cut short")
        return raw.decode()
    except (ValueError, binascii.Error, zlib.error) as e:
        raise Damaged(f"{where}.gz is not gzip-compressed JSON ({e}); fix or delete it "
                      "deliberately") from e


def decode_state(raw: str, where: str) -> dict[str, Any]:
    """The JSON object `raw` (a ConfigMap value we keep, named by `where`); raise Damaged with
    one line when it is not JSON, holds a number JSON has not (NaN, Infinity, 1e400), or is not
    an object."""
    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value

    def constant(text: str) -> float:
        raise ValueError(f"{text} is not a JSON number")

    try:
        state = json.loads(raw, parse_float=finite, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        raise Damaged(f"{where} is not JSON ({e or 'nested too deep'}); fix or delete it "
                      "deliberately") from e
    if not isinstance(state, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number",
                float: "a number"}.get(type(state), "null")
        raise Damaged(f"{where} is not a JSON object ({kind}: {raw[:40]!r}); fix or delete it "
                      "deliberately")
    return state


class StateStore:
    """The supervisor's persisted state: ConfigMap `name` (key state.json, or state.json.gz
    when large: encode_state), owned by the launcher Job so it goes with the job, written with
    optimistic concurrency.

    `save` with the resourceVersion `load` returned; a Conflict means someone (an earlier or a
    second supervisor) wrote meanwhile: load again and re-apply, never overwrite blindly. A
    save writes `owner` as the only owner (re-owning a state an older launcher pod owned);
    without one, it keeps the owners it loaded. NotFound on an update: the ConfigMap was
    deleted; save again with None to create it.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str,
                 owner: Mapping[str, str] | None, key: str = "state.json", *,
                 timeout_s: float = 30.0, window: Callable[[], float] | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name, self.owner, self.KEY = namespace, name, owner, key
        self.timeout = request_timeout(timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)
        self.owners: list[dict[str, Any]] = []  # the ownerReferences last loaded or saved

    def load(self) -> tuple[dict[str, Any] | None, str | None]:
        """Return (state, resourceVersion), or (None, None) if nothing is stored yet."""
        try:
            resp = self.core.read_namespaced_config_map(self.name, self.namespace,
                                                        _preload_content=False,
                                                        _request_timeout=self.timeout)
            cm = json.loads(resp.data)
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise map_error(e, f"get configmap {self.namespace}/{self.name}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"get configmap {self.namespace}/{self.name}") from e
        self.owners = list(cm["metadata"].get("ownerReferences") or ())
        where = f"configmap {self.namespace}/{self.name}: {self.KEY}"
        raw = stored_text(cm, self.KEY, where)
        state = None if raw is None else decode_state(raw, where)
        return state, cm["metadata"]["resourceVersion"]

    def owned(self) -> bool:
        """Whether the ConfigMap loaded is owned as `save` would own it."""
        return self.owner is None or self.owners == [owner_reference(self.owner)]

    def save(self, state: Mapping[str, Any], resource_version: str | None) -> str:
        """Store `state` if the ConfigMap is still at `resource_version` (None: create it);
        return the new resourceVersion; raise Conflict if someone wrote meanwhile."""
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/managed-by": "elastic-supervisor"}}
        owners = [owner_reference(self.owner)] if self.owner is not None else self.owners
        if owners:
            meta["ownerReferences"] = owners
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                **encode_state(state, self.KEY)}
        what = f"{'create' if resource_version is None else 'update'} configmap " \
               f"{self.namespace}/{self.name}"
        timeout = write_timeout(self.timeout, self.window, what)
        try:
            if resource_version is None:
                resp = self.core.create_namespaced_config_map(self.namespace, body,
                                                              _preload_content=False,
                                                              _request_timeout=timeout)
            else:
                meta["resourceVersion"] = resource_version
                resp = self.core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                               _preload_content=False,
                                                               _request_timeout=timeout)
            saved = json.loads(resp.data)["metadata"]
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e
        self.owners = list(saved.get("ownerReferences") or ())
        return saved["resourceVersion"]


def list_pods(api: client.ApiClient, namespace: str, selector: str,
              timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Return the pods matching `selector` as dicts (status, cleanup, adoption)."""
    try:
        resp = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False,
            _request_timeout=request_timeout(timeout_s))
        return json.loads(resp.data).get("items") or []
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"list pods in {namespace}") from e


def list_events(api: client.ApiClient, namespace: str, timeout_s: float = 30.0, *,
                controller: str | None = None) -> list[dict[str, Any]]:
    """Return the events.k8s.io/v1 Events of `namespace` as dicts (for status and tests);
    with `controller`, only those it reported (selected by the API server: a namespace holds
    the kubelet's and the scheduler's Events about every pod too)."""
    selector = {} if controller is None else {
        "field_selector": f"reportingController={controller}"}
    try:
        resp = client.EventsV1Api(api).list_namespaced_event(
            namespace, _preload_content=False, _request_timeout=request_timeout(timeout_s),
            **selector)
        return json.loads(resp.data).get("items") or []
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise map_error(e, f"list events in {namespace}") from e


class _CoreWriter:
    """The core API in `namespace`, each write's timeout cut to the leader's time left."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 request_timeout_s: float = 30.0,
                 window: Callable[[], float] | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.timeout = namespace, request_timeout(request_timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)


class Pods(_CoreWriter):
    """Creates, deletes and re-owns worker pods (bodies are API-shaped dicts); raises
    KubeError."""

    def create(self, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create the pod (`dry_run`: only validated and admitted by the API server, all its
        admission included, nothing stored)."""
        what = (f"{'dry-run ' if dry_run else ''}create pod "
                f"{self.namespace}/{body['metadata']['name']}")
        extra = {"dry_run": "All"} if dry_run else {}
        timeout = self.timeout if dry_run else write_timeout(self.timeout, self.window, what)
        try:
            resp = self.core.create_namespaced_pod(self.namespace, body, _preload_content=False,
                                                   _request_timeout=timeout, **extra)
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e

    def delete(self, name: str, uid: str | None, grace_s: int | None) -> None:
        """Delete pod `name` (only if it still has `uid`); grace 0 forces it."""
        what = f"delete pod {self.namespace}/{name}"
        body = client.V1DeleteOptions(
            grace_period_seconds=grace_s,
            preconditions=client.V1Preconditions(uid=uid) if uid else None)
        timeout = write_timeout(self.timeout, self.window, what)
        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=body,
                                            _preload_content=False,
                                            _request_timeout=timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e

    def delete_all(self, label_selector: str, field_selector: str = "") -> list[str]:
        """Delete every pod matching the selectors in one call (graceful); return their
        names, sorted."""
        what = f"delete pods {self.namespace} ({label_selector} {field_selector})".strip()
        try:
            resp = self.core.delete_collection_namespaced_pod(
                self.namespace, label_selector=label_selector,
                field_selector=field_selector or None, _preload_content=False,
                _request_timeout=self.timeout)
            body = json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise map_error(e, what) from e
        return sorted(item["metadata"]["name"] for item in body.get("items") or ())

    def set_owners(self, name: str, uid: str, owners: list[Mapping[str, Any]]) -> None:
        """Replace the ownerReferences of pod `name`, if it is still the pod with `uid`."""
        what = f"patch pod {self.namespace}/{name} ownerReferences"
        patch = [{"op": "test", "path": "/metadata/uid", "value": uid},
                 {"op": "add", "path": "/metadata/ownerReferences", "value": list(owners)}]
        try:
            self.core.patch_namespaced_pod(name, self.namespace, patch, _preload_content=False,
                                           _request_timeout=self.timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e


class Budgets:
    """Keeps the workers' PodDisruptionBudget (policy/v1); raises KubeError."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 request_timeout_s: float = 30.0,
                 window: Callable[[], float] | None = None) -> None:
        self.policy = client.PolicyV1Api(api)
        self.namespace, self.timeout = namespace, request_timeout(request_timeout_s)
        self.window = window  # the leader's time left to write (write_timeout)

    def keep(self, body: Mapping[str, Any]) -> None:
        """Create the budget `body`, or set the minAvailable of the one of its name."""
        name = body["metadata"]["name"]
        what = f"keep poddisruptionbudget {self.namespace}/{name}"
        try:
            self.policy.create_namespaced_pod_disruption_budget(
                self.namespace, body, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
            return
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            err = map_error(e, f"create poddisruptionbudget {self.namespace}/{name}")
        if not isinstance(err, AlreadyExists):
            raise err
        patch = {"spec": {"minAvailable": body["spec"]["minAvailable"]}}
        try:
            self.policy.patch_namespaced_pod_disruption_budget(
                name, self.namespace, patch, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"patch poddisruptionbudget {self.namespace}/{name}") from e


class Secrets(_CoreWriter):
    """Creates the Secret holding a worker's own ssh host key (supervisor/hostkeys.py): create
    only, never read (the pod owns it, and it goes with the pod); raises KubeError."""

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        what = f"create secret {self.namespace}/{body['metadata']['name']}"
        try:
            resp = self.core.create_namespaced_secret(
                self.namespace, body, _preload_content=False,
                _request_timeout=write_timeout(self.timeout, self.window, what))
            return {"metadata": json.loads(resp.data)["metadata"]}  # never the key
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, what) from e


# ---- the leader Lease ---------------------------------------------------------------------------

class Leases:
    """Reads and writes coordination.k8s.io/v1 Leases in `namespace` (dicts); raises KubeError.
    `replace` carries the resourceVersion of the body (optimistic concurrency: Conflict)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout_s: float = 30.0) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.timeout_s = namespace, timeout_s

    def get(self, name: str, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Return the Lease, or None if there is none."""
        try:
            resp = self.coordination.read_namespaced_lease(
                name, self.namespace, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except ApiException as e:
            if e.status == 404:
                return None
            raise map_error(e, f"get lease {self.namespace}/{name}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"get lease {self.namespace}/{name}") from e

    def create(self, body: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            resp = self.coordination.create_namespaced_lease(
                self.namespace, body, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"create lease {self.namespace}/{name}") from e

    def replace(self, body: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            resp = self.coordination.replace_namespaced_lease(
                name, self.namespace, body, _preload_content=False,
                _request_timeout=request_timeout(timeout_s or self.timeout_s))
            return json.loads(resp.data)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise map_error(e, f"update lease {self.namespace}/{name}") from e
