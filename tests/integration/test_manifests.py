"""manifests/: built with the control plane's own kubectl (kustomize), applied to the real API
server, and held to what the supervisor knows.

- Every overlay (and the base) passes `kubectl apply --dry-run=server -k`.
- The launcher's SUPERVISOR_* variables all exist in supervisor.config and parse; the worker
  template passes validate_template, the initial workers are exactly the pods worker_pod makes
  from it, the policy passes policy_from_document.
- RBAC: the Role and ClusterRoles grant exactly what supervisor/kube/ calls (plus what the
  replacement code will), and a real token of the manifests' ServiceAccount is allowed all of
  it and refused the rest (SelfSubjectAccessReview).
Doctored inputs prove each check can fail. The manifests are copied to a temporary directory
with a fresh ssh key pair (manifests/ssh-keygen.sh), so the repository is never written.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from localcluster.controlplane import ControlPlane, Settings, read_versions
from localcluster.kubelet import pod_status_running
from supervisor import cleanup, hostkeys, kube
from supervisor.config import (
    DEFAULT_SELECTOR,
    KNOWN,
    PREFIX,
    SHARED_DIR,
    CleanPodPolicy,
    ConfigError,
    SshHostKeys,
    known_hosts_path,
    parse_config,
)
from supervisor.decide.fleet import budget_name, scale_name, state_name
from supervisor.decide.policy import Action, PolicyError, policy_from_document
from supervisor.hookmap import hook_bytecode, hook_configmap, with_hook
from supervisor.leader import lease_name
from supervisor.model import ExitCode
from supervisor.sidecar import hook_sources, pod_problems
from supervisor.workers import (
    LABEL_SLOT,
    TemplateError,
    owner_reference,
    validate_template,
    worker_pod,
)
from tests.helpers import wait_for
from tests.integration.harness import AutoKubelet, Job, SupervisorProcess

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "supervisor" / "kube"  # the package that alone imports the client
TARGETS = ["base", "overlays/kind", "overlays/local", "overlays/standby", "overlays/sidecar"]
NAMESPACE = "elastic-supervisor"  # where the manifests put the job
JOB = "<job namespace>"  # stands for the job's namespace in the permission tables below
CLUSTER = None  # cluster-scoped

# (API group, resource, verb, namespace, object name or None for any)
Permission = tuple[str, str, str, str | None, str | None]
STATE = state_name("elastic-train")  # the job's own ConfigMaps and Lease
SCALE = scale_name("elastic-train")
LEADER = lease_name("elastic-train")
BUDGET = budget_name("elastic-train")

# Every Kubernetes API method supervisor/kube/ calls -> what it needs of the supervisor's
# ServiceAccount. None: not called by `run` (tests, and a `status` run with a user's own
# credentials). A new call fails test_every_kube_call_is_accounted_for until it is added here
# and, if `run` makes it, to manifests/base/rbac.yaml.
KUBE_CALLS: dict[str, list[Permission] | None] = {
    "list_namespaced_pod": [("", "pods", "list", JOB, None), ("", "pods", "watch", JOB, None)],
    "read_namespaced_pod": [("", "pods", "get", JOB, None)],
    "patch_namespaced_pod": [("", "pods", "patch", JOB, None)],
    "list_node": [("", "nodes", "list", CLUSTER, None), ("", "nodes", "watch", CLUSTER, None)],
    "create_namespaced_event": [("events.k8s.io", "events", "create", JOB, None)],
    "patch_namespaced_event": [("events.k8s.io", "events", "patch", JOB, None)],
    "read_namespaced_config_map": [("", "configmaps", "get", JOB, STATE)],
    "list_namespaced_config_map": [("", "configmaps", "list", JOB, SCALE),
                                   ("", "configmaps", "watch", JOB, SCALE)],
    "create_namespaced_config_map": [("", "configmaps", "create", JOB, None)],
    "replace_namespaced_config_map": [("", "configmaps", "update", JOB, STATE)],
    "create_namespaced_pod": [("", "pods", "create", JOB, None)],
    "delete_namespaced_pod": [("", "pods", "delete", JOB, None)],
    "delete_collection_namespaced_pod": [("", "pods", "deletecollection", JOB, None)],
    "list_namespaced_lease": [
        ("coordination.k8s.io", "leases", "list", "kube-node-lease", None),
        ("coordination.k8s.io", "leases", "watch", "kube-node-lease", None)],
    "read_namespaced_lease": [("coordination.k8s.io", "leases", "get", JOB, LEADER)],
    "create_namespaced_lease": [("coordination.k8s.io", "leases", "create", JOB, None)],
    "replace_namespaced_lease": [("coordination.k8s.io", "leases", "update", JOB, LEADER)],
    "list_namespaced_event": None,
    "create_namespaced_secret": [("", "secrets", "create", JOB, None)],
    "create_namespaced_pod_disruption_budget": [
        ("policy", "poddisruptionbudgets", "create", JOB, None)],
    "patch_namespaced_pod_disruption_budget": [
        ("policy", "poddisruptionbudgets", "patch", JOB, BUDGET)],
    # At the end: does the Job run another launcher (supervisor.cleanup.terminal)?
    "read_namespaced_job": [("batch", "jobs", "get", JOB, "elastic-train")],
}
# What admission (not a call) asks of the supervisor: OwnerReferencesPermissionEnforcement lets
# only who may set finalizers on the owner (the launcher Job) set blockOwnerDeletion on a
# reference to it, and only who may delete an object change its ownerReferences (re-owning the
# state of an older launcher pod; pods are deletable anyway).
ADMISSION: list[Permission] = [
    ("batch", "jobs/finalizers", "update", JOB, "elastic-train"),
    ("", "configmaps", "delete", JOB, STATE),
]
# The API classes supervisor/kube/ uses (so create_namespaced_event is known to be events.k8s.io).
KUBE_API_CLASSES = {"CoreV1Api", "EventsV1Api", "CoordinationV1Api", "BatchV1Api",
                    "PolicyV1Api"}
DENIED: list[Permission] = [
    # Nothing the code does not use: no single reads of nodes or node Leases, no other
    # ConfigMap, Lease or Job than the job's own.
    ("", "nodes", "get", CLUSTER, None),
    ("coordination.k8s.io", "leases", "get", "kube-node-lease", None),
    ("", "pods", "update", JOB, None), ("", "pods", "deletecollection", "default", None),
    ("", "pods", "list", "default", None), ("", "pods/exec", "create", JOB, None),
    ("", "configmaps", "delete", JOB, None), ("", "configmaps", "delete", JOB, SCALE),
    ("", "configmaps", "update", JOB, None), ("", "configmaps", "update", JOB, SCALE),
    ("", "configmaps", "update", JOB, "elastic-supervisor-policy"),
    ("", "configmaps", "get", JOB, "elastic-supervisor-worker-template"),
    ("", "configmaps", "list", JOB, None), ("", "configmaps", "list", "default", None),
    ("", "secrets", "get", JOB, None), ("events.k8s.io", "events", "delete", JOB, None),
    ("", "events", "create", JOB, None), ("batch", "jobs", "get", JOB, None),
    ("batch", "jobs", "get", JOB, "another-job"), ("batch", "jobs", "update", JOB, "elastic-train"),
    ("batch", "jobs/finalizers", "update", JOB, "another-job"),
    ("", "nodes", "patch", CLUSTER, None), ("", "nodes", "delete", CLUSTER, None),
    ("coordination.k8s.io", "leases", "list", "default", None),
    ("coordination.k8s.io", "leases", "update", "kube-node-lease", None),
    ("coordination.k8s.io", "leases", "update", JOB, "another-job-supervisor-leader"),
    ("coordination.k8s.io", "leases", "delete", JOB, LEADER),
    ("policy", "poddisruptionbudgets", "patch", JOB, "another-job-supervisor-workers"),
    ("policy", "poddisruptionbudgets", "delete", JOB, BUDGET),
    ("policy", "poddisruptionbudgets", "update", JOB, BUDGET),
]


def needed() -> set[Permission]:
    return {p for perms in KUBE_CALLS.values() for p in perms or ()} | set(ADMISSION)


# ---- building ----------------------------------------------------------------------------------

def kubectl_path() -> Path:
    return Settings().bin_dir / "kubectl"


def kubectl(*args: str, kubeconfig: Path | None = None, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(kubectl_path()), *args]
    if kubeconfig is not None:
        argv[1:1] = ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120,
                            check=False)
    if check and result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def build(directory: Path) -> list[dict[str, Any]]:
    """Return the documents `kubectl kustomize` makes of `directory`."""
    return [d for d in yaml.safe_load_all(kubectl("kustomize", str(directory)).stdout) if d]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of manifests/ with a fresh key pair in base/ssh (the Secret's files)."""
    copy_dir = tmp_path_factory.mktemp("manifests") / "manifests"
    shutil.copytree(ROOT / "manifests", copy_dir,
                    ignore=shutil.ignore_patterns("ssh", "__pycache__"))
    subprocess.run([str(copy_dir / "ssh-keygen.sh")], check=True, capture_output=True,
                   timeout=30)
    return copy_dir


