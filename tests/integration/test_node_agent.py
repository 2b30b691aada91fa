"""The local node agent plays a real kubelet for its nodes, on the real control plane.

Pods are placed by the real scheduler, run as real process trees (an sshd per worker pod on its
own loopback address), and their status, exit codes and deletions look as a kubelet makes them
look. Faults (signals, exit codes, freezes, a silent node) are real ones.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from kubernetes import client, watch

from localcluster.controlplane import ControlPlane
from localcluster.sshd import KeyPair, ssh_client_args
from tests.helpers import NODE_GRACE_S, wait_for
from tests.pods import SSH_PORT, AgentPods, agent_pods, condition, container_state, gone


@pytest.fixture
def pods(control_plane: ControlPlane, core: client.CoreV1Api, namespace: str,
         tmp_path: Path) -> Iterator[AgentPods]:
    with agent_pods(control_plane, core, namespace, tmp_path / "keys") as p:
        yield p


def test_worker_pod_is_scheduled_runs_sshd_on_its_ip_and_reports_running_ready(
        pods: AgentPods, tmp_path: Path) -> None:
    pod = pods.start_worker("w0")

    assert pod["spec"]["nodeName"] in pods.agent.nodes, "bound by the scheduler to an agent node"
    status = pod["status"]
    ip = status["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    assert status["podIPs"] == [{"ip": ip}]
    assert pods.agent.address(pods.ref("w0")) == (ip, SSH_PORT)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "ContainersReady": "True",
        "Ready": "True", "PodScheduled": "True"}
    cs = status["containerStatuses"][0]
    assert (cs["name"], cs["ready"], cs["started"], cs["restartCount"]) == ("worker", True,
                                                                           True, 0)
    assert list(cs["state"]) == ["running"] and status["startTime"]

    out = pods.ssh(ip, "echo $((6 * 7)) $LOCALCLUSTER_POD")
    assert out.returncode == 0, out.stderr
    answer, marker = out.stdout.split()
    assert answer == "42"
    assert marker == f"{pods.agent.id}/{pod['metadata']['uid']}", "sessions carry the marker"

    stranger = KeyPair.generate(tmp_path / "stranger")
    denied = subprocess.run(["ssh", *ssh_client_args(stranger, SSH_PORT), ip, "true"],
                            capture_output=True, timeout=20, check=False)
    assert denied.returncode == 255, "only the key from the job's Secret is accepted"


@pytest.mark.parametrize(("fault", "expected"), [
    pytest.param(("kill", signal.SIGKILL), (137, "Error", "Failed"), id="SIGKILL-is-137"),
    pytest.param(("exit", 3), (3, "Error", "Failed"), id="exit-3-is-3"),
    pytest.param(("exit", 0), (0, "Completed", "Succeeded"), id="exit-0-succeeds"),
    # sshd exits 0 on SIGTERM (sshd.c: exit(received_sigterm == SIGTERM ? 0 : 255)), in a
    # container too: a worker pod stopped this way reports success.
    pytest.param(("kill", signal.SIGTERM), (0, "Completed", "Succeeded"),
                 id="SIGTERM-is-sshd-exit-0"),
])
def test_a_dying_pod_reports_its_real_exit_code(
        pods: AgentPods, fault: tuple[str, int], expected: tuple[int, str, str]) -> None:
    pod = pods.start_worker("w0")
    session = pods.session(pod["status"]["podIP"], "sleep 600")
    try:
        wait_for(lambda: any(p.name() == "sleep" for p in pods.processes("w0")), 10,
                 what="the ssh session's sleep")
        pids = [p.pid for p in pods.processes("w0")]
        method, arg = fault
        getattr(pods.agent, method)(pods.ref("w0"), arg)

        done = pods.wait_terminated("w0")
        assert session.wait(10) == 255, "the ssh client sees its session die"
    finally:
        session.kill()
        session.wait()
    term = container_state(done)["terminated"]
    assert list(container_state(done)) == ["terminated"]
    assert (term["exitCode"], term["reason"], done["status"]["phase"]) == expected
    assert term["startedAt"] <= term["finishedAt"]
    assert condition(done, "Ready") == "False"
    assert all(gone(pid) for pid in pids), "every process of the pod ended"


def detached_sleep(pods: AgentPods, ip: str) -> int:
    """Start a `sleep` over ssh that leaves its session (setsid, nohup); return its pid."""
    out = pods.ssh(ip, "setsid nohup sleep 601 >/dev/null 2>&1 </dev/null & echo $!")
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.parametrize("grace", [pytest.param(5, id="graceful"), pytest.param(0, id="force")])
def test_delete_kills_the_whole_tree_and_the_pod_disappears(pods: AgentPods, grace: int) -> None:
    ip = pods.start_worker("w0")["status"]["podIP"]
    session = pods.session(ip, "sleep 600")
    try:
        detached = detached_sleep(pods, ip)
        wait_for(lambda: sum(p.name() == "sleep" for p in pods.processes("w0")) == 2, 10,
                 what="both sleeps in the pod's tree")
        tree = [p.pid for p in pods.processes("w0")]
        assert detached in tree, "a process that left its ssh session is still in the pod"

        started = time.monotonic()
        pods.core.delete_namespaced_pod("w0", pods.namespace, grace_period_seconds=grace)
        pods.wait_gone("w0", timeout=grace + 15)
        took = time.monotonic() - started
        assert session.wait(10) == 255
    finally:
        session.kill()
        session.wait()
    if grace == 0:  # the object is gone at once; the agent kills when it sees that
        wait_for(lambda: all(gone(pid) for pid in tree), 10, what="the tree killed")
    else:  # the agent confirms the deletion only once the tree is gone
        assert [pid for pid in tree if not gone(pid)] == []
        assert took < grace, "SIGTERM ended the tree within the grace period"


IGNORE_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ignoring SIGTERM', flush=True)\n"
    "time.sleep(600)\n")


def test_graceful_delete_kills_after_the_grace_period_and_reports_it_first(
        pods: AgentPods) -> None:
    pods.core.create_namespaced_pod(pods.namespace, {
        "metadata": {"name": "stubborn"},
        "spec": {"restartPolicy": "Never", "nodeSelector": pods.agent.node_selector,
                 "terminationGracePeriodSeconds": 2,
                 "containers": [{"name": "main", "image": "launcher:local",
                                 "command": ["python", "-c", IGNORE_SIGTERM]}]}})
    pods.wait_running("stubborn")
    wait_for(lambda: "ignoring SIGTERM" in pods.agent.log(pods.ref("stubborn")), 15,
             what="the handler installed")
    rv = pods.core.list_namespaced_pod(pods.namespace).metadata.resource_version
    started = time.monotonic()
    pods.core.delete_namespaced_pod("stubborn", pods.namespace)
    events, w = [], watch.Watch()
    for e in w.stream(pods.core.list_namespaced_pod, pods.namespace, resource_version=rv,
                      field_selector="metadata.name=stubborn", timeout_seconds=20):
        events.append((e["type"], e["raw_object"]))
        if e["type"] == "DELETED":
            w.stop()
    took = time.monotonic() - started
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "DELETED", kinds
    assert took >= 2, "only the SIGKILL after the grace period ended it"
    # The first event carries the deletion; the kubelet's final status comes before it is gone.
    terminated = [obj for _, obj in events if "terminated" in container_state(obj)]
    assert terminated, "the final status is written before the kubelet confirms the deletion"
    assert container_state(terminated[0])["terminated"]["exitCode"] == 137
    assert terminated[0]["status"]["phase"] == "Failed"


def test_freeze_stops_the_tree_and_thaw_resumes_it(pods: AgentPods) -> None:
    ip = pods.start_worker("w0")["status"]["podIP"]
    detached_sleep(pods, ip)

    pods.agent.freeze(pods.ref("w0"))
    states = {p.pid: p.status() for p in pods.processes("w0")}
    assert len(states) >= 2 and set(states.values()) == {psutil.STATUS_STOPPED}
    frozen = subprocess.run(["timeout", "3", "ssh", *ssh_client_args(pods.key, SSH_PORT), ip,
                             "true"], capture_output=True, check=False)
    assert frozen.returncode == 124, "a frozen sshd accepts TCP but never answers"
    assert condition(pods.read("w0"), "Ready") == "True", "a frozen pod still looks Ready"

    pods.agent.thaw(pods.ref("w0"))
    assert psutil.STATUS_STOPPED not in {p.status() for p in pods.processes("w0")}
    assert pods.ssh(ip, "true").returncode == 0


PROBE = """
import json, os
from pathlib import Path
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_kube_config()  # from KUBECONFIG: the pod's ServiceAccount token
core = client.CoreV1Api()
me = client.AuthenticationV1Api().create_self_subject_review({}).status.user_info.username
try:
    core.list_node()
    nodes = 200
