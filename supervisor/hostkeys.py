"""Each worker's own ssh host key, pinned to its address (SUPERVISOR_SSH_HOST_KEYS=worker).

Why: with one host key for the whole job (in the job's Secret, readable by every worker), any
worker can answer at another worker's address and get that worker's training command. Here the
supervisor makes a key pair for every worker pod it creates:
- the public key goes into the pod's annotation ANNOTATION (the pod's own record, which workers
  cannot change: they have no API token), the private key into a Secret of the pod's own,
  `<pod>-ssh-<key>` (`<key>`: the first KEY_ID_LEN hex digits of the public key's SHA-256),
  owned by the pod (the garbage collector deletes it with the pod), mounted read-only in that
  pod only. A slot's pod made again under the same name (plan.py's reschedule) gets a new key,
  so a new Secret name: the one of the pod before, which the garbage collector deletes once that
  pod is gone, is never taken for the new pod's (seen on real nodes: the create answered
  AlreadyExists, the collector then deleted it, and the new pod waited for its volume for good);
- every container gets SSH_HOST_KEY_ENV, the key's path, which the worker entrypoint hands to
  sshd (worker_image/entrypoint.sh);
- the supervisor writes the known_hosts file the driver's ssh checks strictly (the hook's
  ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS): one line per published host, `[<address>]:<port> <that
  pod's key>` (`<address>` alone on port 22), written before the host list that names it.

PURE: the pod and Secret bodies, the known_hosts text and the key pair of a seed (Ed25519 in
OpenSSH's formats: the sidecar image has no ssh-keygen). ADAPTER: `generate` (randomness).
"""

from __future__ import annotations

import base64
import bisect
import copy
import hashlib
import re
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.workers import LABEL_JOB

ANNOTATION = "elastic-supervisor/ssh-host-key"
VOLUME = "elastic-supervisor-host-key"
MOUNT_DIR = "/etc/edl/ssh-host"
KEY_NAME = "host-key"
SSH_HOST_KEY_ENV = "SSH_HOST_KEY"  # read by the worker entrypoint
SECRET_INFIX = "-ssh-"
KEY_ID_LEN = 10
LABEL_HOST_KEY_OF = "elastic-supervisor/host-key-of"
PUBLIC_KEY = re.compile(r"^ssh-ed25519 [A-Za-z0-9+/]+={0,2}$")


@dataclass(frozen=True)
class HostKey:
    """A worker's key pair: `private` in OpenSSH's format, `public` as `ssh-ed25519 BASE64`."""

    private: str
    public: str

    def __repr__(self) -> str:  # never in a log
        return f"HostKey(public={self.public!r})"


def secret_name(pod: str, public: str) -> str:
    """PURE: the name of the Secret holding the private key of `pod` made with `public`
    (admission.yaml's policy lets a worker mount no other)."""
    return f"{pod}{SECRET_INFIX}{hashlib.sha256(public.encode()).hexdigest()[:KEY_ID_LEN]}"


def with_host_key(body: Mapping[str, Any], public: str) -> dict[str, Any]:
    """PURE: `body` (a worker pod) that shows `public` in ANNOTATION and mounts its own
    Secret's private key in every container, at the path SSH_HOST_KEY_ENV names (set here,
    whatever the template said)."""
    pod = copy.deepcopy(dict(body))
    meta, spec = pod["metadata"], pod["spec"]
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: public}
    spec["volumes"] = [*(v for v in spec.get("volumes") or () if v.get("name") != VOLUME),
                       {"name": VOLUME, "secret": {
                           "secretName": secret_name(meta["name"], public),
                           "defaultMode": 0o440,  # owner and group (fsGroup) may read
                           "items": [{"key": KEY_NAME, "path": KEY_NAME}]}}]
    for c in spec.get("containers") or ():
        c["volumeMounts"] = [*(m for m in c.get("volumeMounts") or () if m.get("name") != VOLUME),
                             {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True}]
        c["env"] = [*(e for e in c.get("env") or () if e.get("name") != SSH_HOST_KEY_ENV),
                    {"name": SSH_HOST_KEY_ENV, "value": f"{MOUNT_DIR}/{KEY_NAME}"}]
    return pod


def secret_body(pod: Mapping[str, Any], key: HostKey) -> dict[str, Any]:
    """PURE: the Secret holding the private key of `pod` (as the API returned it: its uid),
    owned by the pod, so that it goes with the pod; immutable."""
    meta = pod["metadata"]
    private = key.private
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k == LABEL_JOB}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
            "metadata": {"name": secret_name(meta["name"], key.public),
                         "labels": {**labels, LABEL_HOST_KEY_OF: meta["name"]},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                              "name": meta["name"], "uid": meta["uid"],
                                              "blockOwnerDeletion": False}]},
            "data": {KEY_NAME: base64.b64encode(private.encode()).decode()}}


