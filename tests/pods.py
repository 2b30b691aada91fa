"""Pods run by the local node agent in tests: manifests, reads and waits (no fixtures here).

Objects are read as API-shaped dicts (camelCase JSON), the shapes `kubectl get -o json` shows.
`agent_pods(...)` runs a NodeAgent for one namespace, with the job's ssh Secret in place, and
yields an `AgentPods` to create, reach and watch its pods.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.controlplane import ControlPlane
from localcluster.nodeagent import AgentSettings, NodeAgent
from localcluster.sshd import KeyPair, ssh_client_args
from tests.helpers import wait_for

SSH_PORT = 2222
JOB_LABELS = {"elastic-supervisor/job": "job1", "elastic-supervisor/role": "worker"}
Pod = dict[str, Any]


def worker_pod(name: str, node_selector: dict[str, str], *, grace_s: int = 5,
               port: int = SSH_PORT, secret: str = "ssh") -> Pod:
    """A worker pod (sshd on `port`, key from Secret `secret`) for the scheduler to place."""
    return {
        "metadata": {"name": name, "labels": dict(JOB_LABELS)},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": grace_s,
            "nodeSelector": node_selector,
            "containers": [{
                "name": "worker", "image": "worker:local",
                "command": ["/usr/sbin/sshd", "-D"],
                "ports": [{"name": "ssh", "containerPort": port}],
                "volumeMounts": [{"name": "ssh", "mountPath": "/root/.ssh", "readOnly": True}],
            }],
            "volumes": [{"name": "ssh", "secret": {"secretName": secret, "defaultMode": 0o600}}],
        },
    }


def container_state(pod: Pod) -> dict[str, Any]:
    """Return the state of the pod's first container ({} before a kubelet reported one)."""
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("state") or {}


def condition(pod: Pod | None, kind: str) -> str | None:
    return next((c["status"] for c in (pod or {}).get("status", {}).get("conditions") or ()
                 if c["type"] == kind), None)


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie has ended too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class AgentPods:
    """The pods of `namespace` on `agent`; worker pods accept `key`."""

    core: client.CoreV1Api
    namespace: str
    agent: NodeAgent
    key: KeyPair

    def ref(self, name: str) -> str:
        """The agent's name for a pod: namespace/name."""
        return f"{self.namespace}/{name}"

    def start_worker(self, name: str = "w0", node_selector: dict[str, str] | None = None,
                     ) -> Pod:
        """Create a worker pod for the scheduler and wait until it is Running and Ready."""
        self.core.create_namespaced_pod(
            self.namespace, worker_pod(name, node_selector or self.agent.node_selector))
        return self.wait_running(name)

    def read(self, name: str) -> Pod | None:
        """Return the pod as the API serves it, or None if it does not exist."""
        try:
            resp = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return json.loads(resp.data)

    def wait(self, name: str, what: str, predicate: Callable[[Pod], bool], *,
             timeout: float = 30, interval: float = 0.1) -> Pod:
        """Wait until the pod exists and `predicate(pod)` holds; return the pod."""
        def check() -> Pod | None:
            pod = self.read(name)
            return pod if pod is not None and predicate(pod) else None

        return wait_for(check, timeout, interval, what=f"pod {self.ref(name)} {what}")

    def wait_running(self, name: str, timeout: float = 30) -> Pod:
        return self.wait(name, "Running and Ready",
                         lambda p: p["status"].get("phase") == "Running"
                         and condition(p, "Ready") == "True", timeout=timeout)

    def wait_terminated(self, name: str, timeout: float = 30) -> Pod:
        return self.wait(name, "terminated", lambda p: "terminated" in container_state(p),
                         timeout=timeout)

    def wait_gone(self, name: str, timeout: float = 30) -> None:
        wait_for(lambda: self.read(name) is None, timeout, what=f"pod {self.ref(name)} deleted")

    def ssh(self, ip: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run `command` on a worker pod over ssh and wait for it."""
        return subprocess.run(["ssh", *ssh_client_args(self.key, SSH_PORT), ip, command],
                              capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)

    def session(self, ip: str, command: str) -> subprocess.Popen[bytes]:
        """Start `command` over ssh on a worker pod, in the background (the caller reaps it)."""
        return subprocess.Popen(["ssh", *ssh_client_args(self.key, SSH_PORT), ip, command],
                                stdin=subprocess.DEVNULL)

    def processes(self, name: str) -> list[psutil.Process]:
        return self.agent.processes(self.ref(name))


@contextlib.contextmanager
def agent_pods(cp: ControlPlane, core: client.CoreV1Api, namespace: str, keys: Path,
               **settings: Any) -> Iterator[AgentPods]:
    """Run a node agent for `namespace` with the job's ssh Secret (mpi-operator's layout, key
    pair made in `keys`); fail the test if the agent's sync loop hit a bug."""
    key = KeyPair.generate(keys)
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": "ssh"}, "type": "kubernetes.io/ssh-auth",
        "stringData": {"ssh-privatekey": key.private.read_text(),
                       "ssh-publickey": key.public.read_text()}})
    agent = NodeAgent(cp, AgentSettings(namespaces=(namespace,), **settings)).start()
    try:
        yield AgentPods(core, namespace, agent, key)
    finally:
        agent.close()
    assert agent.errors == [], agent.errors
