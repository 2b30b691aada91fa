"""Each worker's own ssh host key (supervisor/hostkeys.py): the key pair in OpenSSH's formats
(checked by OpenSSH's own ssh-keygen), the pod and Secret bodies from the shipped templates,
and the known_hosts text that pins each listed address to its pod's key."""

from __future__ import annotations

import base64
import copy
import random
import subprocess
from pathlib import Path

import pytest
import yaml

from supervisor import hostkeys
from supervisor.workers import validate_template, worker_pod

ROOT = Path(__file__).resolve().parents[2]
OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic-train", "uid": "u-job"}


def test_the_public_key_of_a_seed_is_rfc_8032s() -> None:
    """RFC 8032, section 7.1, TEST 1: the secret key and the public key it gives."""
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert hostkeys.ed25519_public(seed).hex() == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def test_openssh_reads_the_private_key_and_finds_the_same_public_key(tmp_path: Path) -> None:
    keys = [hostkeys.generate(f"w{i}") for i in range(3)]
    assert len({k.public for k in keys}) == 3, "a new key each time"
    for i, key in enumerate(keys):
        path = tmp_path / f"key{i}"
        path.write_text(key.private)
        path.chmod(0o600)
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], check=True,
                                 capture_output=True, text=True, timeout=30).stdout.split()
        assert " ".join(derived[:2]) == key.public
        assert derived[2:] == [f"w{i}"]  # the comment
        assert hostkeys.PUBLIC_KEY.match(key.public)
    assert "PRIVATE" not in repr(keys[0]) and keys[0].public in repr(keys[0])


def shipped_template(path: str) -> dict:
    doc = yaml.safe_load((ROOT / path).read_text())
    if doc.get("kind") == "ConfigMap":
        doc = yaml.safe_load(doc["data"]["worker-template.yaml"])
    return validate_template(doc, {"elastic-supervisor/job": "elastic-train",
                                   "elastic-supervisor/role": "worker"})


@pytest.mark.parametrize("path", ["manifests/base/files/worker-template.yaml",
                                  "manifests/overlays/sidecar/worker-template.yaml"])
def test_a_worker_pod_mounts_its_own_key_where_its_entrypoint_reads_it(path: str) -> None:
    body = worker_pod(shipped_template(path), job="elastic-train", slot=2, incarnation=7,
                      owner=OWNER)
    body["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "SSH_HOST_KEY", "value": "/etc/edl/ssh/host-key"})  # a template's own: replaced
    before = copy.deepcopy(body)
    pod = hostkeys.with_host_key(body, "ssh-ed25519 AAAAkey")
    assert body == before, "the body it was given is left as it was"
    assert pod["metadata"]["annotations"][hostkeys.ANNOTATION] == "ssh-ed25519 AAAAkey"
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == hostkeys.VOLUME]
    # sha256("ssh-ed25519 AAAAkey") = 2676f65236...
    assert volume["secret"]["secretName"] == "elastic-train-w2-7-ssh-2676f65236"
    for c in pod["spec"]["containers"]:
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts[hostkeys.VOLUME] == {
            "name": hostkeys.VOLUME, "mountPath": "/etc/edl/ssh-host", "readOnly": True}
        assert [e["value"] for e in c["env"] if e["name"] == "SSH_HOST_KEY"] == [
            "/etc/edl/ssh-host/host-key"]
    # The job's Secret no longer hands every worker one host key.
    ssh = next(v for v in pod["spec"]["volumes"] if v["name"] == "ssh")
    assert "host-key" not in {i["key"] for i in ssh["secret"]["items"]}
    again = hostkeys.with_host_key(pod, "ssh-ed25519 AAAAother")
    assert len(again["spec"]["volumes"]) == len(pod["spec"]["volumes"])
    assert len(again["spec"]["containers"][0]["env"]) == len(pod["spec"]["containers"][0]["env"])


def test_the_secret_belongs_to_its_pod_and_holds_the_private_key() -> None:
    key = hostkeys.from_seed(bytes(32), "elastic-train-w0-1", 7)
    created = {"metadata": {"name": "elastic-train-w0-1", "uid": "u-pod",
                            "labels": {"elastic-supervisor/job": "elastic-train",
                                       "elastic-supervisor/slot": "0"}}}
    secret = hostkeys.secret_body(created, key)
    assert secret["metadata"]["name"] == "elastic-train-w0-1-ssh-bc17cf3508"
    assert secret["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Pod", "name": "elastic-train-w0-1", "uid": "u-pod",
        "blockOwnerDeletion": False}]
    assert secret["metadata"]["labels"] == {"elastic-supervisor/job": "elastic-train",
                                            hostkeys.LABEL_HOST_KEY_OF: "elastic-train-w0-1"}
    assert secret["immutable"] is True
    assert base64.b64decode(secret["data"]["host-key"]).decode() == key.private