def public_key_of(pod: Mapping[str, Any]) -> str | None:
    """PURE: the host key `pod` was made with, or None (none, or not a key)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    return value if isinstance(value, str) and PUBLIC_KEY.match(value) else None


def known_hosts(hosts: Mapping[str, Mapping[str, Any]], port: int | None = None,
                ) -> tuple[str, tuple[str, ...]]:
    """PURE: the known_hosts text pinning each host (an address or DNS name) to the key of the
    pod behind it, sorted; and the hosts left out, whose pod shows no key (the driver's ssh
    refuses them). ssh looks a host up as `[host]:port` when it connects to a `port` other
    than 22 (horovodrun -p, SUPERVISOR_SSH_PORT), and finds no plain `host` line then."""
    return KnownHosts().update({host: host for host in hosts}, hosts, port)


class KnownHosts:
    """`known_hosts`, kept up to date across publishes (the supervisor holds one): per host
    the pod object its line was made of (identity: the view replaces an object when it
    changes), and the hosts in sorted order with their lines beside them. A publish after a
    few changes then costs a walk of 10,000 identities, not a parse, a sort and a join of
    10,000 lines (at 10,000 workers that was about an eighth of the loop's time while
    failures came in). The same text as `known_hosts` of the same hosts."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.seen: dict[str, tuple[Mapping[str, Any], str]] = {}  # host -> (pod, line or "")
        self.order: list[str] = []  # the hosts of `seen`, sorted
        self.lines: list[str] = []  # their lines, in that order
        self.missing: set[str] = set()  # hosts whose pod shows no key

    def _forget(self, port: int | None) -> None:
        self.port, self.seen, self.order, self.lines, self.missing = port, {}, [], [], set()

    def update(self, hosts: Mapping[str, str], pods: Mapping[str, Mapping[str, Any]],
               port: int | None = None) -> tuple[str, tuple[str, ...]]:
        """The text and the hosts left out for `hosts` (host -> the name of its pod in
        `pods`), as `known_hosts` gives them."""
        gone = self.seen.keys() - hosts.keys()
        if port != self.port or len(gone) > max(64, len(self.order) // 8):
            self._forget(port)  # (many gone: sorting anew is cheaper)
            gone = set()
        for host in gone:
            del self.seen[host]
            i = bisect.bisect_left(self.order, host)
            del self.order[i], self.lines[i]
            self.missing.discard(host)
        new: list[tuple[str, str]] = []
        for host, name in hosts.items():
            pod = pods[name]
            known = self.seen.get(host)
            if known is not None and known[0] is pod:
                continue
            key = public_key_of(pod)
            at = host if port in (None, 22) else f"[{host}]:{port}"
            line = "" if key is None else f"{at} {key}\n"
            self.seen[host] = (pod, line)
            if key is None:
                self.missing.add(host)
            else:
                self.missing.discard(host)
            if known is None:
                new.append((host, line))
            else:
                self.lines[bisect.bisect_left(self.order, host)] = line
        if len(new) > max(64, len(self.order) // 8):
            pairs = sorted([*zip(self.order, self.lines, strict=True), *new])
            self.order, self.lines = [h for h, _ in pairs], [line for _, line in pairs]
        else:
            for host, line in new:
                i = bisect.bisect_left(self.order, host)
                self.order.insert(i, host)
                self.lines.insert(i, line)
        return "".join(self.lines), tuple(sorted(self.missing))


# Ed25519 (RFC 8032, section 5.1): only what deriving a public key takes. No signing here.
_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _recover_x(y: int) -> int:
    xx = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(xx, (_P + 3) // 8, _P)
    if (x * x - xx) % _P:
        x = x * _SQRT_M1 % _P
    return _P - x if x & 1 else x


_GY = 4 * pow(5, _P - 2, _P) % _P
_GX = _recover_x(_GY)
_G = (_GX, _GY, 1, _GX * _GY % _P)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    t1 = (a[1] - a[0]) * (b[1] - b[0]) % _P
    t2 = (a[1] + a[0]) * (b[1] + b[0]) % _P
    t3 = 2 * a[3] * b[3] * _D % _P
    t4 = 2 * a[2] * b[2] % _P
    e, f, g, h = t2 - t1, t4 - t3, t4 + t3, t2 + t1
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def ed25519_public(seed: bytes) -> bytes:
    """PURE: the 32-byte Ed25519 public key of a 32-byte private `seed`."""
    h = hashlib.sha512(seed).digest()
    s = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
    q: tuple[int, ...] = (0, 1, 1, 0)
    point: tuple[int, ...] = _G
    while s:
        if s & 1:
            q = _add(q, point)
        point = _add(point, point)
        s >>= 1
    zinv = pow(q[2], _P - 2, _P)
    x, y = q[0] * zinv % _P, q[1] * zinv % _P
    return (y | (x & 1) << 255).to_bytes(32, "little")


def _string(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def from_seed(seed: bytes, comment: str, check: int) -> HostKey:
    """PURE: the key pair of `seed` in OpenSSH's formats (PROTOCOL.key: unencrypted; `check`
    is its random check number)."""
    public = ed25519_public(seed)
    kind = b"ssh-ed25519"
    blob = _string(kind) + _string(public)
    section = (struct.pack(">II", check, check) + _string(kind) + _string(public)
               + _string(seed + public) + _string(comment.encode()))
    section += bytes(range(1, 1 + (-len(section)) % 8))
    raw = (b"openssh-key-v1\0" + _string(b"none") + _string(b"none") + _string(b"")
           + struct.pack(">I", 1) + _string(blob) + _string(section))
    text = base64.b64encode(raw).decode()
    pem = "".join(text[i:i + 70] + "\n" for i in range(0, len(text), 70))
    return HostKey(private=f"-----BEGIN OPENSSH PRIVATE KEY-----\n{pem}"
                           "-----END OPENSSH PRIVATE KEY-----\n",
                   public="ssh-ed25519 " + base64.b64encode(blob).decode())


def generate(comment: str) -> HostKey:
    """ADAPTER: a new key pair from the system's randomness (no ssh-keygen: the sidecar image
    has none)."""
    return from_seed(secrets.token_bytes(32), comment, secrets.randbits(32))
