"""What the local node agent makes of a pod spec (admission, env, volumes) and the status it
reports for each local state. Pure: a fake Sources stands in for the API."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localcluster import podspec
from localcluster.podspec import ConfigError, Observed, Rejected, State

POD: dict[str, Any] = {
    "metadata": {"name": "launcher", "namespace": "ns1", "uid": "u-1",
                 "labels": {"app": "x"}},
    "spec": {"nodeName": "n1", "serviceAccountName": "sa", "restartPolicy": "Never",
             "containers": [{"name": "c", "image": "i", "command": ["python"]}]},
}


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("hello $(A)", "hello 1", id="defined-name-expands"),
    pytest.param("$(MISSING)/x", "$(MISSING)/x", id="unknown-name-stays"),
    pytest.param("$$(A)", "$(A)", id="double-dollar-escapes"),
    pytest.param("a$$b $(A)$(A)", "a$b 11", id="mixed"),
])
def test_expand_is_the_kubelets(text: str, expected: str) -> None:
    assert podspec.expand(text, {"A": "1"}) == expected


@pytest.mark.parametrize(("spec", "words"), [
    pytest.param({"restartPolicy": "OnFailure"}, ["restartPolicy OnFailure (only Never)"],
                 id="restart-policy"),
    pytest.param({"restartPolicy": "Always", "initContainers": [{"name": "i"}],
                  "containers": [{"name": "a"}, {"name": "b"}]},
                 ["restartPolicy Always", "2 containers (only one)", "initContainers"],
                 id="everything-at-once"),
])
def test_admission_names_every_unsupported_feature(spec: dict, words: list[str]) -> None:
    with pytest.raises(Rejected) as e:
        podspec.admit({**POD, "spec": {**POD["spec"], **spec}})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_admission_returns_the_one_container() -> None:
    assert podspec.admit(POD) == POD["spec"]["containers"][0]


def test_env_values_field_refs_and_expansion_in_order() -> None:
    container = {"env": [
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "URL", "value": "http://$(IP):80/$(LATER)"},
        {"name": "LATER", "value": "late"},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
    ]}
    env = podspec.container_env(POD, container, "127.9.0.1", {"BASE": "b"})
    assert env == {"BASE": "b", "IP": "127.9.0.1", "APP": "x",
                   "URL": "http://127.9.0.1:80/$(LATER)", "LATER": "late", "SA": "sa"}
    assert podspec.container_command({"command": ["echo", "$(APP)"], "args": ["$(IP)"]},
                                     env) == ["echo", "x", "127.9.0.1"]


@pytest.mark.parametrize(("container", "message"), [
    pytest.param({"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
                 "env S: valueFrom.secretKeyRef is not supported", id="secretKeyRef"),
    pytest.param({"env": [{"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}}]},
                 "fieldRef spec.x is not supported", id="unknown-fieldRef"),
    pytest.param({"envFrom": [{"configMapRef": {"name": "c"}}]}, "envFrom is not supported",
                 id="envFrom"),
])
def test_unsupported_env_is_a_permanent_config_error(container: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        podspec.container_env(POD, container, None, {})
    assert message in str(e.value) and not e.value.retry


def test_a_container_without_command_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no command"):
        podspec.container_command({"args": ["x"]}, {})


class FakeSources:
    def __init__(self) -> None:
        self.config_maps = {"cm": {"a.sh": b"echo a", "b": b"B"}}
        self.secrets = {"ssh": {"ssh-publickey": b"ssh-ed25519 AAA"}}

    def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None:
        return self.config_maps.get(name)

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        return self.secrets.get(name)

    def token(self, pod: dict, audience: str | None, expiration_s: int) -> str:
        return f"token-for-{pod['metadata']['name']}-{audience}-{expiration_s}"


def files_under(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (p.read_text(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_volumes_land_under_the_root_at_their_mount_paths(tmp_path: Path) -> None:
    pod = {**POD, "spec": {**POD["spec"], "volumes": [
        {"name": "edl", "emptyDir": {}},
        {"name": "scripts", "configMap": {"name": "cm", "defaultMode": 0o755,
                                          "items": [{"key": "a.sh", "path": "bin/a.sh"}]}},
        {"name": "keys", "secret": {"secretName": "ssh", "defaultMode": 0o600}},
        {"name": "kube-api-access-x", "projected": {"defaultMode": 0o644, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "cm", "items": [{"key": "b", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}},
        {"name": "unmounted", "hostPath": {"path": "/"}},
    ]}}
    container = {"volumeMounts": [
        {"name": "edl", "mountPath": "/etc/edl"},
        {"name": "scripts", "mountPath": "/opt/scripts"},
        {"name": "keys", "mountPath": "/root/.ssh"},
        {"name": "kube-api-access-x",
         "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
    ]}
    dirs = podspec.write_volumes(pod, container, tmp_path, FakeSources(), "127.9.0.1")

    assert dirs == {"edl": tmp_path / "etc/edl", "scripts": tmp_path / "opt/scripts",
                    "keys": tmp_path / "root/.ssh",
                    "kube-api-access-x": tmp_path / "var/run/secrets/kubernetes.io/serviceaccount"}
    assert (tmp_path / "etc/edl").is_dir()
    sa = "var/run/secrets/kubernetes.io/serviceaccount"
    assert files_under(tmp_path) == {
        "opt/scripts/bin/a.sh": ("echo a", 0o755),
        "root/.ssh/ssh-publickey": ("ssh-ed25519 AAA", 0o600),
        f"{sa}/token": ("token-for-launcher-None-3607", 0o644),
        f"{sa}/ca.crt": ("B", 0o644),
        f"{sa}/namespace": ("ns1", 0o644),
    }


@pytest.mark.parametrize(("volume", "message", "retry"), [
    pytest.param({"configMap": {"name": "nope"}}, "configMap nope not found", True,
                 id="missing-configMap-may-appear"),
    pytest.param({"configMap": {"name": "cm", "items": [{"key": "zz", "path": "z"}]}},
                 "configMap cm has no key zz", True, id="missing-key"),
    pytest.param({"hostPath": {"path": "/"}}, "hostPath is not supported", False,
                 id="hostPath-unsupported"),
])
def test_volume_problems_are_config_errors(tmp_path: Path, volume: dict, message: str,
                                           retry: bool) -> None:
    pod = {**POD, "spec": {**POD["spec"], "volumes": [{"name": "v", **volume}]}}
    with pytest.raises(ConfigError) as e:
        podspec.write_volumes(pod, {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                              tmp_path, FakeSources(), None)
    assert message in str(e.value) and e.value.retry is retry


def test_an_optional_missing_configmap_is_an_empty_volume(tmp_path: Path) -> None:
    pod = {**POD, "spec": {**POD["spec"], "volumes": [
        {"name": "v", "configMap": {"name": "nope", "optional": True}}]}}
    podspec.write_volumes(pod, {"volumeMounts": [{"name": "v", "mountPath": "/v"}]}, tmp_path,
                          FakeSources(), None)
    assert (tmp_path / "v").is_dir() and files_under(tmp_path) == {}


T0, T1, T2, T3 = (f"2026-11-21T10:00:0{i}Z" for i in range(4))
BASE = Observed(State.CREATING, container="worker", image="worker:local", start_time=T0,
                ip="127.9.0.1")


def test_a_killed_container_is_reported_like_a_kubelet_does() -> None:
    o = Observed(State.EXITED, container="worker", image="worker:local", start_time=T0,
                 ip="127.9.0.1", container_id="local://42", started_at=T1, ready_at=T2,
                 exit_code=137, finished_at=T3)
    assert podspec.pod_status(o) == {
        "phase": "Failed", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "startTime": T0, "podIP": "127.9.0.1", "podIPs": [{"ip": "127.9.0.1"}],
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": T3},
            {"type": "Initialized", "status": "True", "lastTransitionTime": T0},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": T3,
             "reason": "PodCompleted"},
            {"type": "Ready", "status": "False", "lastTransitionTime": T3,
             "reason": "PodCompleted"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0},
        ],
        "containerStatuses": [{
            "name": "worker", "image": "worker:local", "imageID": "", "ready": False,
            "started": False, "restartCount": 0, "containerID": "local://42",
            "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                     "containerID": "local://42", "startedAt": T1,
                                     "finishedAt": T3}},
        }],
    }


@pytest.mark.parametrize(("changes", "phase", "state", "ready"), [
    pytest.param({}, "Pending", {"waiting": {"reason": "ContainerCreating"}}, "False",
                 id="creating-is-pending"),
    pytest.param({"state": State.WAITING, "message": "no key"}, "Pending",
                 {"waiting": {"reason": "CreateContainerConfigError", "message": "no key"}},
                 "False", id="config-error-is-pending"),
    pytest.param({"state": State.RUNNING, "started_at": T1}, "Running",
                 {"running": {"startedAt": T1}}, "False", id="running-not-yet-listening"),
    pytest.param({"state": State.RUNNING, "started_at": T1, "ready_at": T2}, "Running",
                 {"running": {"startedAt": T1}}, "True", id="running-and-ready"),
    pytest.param({"state": State.EXITED, "started_at": T1, "exit_code": 0, "finished_at": T3},
                 "Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed",
                                              "containerID": "", "startedAt": T1,
                                              "finishedAt": T3}}, "False", id="exit-0"),
    pytest.param({"state": State.EXITED, "exit_code": 128, "start_error": True,
                  "message": "python: not found", "finished_at": T3},
                 "Failed", {"terminated": {"exitCode": 128, "reason": "StartError",
                                           "containerID": "", "startedAt": T3,
                                           "finishedAt": T3, "message": "python: not found"}},
                 "False", id="start-error"),
])
def test_status_per_local_state(changes: dict, phase: str, state: dict, ready: str) -> None:
    status = podspec.pod_status(replace(BASE, **changes))
    assert status["phase"] == phase
    assert status["containerStatuses"][0]["state"] == state
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == ready


def test_a_rejected_pod_is_failed_with_the_reason() -> None:
    o = replace(BASE, state=State.REJECTED, message="Pod was rejected: x", ip=None)
    assert podspec.pod_status(o) == {"phase": "Failed", "reason": "UnsupportedByLocalNodeAgent",
                                     "message": "Pod was rejected: x", "startTime": T0}


def test_digest_ignores_what_others_add_but_sees_what_they_change() -> None:
    ours = podspec.pod_status(replace(BASE, state=State.RUNNING, started_at=T1,
                                              ready_at=T2))
    served = {**ours, "qosClass": "BestEffort",
              "conditions": [*ours["conditions"],
                             {"type": "DisruptionTarget", "status": "True"}],
              "containerStatuses": [{**ours["containerStatuses"][0], "lastState": {}}]}
    assert podspec.status_digest(served) == podspec.status_digest(ours)
    marked = {**served, "conditions": [{**c, "status": "False"} if c["type"] == "Ready" else c
                                       for c in served["conditions"]]}
    assert podspec.status_digest(marked) != podspec.status_digest(ours)