except ApiException as e:
    nodes = e.status
root = Path(os.environ["ES_VOLUME_ROOT"])
sa = root / "var/run/secrets/kubernetes.io/serviceaccount"
print(json.dumps({
    "pods": sorted(p.metadata.name
                   for p in core.list_namespaced_pod(os.environ["POD_NAMESPACE"]).items),
    "user": me, "list_nodes": nodes,
    "env": {k: os.environ[k] for k in ("MY_NAME", "MY_NS", "MY_IP", "GREETING", "POD_NAME")},
    "sa_namespace": (sa / "namespace").read_text(), "sa_token": bool((sa / "token").read_text()),
    "config": (root / "etc/probe/greeting").read_text(),
}), flush=True)
"""


def field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_launcher_pod_runs_its_command_as_its_service_account(
        pods: AgentPods, api_client: client.ApiClient) -> None:
    ns, core = pods.namespace, pods.core
    rbac = client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "launcher"}})
    rbac.create_namespaced_role(ns, {"metadata": {"name": "launcher"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "launcher"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "launcher"},
        "subjects": [{"kind": "ServiceAccount", "name": "launcher", "namespace": ns}]})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "probe"},
                                           "data": {"greeting": "from a ConfigMap"}})
    core.create_namespaced_pod(ns, {
        "metadata": {"name": "launcher", "labels": {"elastic-supervisor/role": "launcher"}},
        "spec": {
            "restartPolicy": "Never", "serviceAccountName": "launcher",
            "nodeSelector": pods.agent.node_selector,
            "containers": [{
                "name": "launcher", "image": "launcher:local",
                "command": ["python", "-c"], "args": [PROBE],
                "env": [{"name": "MY_NAME", **field("metadata.name")},
                        {"name": "MY_NS", **field("metadata.namespace")},
                        {"name": "MY_IP", **field("status.podIP")},
                        {"name": "GREETING", "value": "hello $(MY_NAME)"}],
                "volumeMounts": [{"name": "probe", "mountPath": "/etc/probe"}],
            }],
            "volumes": [{"name": "probe", "configMap": {"name": "probe"}}],
        }})

    done = pods.wait("launcher", "finished",
                     lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout=60)
    output = pods.agent.log(pods.ref("launcher"))
    assert done["status"]["phase"] == "Succeeded", output
    term = container_state(done)["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    report = json.loads(output.strip().splitlines()[-1])
    assert report == {
        "pods": ["launcher"], "user": f"system:serviceaccount:{ns}:launcher",
        "list_nodes": 403,
        "env": {"MY_NAME": "launcher", "MY_NS": ns, "MY_IP": done["status"]["podIP"],
                "GREETING": "hello launcher", "POD_NAME": "launcher"},
        "sa_namespace": ns, "sa_token": True, "config": "from a ConfigMap",
    }


@pytest.mark.parametrize(("spec", "expected"), [
    pytest.param({"restartPolicy": "OnFailure"}, ("Failed", "restartPolicy OnFailure"),
                 id="restartPolicy-OnFailure-rejected"),
    pytest.param({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
                 ("Pending", "valueFrom.secretKeyRef is not supported"),
                 id="secretKeyRef-env-is-a-config-error"),
])
def test_what_the_agent_cannot_run_is_reported_on_the_pod(
        pods: AgentPods, spec: dict, expected: tuple[str, str]) -> None:
    container = {"name": "c", "image": "x", "command": ["true"], "env": spec.get("env", [])}
    pods.core.create_namespaced_pod(pods.namespace, {
        "metadata": {"name": "odd"},
        "spec": {"restartPolicy": spec.get("restartPolicy", "Never"),
                 "nodeSelector": pods.agent.node_selector, "containers": [container]}})
    phase, message = expected

    def reported(pod: dict) -> bool:
        status = pod["status"]
        waiting = container_state(pod).get("waiting", {})
        return status.get("phase") == phase and message in (status.get("message", "")
                                                             + waiting.get("message", ""))

    pod = pods.wait("odd", f"{phase} with {message!r}", reported, timeout=15)
    if phase == "Pending":
        assert container_state(pod)["waiting"]["reason"] == "CreateContainerConfigError"


def node_ready(core: client.CoreV1Api, name: str) -> str | None:
    node = core.read_node(name)
    return next((c.status for c in node.status.conditions or () if c.type == "Ready"), None)


def test_a_silenced_node_goes_not_ready_while_its_pods_keep_running(pods: AgentPods) -> None:
    core, (quiet, loud) = pods.core, pods.agent.nodes
    on_quiet = {"kubernetes.io/hostname": quiet}
    kept = pods.start_worker("kept", node_selector=on_quiet)
    doomed = pods.start_worker("doomed", node_selector=on_quiet)
    assert kept["spec"]["nodeName"] == doomed["spec"]["nodeName"] == quiet
    pids = [p.pid for p in pods.processes("doomed")]

    pods.agent.silence(quiet)
    wait_for(lambda: node_ready(core, quiet) == "Unknown", NODE_GRACE_S + 15, interval=0.5,
             what=f"node {quiet} NotReady (Unknown)")
    assert node_ready(core, loud) == "True", "the other node's kubelet still reports"
    # The node-lifecycle controller marks the silent node's pods not Ready; they still run.
    pods.wait("kept", "marked not Ready", lambda p: condition(p, "Ready") == "False")
    assert pods.ssh(kept["status"]["podIP"], "true").returncode == 0

    # A dead kubelet stops nothing: the force-deleted pod's processes live on...
    core.delete_namespaced_pod("doomed", pods.namespace, grace_period_seconds=0)
    pods.wait_gone("doomed")
    assert not any(gone(pid) for pid in pids)
    # ...until the kubelet comes back, finds the pod gone, and reports the other Ready again.
    pods.agent.resume(quiet)
    wait_for(lambda: all(gone(pid) for pid in pids), 15, what="the orphaned pod's processes end")
    pods.wait_running("kept")
    wait_for(lambda: node_ready(core, quiet) == "True", 30, interval=0.5,
             what=f"node {quiet} Ready again")