@pytest.fixture(scope="module")
def built(manifests: Path) -> dict[str, list[dict[str, Any]]]:
    return {target: build(manifests / target) for target in TARGETS}


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def launcher(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The supervisor's container: the launcher container, or in sidecar mode the native
    sidecar."""
    spec = one(docs, "Job")["spec"]["template"]["spec"]
    return next(c for c in [*spec.get("initContainers", ()), *spec["containers"]]
                if any(e["name"] == "SUPERVISOR_JOB_NAME" for e in c.get("env", ())))


def config_file(docs: list[dict[str, Any]], volume_source: str) -> Any:
    """Return the YAML document in the ConfigMap the launcher mounts as `volume_source`."""
    volumes = one(docs, "Job")["spec"]["template"]["spec"]["volumes"]
    sources = [s["configMap"]["name"] for v in volumes if "projected" in v
               for s in v["projected"]["sources"] if "configMap" in s]
    for name in sources:
        data = one(docs, "ConfigMap", name)["data"]
        if volume_source in data:
            return yaml.safe_load(data[volume_source])
    pytest.fail(f"no ConfigMap mounted into the launcher has {volume_source} ({sources})")


# ---- env -----------------------------------------------------------------------------------

def env_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Return one line per SUPERVISOR_* variable the supervisor does not know, or set twice,
    in any container of any Job or Pod of `docs`."""
    problems = []
    for doc in docs:
        spec = {"Job": lambda d: d["spec"]["template"]["spec"],
                "Pod": lambda d: d["spec"]}.get(doc["kind"])
        if spec is None:
            continue
        for c in spec(doc).get("initContainers", []) + spec(doc)["containers"]:
            where = f"{doc['kind']} {doc['metadata']['name']}, container {c['name']}"
            names = [e["name"] for e in c.get("env", [])]
            for name in sorted({n for n in names if names.count(n) > 1}):
                problems.append(f"{where}: {name} is set twice (the last one silently wins)")
            for name in names:
                if name.startswith(PREFIX) and name not in KNOWN:
                    problems.append(f"{where}: {name} is not a variable the supervisor knows")
            if c.get("envFrom"):
                problems.append(f"{where}: envFrom hides variable names from this check")
    return problems


def resolved_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the supervisor would see it (fieldRefs filled in; the local
    overlay's $(ES_VOLUME_ROOT), the node agent's volume root, taken as the cluster's /)."""
    downward = {"metadata.namespace": NAMESPACE, "metadata.name": "elastic-train-x7k2p"}
    return {e["name"]: e["value"].replace("$(ES_VOLUME_ROOT)", "") if "value" in e
            else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env", [])}


@pytest.mark.parametrize("target", TARGETS)
def test_the_launcher_sets_only_variables_the_supervisor_knows(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = built[target]
    assert "SUPERVISOR_JOB_NAME" in resolved_env(launcher(docs))  # the check has something
    assert env_problems(docs) == []


@pytest.mark.parametrize("target", TARGETS)
def test_the_launcher_env_is_a_valid_supervisor_configuration(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    env = resolved_env(launcher(built[target]))
    files = {"worker-template.yaml": yaml.safe_dump(
        config_file(built[target], "worker-template.yaml")),
        "policy.yaml": yaml.safe_dump(config_file(built[target], "policy.yaml"))}

    secret = one(built[target], "Secret")
    ssh = {item["path"]: base64.b64decode(secret["data"][item["key"]]).decode()
           for v in one(built[target], "Job")["spec"]["template"]["spec"]["volumes"]
           if v["name"] == "ssh"
           for item in v["secret"]["items"]}

    def read_text(path: Path) -> str:  # the launcher's mounted ConfigMap and Secret files
        if str(path.parent) == "/etc/edl/ssh":
            return ssh[path.name]
        assert str(path.parent) == "/etc/edl/config", path
        return files[path.name]

    try:
        cfg = parse_config(env, pod_namespace=NAMESPACE, read_text=read_text)
    except ConfigError as e:
        pytest.fail("\n".join(e.problems))
    assert cfg.worker_template is not None and cfg.policy_file is not None
    assert cfg.policy.budgets.restart_limit == 20  # from the file, not the env default
    assert (cfg.job_name, cfg.namespace) == ("elastic-train", NAMESPACE)
    assert cfg.ssh_identity_file is not None
    mounts = {m["mountPath"]: m for m in launcher(built[target])["volumeMounts"]}
    assert cfg.hook_key_file is not None
    for path in (cfg.ssh_identity_file, cfg.discovery_file, cfg.hook_key_file[0]):
        assert str(path.parent) in mounts, f"{path}: not on a mounted volume"
    assert not mounts[str(cfg.discovery_file.parent)].get("readOnly")
    # Every worker reads the hook key at the launcher's path, from the same Secret.
    template = config_file(built[target], "worker-template.yaml")
    worker_mounts = {m["name"]: m["mountPath"]
                     for m in template["spec"]["containers"][0]["volumeMounts"]}
    volume = next(v for v in template["spec"]["volumes"] if v.get("secret"))
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    paths = {i["key"]: i["path"] for i in volume["secret"]["items"]}
    assert Path(worker_mounts[volume["name"]]) / paths["hook-key"] == cfg.hook_key_file[0]
    # No worker gets a job-wide host key: each worker's is its own (SSH_HOST_KEYS=worker),
    # and the known_hosts file the driver checks is the one the supervisor writes, on the
    # launcher's writable volume, beside the host list (in sidecar mode, the shared one that
    # horovodrun's container mounts too).
    assert "host-key" not in paths and "host-key" not in secret["data"]
    assert "known-hosts" not in secret["data"]
    assert (cfg.ssh_host_keys, cfg.ssh_known_hosts_file) == (SshHostKeys.WORKER, None)
    known_hosts = known_hosts_path(cfg)
    assert known_hosts is not None and known_hosts.parent == cfg.discovery_file.parent


def test_an_unknown_variable_in_an_overlay_is_caught(manifests: Path) -> None:
    doctored = manifests / "overlays" / "doctored"
    doctored.mkdir()
    (doctored / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../../base"],
        "patches": [{"target": {"kind": "Job", "name": "elastic-train"}, "patch": yaml.safe_dump({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "elastic-train"},
            "spec": {"template": {"spec": {"containers": [{"name": "launcher", "env": [
                {"name": "SUPERVISOR_RESTART_LIMMIT", "value": "3"}]}]}}}})}]}))
    problems = env_problems(build(doctored))
    assert problems == ["Job elastic-train, container launcher: SUPERVISOR_RESTART_LIMMIT is "
                        "not a variable the supervisor knows"]


def test_a_variable_set_twice_is_caught(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = copy.deepcopy(built["base"])
    launcher(docs)["env"].append({"name": "SUPERVISOR_LOG_LEVEL", "value": "debug"})
    assert env_problems(docs) == ["Job elastic-train, container launcher: SUPERVISOR_LOG_LEVEL "
                                  "is set twice (the last one silently wins)"]


# ---- template, initial workers, policy ---------------------------------------------------------

def selector() -> dict[str, str]:
    return dict(t.split("=") for t in DEFAULT_SELECTOR.format(job="elastic-train").split(","))


@pytest.mark.parametrize("target", TARGETS)
def test_the_launcher_is_never_evicted_for_its_nodes_health(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    spec = one(built[target], "Job")["spec"]["template"]["spec"]
    tolerated = {(t["key"], t["operator"], t["effect"], t.get("tolerationSeconds"))
                 for t in spec.get("tolerations") or ()}
    assert {("node.kubernetes.io/not-ready", "Exists", "NoExecute", None),
            ("node.kubernetes.io/unreachable", "Exists", "NoExecute", None)} <= tolerated


def test_the_standby_overlay_runs_two_launchers_on_two_nodes(
        built: dict[str, list[dict[str, Any]]]) -> None:
    job = one(built["overlays/standby"], "Job")
    assert job["spec"]["parallelism"] == 2
    assert "completions" not in job["spec"], "complete once one launcher succeeded"
    assert job["spec"]["podFailurePolicy"] == one(built["base"], "Job")["spec"][
        "podFailurePolicy"]
    template = job["spec"]["template"]
    [term] = template["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert term["labelSelector"]["matchLabels"]["elastic-supervisor/role"] == "launcher"


@pytest.mark.parametrize("target", TARGETS)
def test_no_worker_pods_are_shipped_the_supervisor_creates_them(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = built[target]
    validate_template(config_file(docs, "worker-template.yaml"), selector())
    assert find(docs, "Pod") == []
    assert resolved_env(launcher(docs))["SUPERVISOR_WORKER_TEMPLATE"] == (
        "/etc/edl/config/worker-template.yaml")


@pytest.mark.parametrize("target", TARGETS)
def test_the_workers_and_launcher_use_this_versions_images(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    docs = built[target]
    template = config_file(docs, "worker-template.yaml")
    images = {launcher(docs)["image"]} | {
        c["image"] for p in [*find(docs, "Pod"), template] for c in p["spec"]["containers"]}
    # what `make kind-load` builds; in sidecar mode the supervisor's image and the training
    # image without it
    kinds = ("sidecar", "trainer") if target == "overlays/sidecar" else ("launcher", "worker")
    assert images == {f"elastic-supervisor-{kind}:{version[1]}" for kind in kinds}


def test_the_launcher_and_workers_have_their_priority_classes(
        built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["base"]
    classes = {d["metadata"]["name"]: d for d in find(docs, "PriorityClass")}
    assert sorted(classes) == ["inference-pc", "preemptible-pc", "preserved-pc"]
    job_pod = one(docs, "Job")["spec"]["template"]["spec"]
    assert job_pod["priorityClassName"] == "preserved-pc"
    template = config_file(docs, "worker-template.yaml")
    for pod in [template, *find(docs, "Pod")]:
        assert pod["spec"]["priorityClassName"] == "preemptible-pc"
    # Online inference preempts training; within a job, a worker goes before the launcher.
    value = {name: c["value"] for name, c in classes.items()}
    assert value["inference-pc"] > value["preserved-pc"] > value["preemptible-pc"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_policy_file_is_a_valid_policy(built: dict[str, list[dict[str, Any]]],
                                           target: str) -> None:
    policy = policy_from_document(config_file(built[target], "policy.yaml"))
    assert [r.action for r in policy.rules] == [Action.RESTART, Action.RESTART, Action.FAIL_JOB,
                                                Action.IGNORE]
    assert policy.budgets.restart_limit == 20


def test_a_broken_template_or_policy_is_caught(built: dict[str, list[dict[str, Any]]]) -> None:
    template = copy.deepcopy(config_file(built["base"], "worker-template.yaml"))
    template["metadata"]["labels"][LABEL_SLOT] = "0"
    with pytest.raises(TemplateError, match="set by the supervisor"):
        validate_template(template, selector())
    policy = copy.deepcopy(config_file(built["base"], "policy.yaml"))
    policy["faultTolerantPolicy"][0]["exceptionalEvent"] = "nodeLost"
    with pytest.raises(PolicyError, match="nodeLost"):
        policy_from_document(policy)


# ---- against the API server --------------------------------------------------------------------

@pytest.fixture(scope="module")
def job_namespace(control_plane: ControlPlane,
                  built: dict[str, list[dict[str, Any]]]) -> Iterator[str]:
    """The manifests' namespace, with what a dry run cannot create but the pods' admission
    looks up: the namespace itself, the ServiceAccounts and the PriorityClasses (created for
    real; a real apply creates them first, in kustomize's order)."""
    docs = built["base"]
    prerequisites = [one(docs, "Namespace"), *find(docs, "ServiceAccount"),
                     *find(docs, "PriorityClass")]
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": prerequisites})
    kubectl("apply", "-f", "-", kubeconfig=control_plane.kubeconfig, stdin=listing)
    yield NAMESPACE
    kubectl("delete", "-f", "-", "--wait=false", kubeconfig=control_plane.kubeconfig,
            stdin=listing)


@pytest.mark.parametrize("target", TARGETS)
def test_the_api_server_accepts_the_pods_the_supervisor_builds(
        core: client.CoreV1Api, built: dict[str, list[dict[str, Any]]], job_namespace: str,
        target: str) -> None:
    template = validate_template(config_file(built[target], "worker-template.yaml"), selector())
    pod = worker_pod(template, job="elastic-train", slot=0, incarnation=2, owner=None,
                     avoid_node="node-a")
    created = core.create_namespaced_pod(job_namespace, pod, dry_run="All")
    assert created.metadata.name == "elastic-train-w0-2"


@pytest.mark.parametrize("target", TARGETS)
def test_the_api_server_accepts(control_plane: ControlPlane, manifests: Path, job_namespace: str,
                                built: dict[str, list[dict[str, Any]]], target: str) -> None:
    result = kubectl("apply", "--dry-run=server", "-k", str(manifests / target),
                     kubeconfig=control_plane.kubeconfig)
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(built[target]), result.stdout


def test_the_api_server_refuses_a_broken_manifest(control_plane: ControlPlane, manifests: Path,
                                                  job_namespace: str) -> None:
    broken = manifests / "overlays" / "broken"
    broken.mkdir()
    (broken / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../../base"],
        "patches": [{"target": {"kind": "Job"}, "patch": json.dumps([
            {"op": "replace", "path": "/spec/template/spec/restartPolicy", "value": "Always"}])}]}))
    result = kubectl("apply", "--dry-run=server", "-k", str(broken), check=False,
                     kubeconfig=control_plane.kubeconfig)
    assert result.returncode != 0
    assert "restartPolicy" in result.stderr


# ---- RBAC ----------------------------------------------------------------------------------------

def kube_calls() -> tuple[set[str], set[str]]:
    """Return (API methods, API classes) supervisor/kube/ uses from the Kubernetes client."""
    text = "\n".join(p.read_text() for p in sorted(KUBE.glob("*.py")))
    apis = {name for name in dir(client) if name.endswith("Api")}
    methods = {m for m in re.findall(r"\.([a-z_]+)\b", text)
               if any(hasattr(getattr(client, api), m) for api in apis) and not m.startswith("_")
               and m not in ("api_client",)}
    return methods, {c for c in re.findall(r"client\.(\w+Api)\(", text)}


def test_every_kube_call_is_accounted_for() -> None:
    methods, classes = kube_calls()
    assert methods and methods <= set(KUBE_CALLS), sorted(methods - set(KUBE_CALLS))
    assert classes == KUBE_API_CLASSES


def granted(docs: list[dict[str, Any]], namespace: str = NAMESPACE) -> set[Permission]:
    """Every (group, resource, verb, namespace, name) the manifests grant their supervisor
    account; `namespace` is the job's."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d["rules"]
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[Permission] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == "elastic-supervisor"
                   for s in binding["subjects"]):
            continue
        ns = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        rules = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        where = JOB if ns == namespace else ns
        out |= {(g, r, v, where, n) for rule in rules for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]
                for n in rule.get("resourceNames") or [None]}
    return out


def test_the_manifests_grant_exactly_what_the_supervisor_needs(
        built: dict[str, list[dict[str, Any]]]) -> None:
    assert granted(built["base"]) == needed()


def test_one_verb_too_many_is_caught(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = copy.deepcopy(built["base"])
    [scale] = [r for r in one(docs, "Role", "elastic-supervisor")["rules"]
               if r.get("resourceNames") == [SCALE]]
    scale["verbs"].append("update")
    assert granted(docs) - needed() == {("", "configmaps", "update", JOB, SCALE)}


def for_namespace(manifests: Path, ns: str, dest: Path,
                  target: str = "base") -> list[dict[str, Any]]:
    """`target` (the base or an overlay) built for a job in namespace `ns`, changed the
    documented way (the name in base/namespace.yaml, nothing else)."""
    tree = dest / f"manifests-{ns}"
    shutil.copytree(manifests, tree)
    path = tree / "base" / "namespace.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = ns
    path.write_text(yaml.safe_dump(doc))
    return build(tree / target)


RBAC_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
              "ClusterRoleBinding")


@dataclass
class Applied:
    """The manifests' RBAC applied for real for a job in namespace `ns`."""

    kubeconfig: Path  # a token of the job's ServiceAccount
    ns: str
    docs: list[dict[str, Any]]  # everything the base builds for `ns`
    listing: str  # what was applied (to delete)

    @property
    def token(self) -> tuple[Path, str]:
        return self.kubeconfig, self.ns


def apply_rbac(cp: ControlPlane, core: client.CoreV1Api, manifests: Path, tmp: Path,
               doctor: Callable[[list[dict[str, Any]]], None] | None = None, *,
               target: str = "base") -> Applied:
    """Build `target` (the base by default) for a fresh namespace, apply its Namespace and RBAC
    objects for real (after `doctor` changed the documents, if given) and return a token of
    its ServiceAccount."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    docs = for_namespace(manifests, ns, tmp, target)
    if doctor is not None:
        doctor(docs)
    listing = json.dumps({"apiVersion": "v1", "kind": "List",
                          "items": [d for d in docs if d["kind"] in RBAC_KINDS]})
    kubectl("apply", "-f", "-", kubeconfig=cp.kubeconfig, stdin=listing)
    wait_for(lambda: any(sa.metadata.name == "default"
                         for sa in core.list_namespaced_service_account(ns).items), 30,
             what=f"ServiceAccount {ns}/default")  # the test's worker pods use it
    token = core.create_namespaced_service_account_token(
        "elastic-supervisor", ns, {"spec": {"audiences": [], "expirationSeconds": 600}})
    path = cp.write_token_kubeconfig(tmp / f"{ns}.kubeconfig", token.status.token, ns)
    return Applied(path, ns, docs, listing)


@pytest.fixture(scope="module")
def supervisor_token(control_plane: ControlPlane, api_client: client.ApiClient,
                     manifests: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The manifests' RBAC applied for real for a job in a fresh namespace; yields a
    kubeconfig with a token of its ServiceAccount, and that namespace."""
    applied = apply_rbac(control_plane, client.CoreV1Api(api_client), manifests,
                         tmp_path_factory.mktemp("rbac"))
    yield applied.token
    kubectl("delete", "-f", "-", "--wait=false", kubeconfig=control_plane.kubeconfig,
            stdin=applied.listing)


def refused_or_allowed(token: tuple[Path, str], permissions: list[Permission],
                       *, want: bool) -> list[Permission]:
    """Return the permissions whose SelfSubjectAccessReview, made with the token, is not `want`."""
    kubeconfig, job_ns = token
    api = config.new_client_from_config(config_file=str(kubeconfig))
    authz = client.AuthorizationV1Api(api)
    out = []
    try:
        for p in permissions:
            group, resource, verb, ns, name = p
            resource, _, sub = resource.partition("/")
            attrs = {"group": group, "resource": resource, "verb": verb, "subresource": sub,
                     "namespace": job_ns if ns == JOB else ns, "name": name}
            review = authz.create_self_subject_access_review(
                {"spec": {"resourceAttributes": {k: v for k, v in attrs.items() if v}}})
            if bool(review.status.allowed) is not want:
                out.append(p)
    finally:
        api.close()
    return out


def test_the_service_account_token_is_who_the_checks_ask_as(
        supervisor_token: tuple[Path, str]) -> None:
    kubeconfig, ns = supervisor_token
    who = kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    username = json.loads(who.stdout)["status"]["userInfo"]["username"]
    assert username == f"system:serviceaccount:{ns}:elastic-supervisor"


def test_the_service_account_may_do_all_the_supervisor_needs(
        supervisor_token: tuple[Path, str]) -> None:
    assert refused_or_allowed(supervisor_token, sorted(needed(), key=str), want=True) == []


def test_the_service_account_may_do_nothing_else(supervisor_token: tuple[Path, str]) -> None:
    assert not set(DENIED) & needed()
    assert refused_or_allowed(supervisor_token, DENIED, want=False) == []


def test_the_kind_cluster_has_three_workers_on_the_tested_kubernetes_minor() -> None:
    cluster = yaml.safe_load((ROOT / "manifests" / "kind" / "cluster.yaml").read_text())
    assert [n["role"] for n in cluster["nodes"]] == ["control-plane", "worker", "worker", "worker"]
    minor = ".".join(read_versions()["KUBE_VERSION"].split(".")[:2])  # e.g. v1.34
    assert {n["image"].split(":")[1].rsplit(".", 1)[0] for n in cluster["nodes"]} == {minor}


def replacement_run(cp: ControlPlane, api: client.ApiClient, manifests: Path, tmp: Path,
                    doctor: Callable[[list[dict[str, Any]]], None] | None = None,
                    ) -> tuple[SupervisorProcess, Job]:
    """A supervisor of job elastic-train (the name the RBAC's resourceNames are for) with a
    token of the manifests' ServiceAccount, owning 2 workers."""
    applied = apply_rbac(cp, client.CoreV1Api(api), manifests, tmp, doctor)
    job = Job(api, applied.ns, name="elastic-train")
    job.node("n1")
    sup = SupervisorProcess(cp, applied.ns, tmp, KUBECONFIG=str(applied.kubeconfig),
                            SUPERVISOR_JOB_NAME="elastic-train",
                            SUPERVISOR_WORKER_TEMPLATE=str(job.template(tmp / "worker.json")))
    return sup, job


def replace_one(sup: SupervisorProcess, job: Job) -> None:
    """Start `sup`, wait for its 2 workers to run, end worker 0 with exit 137 and wait for the
    supervisor to create its replacement."""
    sup.start()
    wait_for(lambda: len(job.live()) == 2 and all(
        job.pods()[n].get("status", {}).get("phase") == "Running" for n in job.live()),
        30, what="2 running workers")
    job.terminate("elastic-train-w0-1", 137)
    sup.wait_log("worker.created", timeout=20, pod="elastic-train-w0-2")


def test_the_manifests_rbac_is_enough_for_a_replacement(
        control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
        tmp_path: Path) -> None:
    sup, job = replacement_run(control_plane, api_client, manifests, tmp_path)
    kubelet = AutoKubelet(job)
    try:
        replace_one(sup, job)
        assert "forbidden" not in sup.output().lower()
    finally:
        sup.close()
        kubelet.close()
        job.close()


def test_one_verb_less_fails_the_run_naming_the_permission(
        control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
        tmp_path: Path) -> None:
    def doctor(docs: list[dict[str, Any]]) -> None:
        for rule in one(docs, "Role", "elastic-supervisor")["rules"]:
            if "pods" in rule["resources"]:
                rule["verbs"].remove("create")

    sup, job = replacement_run(control_plane, api_client, manifests, tmp_path, doctor)
    try:
        assert sup.start().wait_exit(30) == ExitCode.KUBE_FATAL
        # Found at start by the template's dry-run create, before horovodrun or any worker.
        fatal = sup.wait_log("kube.fatal")
        assert 'cannot create resource "pods"' in fatal["reason"], fatal
        assert sup.records("start") == []
    finally:
        sup.close()
        job.close()


# ---- least privilege that survives real use ---------------------------------------------------

def test_writes_are_limited_to_the_jobs_own_configmap_lease_and_job(
        supervisor_token: tuple[Path, str]) -> None:
    mine = [("", "configmaps", "update", JOB, STATE),
            ("coordination.k8s.io", "leases", "update", JOB, LEADER),
            ("batch", "jobs/finalizers", "update", JOB, "elastic-train")]
    others = [("", "configmaps", "update", JOB, "elastic-supervisor-policy"),
              ("", "configmaps", "update", JOB, None),
              ("coordination.k8s.io", "leases", "update", JOB, "other-supervisor-leader"),
              ("batch", "jobs/finalizers", "update", JOB, "other")]
    assert refused_or_allowed(supervisor_token, mine, want=True) == []
    assert refused_or_allowed(supervisor_token, others, want=False) == []


def cluster_wide(docs: list[dict[str, Any]], ns: str) -> set[tuple[str, str | None, str]]:
    """(kind, namespace, name) of the objects outside the job's namespace."""
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs
            if d["metadata"].get("namespace") != ns and d["kind"] != "Namespace"}


def test_two_jobs_in_two_namespaces_do_not_break_each_other(
        control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
        tmp_path: Path) -> None:
    core = client.CoreV1Api(api_client)
    a = apply_rbac(control_plane, core, manifests, tmp_path)
    b = apply_rbac(control_plane, core, manifests, tmp_path)
    try:
        for applied in (a, b):
            namespaced = [d for d in applied.docs if d["kind"] in RBAC_KINDS
                          and d["kind"] not in ("Namespace", "ClusterRole",
                                                "ClusterRoleBinding")]
            assert {d["metadata"]["namespace"] for d in namespaced} == {
                applied.ns, "kube-node-lease"}
        shared = cluster_wide(a.docs, a.ns) & cluster_wide(b.docs, b.ns)
        assert {kind for kind, _, _ in shared} == {"PriorityClass"}, sorted(shared)
        for applied in (a, b):
            assert refused_or_allowed(applied.token, sorted(needed(), key=str), want=True) == []
        # Job a goes away with everything its manifests applied: job b keeps its permissions.
        kubectl("delete", "-f", "-", "--wait=false", kubeconfig=control_plane.kubeconfig,
                stdin=a.listing)
        assert refused_or_allowed(b.token, sorted(needed(), key=str), want=True) == []
    finally:
        kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found",
                kubeconfig=control_plane.kubeconfig, stdin=b.listing)


def pods_selected(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    want = policy["spec"]["podSelector"].get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in want.items())


def ingress_ports(policy: dict[str, Any], labels: dict[str, str], *,
                  same_namespace: bool = True,
                  namespace_labels: dict[str, str] | None = None) -> set[Any]:
    """Ports `policy` lets in from a pod with `labels` (in the policy's namespace, or another
    one with `namespace_labels`); {"all"} when every port is open to it."""
    def selects(selector: dict[str, Any] | None, have: dict[str, str]) -> bool:
        return all(have.get(k) == v for k, v in ((selector or {}).get("matchLabels") or {})
                   .items()) and not (selector or {}).get("matchExpressions")

    def peer_matches(src: dict[str, Any]) -> bool:
        # Only an empty namespaceSelector ({}: every namespace) selects a namespace whose
        # labels no selector names; without one, a peer is in the policy's own namespace.
        ns_ok = (selects(src["namespaceSelector"], namespace_labels or {})
                 if "namespaceSelector" in src else same_namespace)
        return ns_ok and ("podSelector" not in src or selects(src["podSelector"], labels))

    out: set[Any] = set()
    for rule in policy["spec"].get("ingress") or ():
        sources = rule.get("from")
        if sources is not None and not any(peer_matches(src) for src in sources):
            continue
        if not rule.get("ports"):
            return {"all"}
        out |= {p["port"] for p in rule["ports"]}
    return out


def test_network_policies_let_only_the_job_reach_its_ports(
        built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["base"]
    policies = find(docs, "NetworkPolicy")
    job_pod = one(docs, "Job")["spec"]["template"]
    launcher_labels = job_pod["metadata"]["labels"]
    template = config_file(docs, "worker-template.yaml")
    worker_labels = template["metadata"]["labels"]
    env = resolved_env(launcher(docs))
    metrics, fence = int(env["SUPERVISOR_METRICS_PORT"]), int(env["SUPERVISOR_FENCE_PORT"])
    ssh = next(p["containerPort"] for p in template["spec"]["containers"][0]["ports"]
               if p["name"] == "ssh")
    assert ssh == int(env["SUPERVISOR_SSH_PORT"])
    [for_launcher] = [p for p in policies if pods_selected(p, launcher_labels)]
    [for_workers] = [p for p in policies if pods_selected(p, worker_labels)]
    assert not pods_selected(for_launcher, worker_labels)
    assert not pods_selected(for_workers, launcher_labels)
    for p in (for_launcher, for_workers):
        assert p["spec"]["policyTypes"] == ["Ingress"]
    stranger = {"app": "something-else"}
    # Workers: the launcher (ssh, then horovodrun's task services) and each other (Gloo) only.
    assert ingress_ports(for_workers, launcher_labels) == {"all"}
    assert ingress_ports(for_workers, worker_labels) == {"all"}
    assert ingress_ports(for_workers, stranger) == set()
    assert ingress_ports(for_workers, worker_labels, same_namespace=False) == set()
    # Launcher: the workers (fence, horovodrun's driver service), metrics from the namespaces
    # labelled for scraping only.
    assert ingress_ports(for_launcher, worker_labels) == {"all"}
    assert ingress_ports(for_launcher, worker_labels, same_namespace=False) == set()
    assert ingress_ports(for_launcher, stranger) == set()
    monitoring = ingress_ports(for_launcher, {"app": "prometheus"}, same_namespace=False,
                               namespace_labels={"elastic-supervisor/scrapes-metrics": "true"})
    assert monitoring == {metrics} and fence not in monitoring


def test_a_drain_cannot_evict_the_launcher(
        control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
        tmp_path: Path) -> None:
    core = client.CoreV1Api(api_client)
    applied = apply_rbac(control_plane, core, manifests, tmp_path)
    ns = applied.ns
    pdb = one(applied.docs, "PodDisruptionBudget")
    job_pod = one(applied.docs, "Job")["spec"]["template"]
    try:
        kubectl("apply", "-f", "-", kubeconfig=control_plane.kubeconfig, stdin=json.dumps(pdb))
        core.create_namespaced_pod(ns, {
            "metadata": {"name": "elastic-train-x7k2p", "labels": job_pod["metadata"]["labels"]},
            "spec": {"nodeName": "nowhere", "containers": [{"name": "launcher",
                                                            "image": "launcher:local"}]}})
        core.patch_namespaced_pod_status("elastic-train-x7k2p", ns, {
            "status": pod_status_running("10.9.9.9", container="launcher")})
        policy = client.PolicyV1Api(api_client)

        def counted() -> bool:
            s = policy.read_namespaced_pod_disruption_budget(pdb["metadata"]["name"], ns).status
            return bool(s and s.current_healthy == 1 and s.disruptions_allowed == 0)

        wait_for(counted, 30, what="the disruption controller counting the launcher")
        with pytest.raises(client.ApiException) as refused:
            core.create_namespaced_pod_eviction("elastic-train-x7k2p", ns, {
                "metadata": {"name": "elastic-train-x7k2p", "namespace": ns}})
        assert refused.value.status == 429
        assert "disruption budget" in refused.value.body
    finally:
        kubectl("delete", "-f", "-", "--wait=false", kubeconfig=control_plane.kubeconfig,
                stdin=applied.listing)


# ---- admission: what the supervisor may do to pods, and Pod Security ---------------------------

ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
TEMPLATE_CM = "elastic-supervisor-worker-template"
POD_SECURITY = "pod-security.kubernetes.io/"
WORKER_IMAGE = "elastic-supervisor-worker:0.1.0"  # base/files/worker-template.yaml's
Pod = dict[str, Any]


def template_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(one(docs, "ConfigMap", TEMPLATE_CM)["data"]["worker-template.yaml"]))


def worker_from(docs: list[dict[str, Any]], slot: int = 0,
                owner: dict[str, str] | None = None) -> Pod:
    """A worker pod as the supervisor builds it from the manifests' template; in sidecar mode
    with the hook it adds (its hook's ConfigMap, HOOK_CONFIGMAP here, mounted)."""
    template = template_of(docs)
    if resolved_env(launcher(docs)).get("SUPERVISOR_MODE") == "sidecar":
        job_pod = one(docs, "Job")["spec"]["template"]
        problems, found = pod_problems(dict(job_pod, metadata={"name": "launcher"}), SHARED_DIR)
        assert found is not None, problems
        files = hook_files()
        template = with_hook(template, HOOK_CONFIGMAP, [*files, *hook_bytecode(files)],
                             SHARED_DIR)
    pod = worker_pod(template, job="elastic-train", slot=slot, incarnation=1, owner=owner)
    assert resolved_env(launcher(docs))["SUPERVISOR_SSH_HOST_KEYS"] == "worker"
    return hostkeys.with_host_key(pod, hostkeys.from_seed(bytes(32), "w", 1).public)


HOOK_CONFIGMAP = "elastic-train-supervisor-hook-x7k2p"


def hook_files() -> dict[str, str]:
    return {path: src.read_text() for path, src in hook_sources().items()}


def without_pod_security(docs: list[dict[str, Any]]) -> None:
    """Drop the namespace's Pod Security labels, so that the admission policies are seen on
    their own (PodSecurity runs first and refuses a privileged pod, a hostPort... itself)."""
    meta = one(docs, "Namespace")["metadata"]
    meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items()
                      if not k.startswith(POD_SECURITY)}


def policy_message(e: client.ApiException) -> str | None:
    """The message of an admission policy's refusal, None for any other error."""
    body = str(e.body)
    return body if e.status == 422 and "ValidatingAdmissionPolicy" in body else None


@dataclass
class Guarded:
    """A job's namespace with the manifests' RBAC, admission policies and worker template
    applied for real, without its Pod Security labels; `api` holds a token of the
    supervisor's ServiceAccount."""

    applied: Applied
    api: client.ApiClient
    listing: str  # the policies, their bindings and the template ConfigMap (to delete)

    @property
    def ns(self) -> str:
        return self.applied.ns

    @property
    def sup(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def refusal(self, pod: Pod) -> str | None:
        """The policy's refusal of the supervisor's (dry-run) create of `pod`; None when it
        is admitted. Any other error fails the test."""
        try:
            self.sup.create_namespaced_pod(self.ns, pod, dry_run="All")
        except client.ApiException as e:
            if policy_message(e) is None:
                pytest.fail(f"create pod {pod['metadata']['name']}: {e.status} {e.body}")
            return policy_message(e)
        return None

    def close(self, cp: ControlPlane) -> None:
        self.api.close()
        for listing in (self.listing, self.applied.listing):
            kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found",
                    kubeconfig=cp.kubeconfig, stdin=listing)


def guard(cp: ControlPlane, api_client: client.ApiClient, manifests: Path, tmp: Path, *,
          target: str = "base",
          doctor: Callable[[list[dict[str, Any]]], None] | None = None) -> Guarded:
    """Apply `target`'s RBAC and admission policies (changed by `doctor`) in a fresh namespace
    without Pod Security labels, with a pod of somebody else's ("stranger"); return once both
    policies are enforced."""
    def doctor_all(docs: list[dict[str, Any]]) -> None:
        without_pod_security(docs)
        if doctor is not None:
            doctor(docs)

    applied = apply_rbac(cp, client.CoreV1Api(api_client), manifests, tmp, doctor_all,
                         target=target)
    objects = [d for d in applied.docs if d["kind"] in ADMISSION_KINDS]
    assert objects, f"no {' or '.join(ADMISSION_KINDS)} in {target}"
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl("apply", "-f", "-", kubeconfig=cp.kubeconfig, stdin=listing)
    guarded = Guarded(applied, config.new_client_from_config(config_file=str(applied.kubeconfig)),
                      listing)
    stranger = {"metadata": {"name": "stranger"},
                "spec": {"containers": [{"name": "c", "image": WORKER_IMAGE}]}}
    client.CoreV1Api(api_client).create_namespaced_pod(applied.ns, stranger)

    def delete_refused() -> bool:
        try:
            guarded.sup.delete_namespaced_pod("stranger", applied.ns, dry_run="All")
        except client.ApiException as e:
            return policy_message(e) is not None
        return False

    # A policy takes a moment to be compiled and bound.
    wait_for(lambda: guarded.refusal(dict(stranger, metadata={"name": "not-a-worker"})), 30,
             what="the creates' policy enforced")
    wait_for(delete_refused, 30, what="the changes' policy enforced")
    return guarded


@pytest.fixture(scope="module")
def guarded(control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
            job_namespace: str,  # the PriorityClasses the workers name
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """The base's admission, and in it a worker the supervisor created (slot 0) and the
    launcher's pod, created by an administrator, beside guard()'s stranger."""
    g = guard(control_plane, api_client, manifests, tmp_path_factory.mktemp("guarded"))
    core = client.CoreV1Api(api_client)
    try:
        client.CoreV1Api(g.api).create_namespaced_pod(g.ns, worker_from(g.applied.docs))
        job_pod = one(g.applied.docs, "Job")["spec"]["template"]
        core.create_namespaced_pod(g.ns, {"metadata": {"name": "elastic-train-x7k2p",
                                                       "labels": job_pod["metadata"]["labels"]},
                                          "spec": job_pod["spec"]})
        yield g
    finally:
        g.close(control_plane)


@pytest.fixture
def make_guarded(control_plane: ControlPlane, api_client: client.ApiClient, manifests: Path,
                 job_namespace: str, tmp_path: Path) -> Iterator[Callable[..., Guarded]]:
    """guard() for one test: its namespaces and policies are deleted after it."""
    made: list[Guarded] = []

    def make(**kw: Any) -> Guarded:
        made.append(guard(control_plane, api_client, manifests, tmp_path, **kw))
        return made[-1]

    yield make
    for g in made:
        g.close(control_plane)


def _set(*path: str, value: Any) -> Callable[[Pod], None]:
    """Set the field at `path` (from the pod; "0" is the first container) to `value`."""
    def change(p: Pod) -> None:
        at: Any = p
        for key in path[:-1]:
            at = at[int(key)] if key.isdigit() else at.setdefault(key, {})
        at[path[-1]] = value
    return change


def _append(*path: str, value: Any) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        at: Any = p
        for key in path[:-1]:
            at = at[int(key)] if key.isdigit() else at[key]
        at.setdefault(path[-1], []).append(value)
    return change


C0 = ("spec", "containers", "0")
OTHER_SECRET = "someone-elses"
SECRETS = ("a worker reads no Secret but the job's (elastic-supervisor-ssh) through a volume, "
           "a projected volume, env or envFrom, and its own host key's "
           "(elastic-train-w1-1-ssh- and 10 hex digits of the key) through a volume")
ROOT_ONLY = ("a worker runs as root (runAsUser: 0) only when its template sets runAsUser: 0, "
             "which it does not")
UNCONFINED = "a worker runs under a seccomp profile (RuntimeDefault or Localhost), not Unconfined"

# (id, change to the supervisor's worker, what the refusal says)
CREATES_REFUSED: list[tuple[str, Callable[[Pod], None], str]] = [
    # issue 27, item 10
    ("a privileged container", _set(*C0, "securityContext", value={"privileged": True}),
     "a worker runs no privileged container"),
    ("a hostPath volume", _append("spec", "volumes", value={"name": "root",
                                                            "hostPath": {"path": "/"}}),
     "a worker mounts no hostPath volume"),
    ("another ServiceAccount", _set("spec", "serviceAccountName", value="default"),
     "a worker runs as the ServiceAccount elastic-supervisor-worker"),
    ("a pod without the job's labels", _set("metadata", "labels", value={"app": "miner"}),
     "the supervisor creates only its job's workers"),
    ("the host's network", _set("spec", "hostNetwork", value=True),
     "a worker shares no host namespace"),
    # issue 39, item 9
    ("an added capability", _set(*C0, "securityContext", "capabilities", "add",
                                 value=["NET_ADMIN"]),
     "a worker adds no Linux capability (securityContext.capabilities.add); container worker "
     "adds NET_ADMIN"),
    ("root for the pod", _set("spec", "securityContext", "runAsUser", value=0), ROOT_ONLY),
    ("root for a container", _set(*C0, "securityContext", "runAsUser", value=0), ROOT_ONLY),
    ("an Unconfined seccomp profile for the pod",
     _set("spec", "securityContext", "seccompProfile", value={"type": "Unconfined"}),
     UNCONFINED),
    ("an Unconfined seccomp profile for a container",
     _set(*C0, "securityContext", "seccompProfile", value={"type": "Unconfined"}), UNCONFINED),
    ("an image the template does not name", _set(*C0, "image", value="miner:1"),
     f"a worker runs only its template's images ({WORKER_IMAGE}); not miner:1 "
     "(container worker)"),
    ("an init container of another image",
     _append("spec", "initContainers", value={"name": "elastic-supervisor-hook",
                                              "image": "miner:1"}),
     f"a worker runs only its template's images ({WORKER_IMAGE}); not miner:1 "
     "(container elastic-supervisor-hook)"),
    ("a hostPort", _set(*C0, "ports", "0", "hostPort", value=2222), "a worker binds no hostPort"),
    ("another Secret as a volume",
     _append("spec", "volumes", value={"name": "s", "secret": {"secretName": OTHER_SECRET}}),
     SECRETS),
    ("another worker's host key", _append("spec", "volumes", value={
        "name": "s", "secret": {"secretName": "elastic-train-w0-1-ssh-0123456789"}}), SECRETS),
    ("its own name's host key, not a key's", _append("spec", "volumes", value={
        "name": "s", "secret": {"secretName": "elastic-train-w1-1-ssh-0123456789x"}}), SECRETS),
    ("its own host key through env", _append(*C0, "env", value={"name": "K", "valueFrom": {
        "secretKeyRef": {"name": "elastic-train-w1-1-ssh-0123456789", "key": "host-key"}}}),
     SECRETS),
    ("another Secret in a projected volume",
     _append("spec", "volumes", value={"name": "s", "projected": {"sources": [
         {"configMap": {"name": TEMPLATE_CM}}, {"secret": {"name": OTHER_SECRET}}]}}),
     SECRETS),
    ("another Secret in env", _append(*C0, "env", value={"name": "TOKEN", "valueFrom": {
        "secretKeyRef": {"name": OTHER_SECRET, "key": "token"}}}), SECRETS),
    ("another Secret through envFrom",
     _append(*C0, "envFrom", value={"secretRef": {"name": OTHER_SECRET}}), SECRETS),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in CREATES_REFUSED],
                         ids=[c[0] for c in CREATES_REFUSED])
def test_the_supervisor_creates_only_the_jobs_workers_as_the_template_makes_them(
        guarded: Guarded, core: client.CoreV1Api, change: Callable[[Pod], None],
        message: str) -> None:
    """The supervisor's RBAC allows any pod in the namespace; the policy admits its creates
    only for the job's workers. Server-side dry runs: admission runs, nothing is created."""
    pod = worker_from(guarded.applied.docs, slot=1)  # slot 0 is there already
    change(pod)
    refused = guarded.refusal(pod)
    assert refused is not None and message in refused, refused
    # It binds only the supervisor: an administrator's pod is not looked at.
    core.create_namespaced_pod(guarded.ns, pod, dry_run="All")


def policy_variable(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    """The creates' policy's variable `name` ({name, expression}; the expressions of those
    written from the template are literals YAML reads: a list of strings, a bool)."""
    (policy,) = [d for d in find(docs, "ValidatingAdmissionPolicy")
                 if (d["metadata"].get("labels") or {}).get("elastic-supervisor/admission")
                 == "creates"]
    variables: list[dict[str, str]] = policy["spec"]["variables"]
    (variable,) = [v for v in variables if v["name"] == name]
    return variable  # itself: set_policy_variable changes it


def set_policy_variable(docs: list[dict[str, Any]], name: str, value: Any) -> None:
    policy_variable(docs, name)["expression"] = json.dumps(value)


def template_images(template: dict[str, Any]) -> list[str]:
    spec = template["spec"]
    return [c["image"] for c in [*spec.get("initContainers", ()), *spec["containers"]]]


def runs_as_root(template: dict[str, Any]) -> bool:
    spec = template["spec"]
    return any((s.get("securityContext") or {}).get("runAsUser") == 0
               for s in [spec, *spec.get("initContainers", ()), *spec["containers"]])


def policy_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Where the creates' policy does not know the worker template of `docs`, one line each."""
    template = template_of(docs)
    known = {v: yaml.safe_load(policy_variable(docs, v)["expression"])
             for v in ("workerImages", "templateRunsAsRoot")}
    problems = []
    if sorted(set(template_images(template))) != sorted(known["workerImages"]):
        problems.append(f"workerImages {known['workerImages']}: the template runs "
                        f"{sorted(set(template_images(template)))}")
    if runs_as_root(template) is not known["templateRunsAsRoot"]:
        problems.append(f"templateRunsAsRoot {known['templateRunsAsRoot']}: the template "
                        f"{'sets' if runs_as_root(template) else 'does not set'} runAsUser: 0")
    return problems


@pytest.mark.parametrize("target", TARGETS)
def test_the_admission_policy_knows_the_worker_template(
        built: dict[str, list[dict[str, Any]]], target: str) -> None:
    assert policy_problems(built[target]) == []


def test_a_template_the_policy_does_not_know_is_caught(
        built: dict[str, list[dict[str, Any]]]) -> None:
    docs = copy.deepcopy(built["base"])
    template = template_of(docs)
    template["spec"]["containers"][0]["image"] = "mine:2"
    template["spec"]["securityContext"]["runAsUser"] = 0
    one(docs, "ConfigMap", TEMPLATE_CM)["data"]["worker-template.yaml"] = yaml.safe_dump(template)
    assert policy_problems(docs) == [
        f"workerImages ['{WORKER_IMAGE}']: the template runs ['mine:2']",
        "templateRunsAsRoot False: the template sets runAsUser: 0"]


def test_a_worker_runs_as_root_only_when_the_policy_says_its_template_does(
        make_guarded: Callable[..., Guarded], guarded: Guarded) -> None:
    def root_template(docs: list[dict[str, Any]]) -> None:
        template = template_of(docs)
        del template["spec"]["securityContext"]["runAsNonRoot"]
        template["spec"]["securityContext"]["runAsUser"] = 0
        one(docs, "ConfigMap", TEMPLATE_CM)["data"]["worker-template.yaml"] = yaml.safe_dump(
            template)
        set_policy_variable(docs, "templateRunsAsRoot", True)

    root = make_guarded(doctor=root_template)
    assert policy_problems(root.applied.docs) == []
    pod = worker_from(root.applied.docs, slot=1)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0
    assert root.refusal(pod) is None
    assert ROOT_ONLY in str(guarded.refusal(pod))


def test_the_sidecar_overlay_admits_the_hook_the_supervisor_adds_and_nothing_more(
        make_guarded: Callable[..., Guarded]) -> None:
    """The hook reaches a sidecar-mode worker as the supervisor's ConfigMap volume: its
    ServiceAccount may create that ConfigMap (a generated name, immutable, owned by the Job,
    sources and bytecode), and the worker that mounts it runs the template's image alone, no
    init container, and is admitted; an init container of the sidecar image is not."""
    sidecar = make_guarded(target="overlays/sidecar")
    files = hook_files()
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic-train",
             "uid": "0b3c1a52-2d2f-4bc4-8f0e-4a1d1c7e9a01"}
    made = sidecar.sup.create_namespaced_config_map(
        sidecar.ns, hook_configmap("elastic-train", files, owner, hook_bytecode(files)),
        dry_run="All")
    assert made.metadata.name.startswith("elastic-train-supervisor-hook-") and made.immutable
    pod = worker_from(sidecar.applied.docs, slot=1)
    assert not pod["spec"].get("initContainers")
    assert sidecar.refusal(pod) is None  # guard() waited for it: here for the reader
    pod["spec"]["initContainers"] = [{"name": "other",
                                      "image": "elastic-supervisor-sidecar:0.1.0"}]
    assert "; not elastic-supervisor-sidecar:0.1.0 (container other)" in str(
        sidecar.refusal(pod))


WORKER = "elastic-train-w0-1"
LAUNCHER_POD = "elastic-train-x7k2p"
ONLY_WORKERS = ("only its job's workers (labels elastic-supervisor/job=elastic-train and "
                "elastic-supervisor/slot)")
NO_SPEC = "the supervisor changes no worker's spec (image, command, resources, anything)"
KEEPS_LABELS = ("the supervisor keeps a worker's labels elastic-supervisor/job and "
                "elastic-supervisor/slot as they are")


def _patch(name: str, body: dict[str, Any]) -> Callable[[client.CoreV1Api, str], Any]:
    return lambda api, ns: api.patch_namespaced_pod(name, ns, body, dry_run="All")


def _delete(name: str) -> Callable[[client.CoreV1Api, str], Any]:
    return lambda api, ns: api.delete_namespaced_pod(name, ns, dry_run="All")


# (id, a write to the pods of the `guarded` namespace, what the refusal says)
CHANGES_REFUSED: list[tuple[str, Callable[[client.CoreV1Api, str], Any], str]] = [
    ("patch a worker's image", _patch(WORKER, {"spec": {"containers": [
        {"name": "worker", "image": "miner:1"}]}}), NO_SPEC),
    ("patch a worker's activeDeadlineSeconds",
     _patch(WORKER, {"spec": {"activeDeadlineSeconds": 1}}), NO_SPEC),
    ("take a worker's slot label away",
     _patch(WORKER, {"metadata": {"labels": {LABEL_SLOT: None}}}), KEEPS_LABELS),
    ("move a worker to another job",
     _patch(WORKER, {"metadata": {"labels": {"elastic-supervisor/job": "other"}}}),
     KEEPS_LABELS),
    ("give a pod that is not the job's the job's labels", _patch("stranger", {"metadata": {
        "labels": {"elastic-supervisor/job": "elastic-train", LABEL_SLOT: "7"}}}),
     "the supervisor changes " + ONLY_WORKERS + "; pod stranger is not one"),
    ("annotate the launcher's pod",
     _patch(LAUNCHER_POD, {"metadata": {"annotations": {"x": "y"}}}),
     "the supervisor changes " + ONLY_WORKERS + f"; pod {LAUNCHER_POD} is not one"),
    ("delete a pod that is not the job's", _delete("stranger"),
     "the supervisor deletes " + ONLY_WORKERS + "; pod stranger is not one"),
    ("delete the launcher's pod", _delete(LAUNCHER_POD),
     "the supervisor deletes " + ONLY_WORKERS + f"; pod {LAUNCHER_POD} is not one"),
    ("delete every pod of the namespace at once",
     lambda api, ns: api.delete_collection_namespaced_pod(ns, dry_run="All"),
     "the supervisor deletes " + ONLY_WORKERS),
]


@pytest.mark.parametrize(("write", "message"), [c[1:] for c in CHANGES_REFUSED],
                         ids=[c[0] for c in CHANGES_REFUSED])
def test_the_supervisor_changes_and_deletes_only_its_workers_and_never_their_spec(
        guarded: Guarded, core: client.CoreV1Api,
        write: Callable[[client.CoreV1Api, str], Any], message: str) -> None:
    """Patches and deletes of the supervisor's ServiceAccount (its RBAC allows them on any pod
    of the namespace), refused by the policy; an administrator's are not looked at. Dry
    runs."""
    with pytest.raises(client.ApiException) as refused:
        write(guarded.sup, guarded.ns)
    assert message in str(policy_message(refused.value)), refused.value.body
    write(core, guarded.ns)


def test_what_the_supervisor_does_to_its_workers_is_admitted(
        make_guarded: Callable[..., Guarded], api_client: client.ApiClient) -> None:
    """Every pod write the supervisor makes, by its own code (supervisor.kube.Pods) with its
    token, for real: create workers from the template, owned by the launcher Job or re-owned
    to it (a new launcher adopting them), label and annotate one (the supervisor does neither
    today: the policy leaves a worker's other metadata free), delete one by uid, and the rest
    by the cleanup's selector. This passes on the manifests before issue 39 too: it holds the
    new rules to what the supervisor needs."""
    g = make_guarded()
    job = client.BatchV1Api(api_client).create_namespaced_job(g.ns, {
        "metadata": {"name": "elastic-train"},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic-train",
             "uid": job.metadata.uid}
    pods = kube.Pods(g.api, g.ns)
    first = pods.create(worker_from(g.applied.docs, 0, owner))
    second = pods.create(worker_from(g.applied.docs, 1))
    pods.set_owners(second["metadata"]["name"], second["metadata"]["uid"],
                    [owner_reference(owner)])
    g.sup.patch_namespaced_pod(first["metadata"]["name"], g.ns, {"metadata": {
        "labels": {"team": "vision"}, "annotations": {"note": "kept"}}})
    pods.delete(first["metadata"]["name"], first["metadata"]["uid"], grace_s=0)
    assert pods.delete_all(*cleanup.selectors(CleanPodPolicy.ALL, "elastic-train")) == [
        second["metadata"]["name"]]
    left = client.CoreV1Api(api_client).list_namespaced_pod(
        g.ns, label_selector=cleanup.worker_selector("elastic-train")).items
    assert [p.metadata.name for p in left if not p.metadata.deletion_timestamp] == []


def test_a_supervisor_under_the_admission_policies_replaces_a_worker_and_cleans_up(
        make_guarded: Callable[..., Guarded], control_plane: ControlPlane,
        api_client: client.ApiClient, tmp_path: Path) -> None:
    """The whole supervisor, with the manifests' token and policies: it creates its workers,
    replaces a failed one and deletes them at its exit, and none of it is refused. Its
    template is the test harness's (pods only this job's stand-in kubelet runs, image
    worker:local), which the policy is told, as the manifests tell it theirs."""
    g = make_guarded(doctor=lambda docs: set_policy_variable(docs, "workerImages",
                                                              ["worker:local"]))
    job = Job(api_client, g.ns, name="elastic-train")
    job.node("n1")
    path = job.template(tmp_path / "worker.json")
    template = json.loads(path.read_text())
    template["spec"]["serviceAccountName"] = "elastic-supervisor-worker"
    path.write_text(json.dumps(template))
    assert g.refusal(worker_pod(template, job="elastic-train", slot=9, incarnation=1,
                                owner=None)) is None
    sup = SupervisorProcess(control_plane, g.ns, tmp_path, KUBECONFIG=str(g.applied.kubeconfig),
                            SUPERVISOR_JOB_NAME="elastic-train",
                            SUPERVISOR_WORKER_TEMPLATE=str(path))
    kubelet = AutoKubelet(job)
    try:
        replace_one(sup, job)
        sup.close()  # SIGTERM: the exit deletes the workers still running
        done = sup.wait_log("cleanup.done", timeout=5)
        assert done["deleted"] == ["elastic-train-w0-2", "elastic-train-w1-1"], done
        assert "ValidatingAdmissionPolicy" not in sup.output()
        assert "forbidden" not in sup.output().lower()
    finally:
        sup.close()
        kubelet.close()
        job.close()


def create_dry_run(cp: ControlPlane, ns: str, pod: Pod) -> subprocess.CompletedProcess[str]:
    """An administrator's server-side dry-run create of `pod` (kubectl prints Pod Security's
    warnings)."""
    return kubectl("create", "--dry-run=server", "-n", ns, "-f", "-", check=False,
                   kubeconfig=cp.kubeconfig, stdin=json.dumps(pod))


def test_the_jobs_namespace_enforces_pod_security_baseline_and_its_pods_meet_restricted(
        control_plane: ControlPlane, built: dict[str, list[dict[str, Any]]],
        job_namespace: str) -> None:
    labels = one(built["base"], "Namespace")["metadata"].get("labels") or {}
    assert {k: v for k, v in labels.items() if k.startswith(POD_SECURITY)} == {
        f"{POD_SECURITY}enforce": "baseline", f"{POD_SECURITY}warn": "restricted",
        f"{POD_SECURITY}audit": "restricted"}
    # Anybody's pod, not only the supervisor's.
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"},
                  "spec": {"containers": [{"name": "c", "image": WORKER_IMAGE,
                                           "securityContext": {"privileged": True}}]}}
    refused = wait_for(lambda: "violates PodSecurity" in (
        r := create_dry_run(control_plane, job_namespace, privileged)).stderr and r, 30,
        what="Pod Security enforced in the job's namespace")
    assert refused.returncode != 0
    assert 'violates PodSecurity "baseline:latest": privileged' in refused.stderr
    for target in TARGETS:
        job_pod = one(built[target], "Job")["spec"]["template"]
        launcher_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "elastic-train-x7k2p", "labels": job_pod["metadata"]["labels"]},
            "spec": job_pod["spec"]}
        for pod in (launcher_pod, worker_from(built[target])):
            done = create_dry_run(control_plane, job_namespace, pod)
            assert done.returncode == 0, (target, done.stderr)
            assert "PodSecurity" not in done.stderr, (target, done.stderr)