def test_a_pod_made_again_under_its_name_with_a_new_key_names_a_new_secret() -> None:
    """plan.py's reschedule deletes a slot's unschedulable pod and makes it again under the same
    name: its new key's Secret must not be the one of the pod before (owned by that pod, the
    garbage collector deletes it once that pod is gone; seen on real nodes: the new pod then
    waited for its volume for good)."""
    first, again = (hostkeys.from_seed(bytes([n]) * 32, "elastic-train-w0-10", n) for n in (1, 2))
    bodies = [hostkeys.with_host_key({"metadata": {"name": "elastic-train-w0-10"},
                                      "spec": {"containers": [{"name": "worker"}]}}, k.public)
              for k in (first, again)]
    names = [b["spec"]["volumes"][0]["secret"]["secretName"] for b in bodies]
    assert names[0] != names[1] and all(n.startswith("elastic-train-w0-10-ssh-") for n in names)
    for body, key, name in zip(bodies, (first, again), names, strict=True):
        created = {"metadata": {**body["metadata"], "uid": "u-" + name}}
        assert hostkeys.secret_body(created, key)["metadata"]["name"] == name


def pod(key: str | None) -> dict:
    return {"metadata": {"name": "p", "annotations": {} if key is None
                         else {hostkeys.ANNOTATION: key}}}


def test_known_hosts_pins_each_listed_address_to_its_pods_key_only() -> None:
    a, b = hostkeys.from_seed(b"a" * 32, "a", 1), hostkeys.from_seed(b"b" * 32, "b", 1)
    text, missing = hostkeys.known_hosts({
        "10.0.1.7": pod(b.public), "10.0.0.5": pod(a.public), "10.0.2.9": pod(None),
        "10.0.3.1": pod("ssh-ed25519 AAAA not a key; rm -rf /"),
        "10.0.4.2": pod("ssh-rsa AAAAB3NzaC1yc2E")})
    assert text == f"10.0.0.5 {a.public}\n10.0.1.7 {b.public}\n"
    assert missing == ("10.0.2.9", "10.0.3.1", "10.0.4.2")
    assert hostkeys.known_hosts({}) == ("", ())
    # ssh looks up `[address]:port` for a port other than 22 (SUPERVISOR_SSH_PORT=2222).
    assert hostkeys.known_hosts({"10.0.0.5": pod(a.public)}, 2222) == (
        f"[10.0.0.5]:2222 {a.public}\n", ())
    assert hostkeys.known_hosts({"10.0.0.5": pod(a.public)}, 22)[0] == f"10.0.0.5 {a.public}\n"


def test_known_hosts_kept_up_to_date_is_the_same_text_as_made_anew() -> None:
    """The supervisor keeps a KnownHosts across publishes: a host gone leaves it, a pod object
    replaced (its key added) gives its line again, an unchanged object is not parsed again;
    after every change of random sequences (few changes, then many at once: the other path)
    the same text as known_hosts made anew."""
    a, b = hostkeys.from_seed(b"a" * 32, "a", 1), hostkeys.from_seed(b"b" * 32, "b", 1)
    kept = hostkeys.KnownHosts()
    first = {"10.0.0.5": pod(a.public), "10.0.2.9": pod(None)}
    assert kept.update({h: h for h in first}, first, 2222) == hostkeys.known_hosts(first, 2222)
    later = {"10.0.2.9": pod(b.public), "10.0.1.1": first["10.0.0.5"]}
    assert kept.update({h: h for h in later}, later, 2222) == (
        f"[10.0.1.1]:2222 {a.public}\n[10.0.2.9]:2222 {b.public}\n", ())
    assert kept.order == ["10.0.1.1", "10.0.2.9"]
    line = kept.seen["10.0.1.1"]
    kept.update({h: h for h in later}, later, 2222)
    assert kept.seen["10.0.1.1"] is line, "an unchanged pod object's line is reused"
    assert kept.update({h: h for h in later}, later, 22)[0].startswith("10.0.1.1 "), "a new port"
    rng = random.Random(11)
    pods: dict[str, dict] = {}
    for step in range(400):
        for _ in range(rng.choice([1, 1, 1, 3, 90])):
            name = f"w-{rng.randrange(120)}"
            if rng.random() < 0.3:
                pods.pop(name, None)
            else:
                pods[name] = pod(rng.choice([a.public, b.public, None]))
        hosts = {f"10.0.{int(n[2:]) % 7}.{n[2:]}": n for n in pods}
        got = kept.update(hosts, pods, 2222)
        assert got == hostkeys.known_hosts({h: pods[n] for h, n in hosts.items()}, 2222), step
        assert kept.order == sorted(hosts), step
