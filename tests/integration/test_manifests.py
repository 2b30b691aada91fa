"""manifests/: built with the control plane's own kubectl (kustomize), applied to the real API
server, and held to what the supervisor knows.

- Every overlay (and the base) passes `kubectl apply --dry-run=server -k`.
- The launcher's SUPERVISOR_* variables all exist in supervisor.config and parse; the worker
  template passes validate_template, the initial workers are exactly the pods worker_pod makes
  from it, the policy passes policy_from_document.
- RBAC: the Role and ClusterRoles grant exactly what supervisor/kube.py calls (plus what the
  replacement code will), and a real token of the manifests' ServiceAccount is allowed all of
  it and refused the rest (SelfSubjectAccessReview).
Doctored inputs prove each check can fail. The manifests are copied to a temporary directory
with a fresh ssh key pair (manifests/ssh-keygen.sh), so the repository is never written.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from localcluster.controlplane import ControlPlane, Settings, read_versions
from supervisor.config import DEFAULT_SELECTOR, KNOWN, PREFIX, ConfigError, parse_config
from supervisor.model import ExitCode
from supervisor.policy import Action, PolicyError, policy_from_document
from supervisor.workers import (
    LABEL_SLOT,
    TemplateError,
    validate_template,
    worker_pod,
)
from tests.conftest import make_namespace
from tests.helpers import wait_for
from tests.integration.harness import AutoKubelet, Job, SupervisorProcess

ROOT = Path(__file__).resolve().parents[2]
KUBE_PY = ROOT / "supervisor" / "kube.py"
TARGETS = ["base", "overlays/kind", "overlays/local"]
NAMESPACE = "elastic-supervisor"  # where the manifests put the job
JOB = "<job namespace>"  # stands for the job's namespace in the permission tables below
CLUSTER = None  # cluster-scoped

Permission = tuple[str, str, str, str | None]  # (API group, resource, verb, namespace)

# Every Kubernetes API method supervisor/kube.py calls -> what it needs of the supervisor's
# ServiceAccount. None: not called by `run` (tests, and a `status` run with a user's own
# credentials). A new call fails test_every_kube_call_is_accounted_for until it is added here
# and, if `run` makes it, to manifests/base/rbac.yaml.
KUBE_CALLS: dict[str, list[Permission] | None] = {
    "list_namespaced_pod": [("", "pods", "list", JOB), ("", "pods", "watch", JOB)],
    "read_namespaced_pod": [("", "pods", "get", JOB)],
    "list_node": [("", "nodes", "list", CLUSTER), ("", "nodes", "watch", CLUSTER)],
    "create_namespaced_event": [("events.k8s.io", "events", "create", JOB)],
    "read_namespaced_config_map": [("", "configmaps", "get", JOB)],
    "list_namespaced_config_map": [("", "configmaps", "list", JOB),
                                   ("", "configmaps", "watch", JOB)],
    "create_namespaced_config_map": [("", "configmaps", "create", JOB)],
    "replace_namespaced_config_map": [("", "configmaps", "update", JOB)],
    "create_namespaced_pod": [("", "pods", "create", JOB)],
    "delete_namespaced_pod": [("", "pods", "delete", JOB)],
    "list_namespaced_lease": [("coordination.k8s.io", "leases", "list", "kube-node-lease"),
                              ("coordination.k8s.io", "leases", "watch", "kube-node-lease")],
    "list_namespaced_event": None,
}
# The API classes kube.py uses (so create_namespaced_event is known to be events.k8s.io).
KUBE_API_CLASSES = {"CoreV1Api", "EventsV1Api", "CoordinationV1Api"}
DENIED: list[Permission] = [
    # Nothing the code does not use: no patching pods, no single reads of nodes or Leases.
    ("", "pods", "patch", JOB), ("", "nodes", "get", CLUSTER),
    ("coordination.k8s.io", "leases", "get", "kube-node-lease"),
    ("", "pods", "update", JOB), ("", "pods", "deletecollection", JOB),
    ("", "pods", "list", "default"), ("", "pods/exec", "create", JOB),
    ("", "configmaps", "delete", JOB), ("", "configmaps", "list", "default"),
    ("", "secrets", "get", JOB), ("events.k8s.io", "events", "delete", JOB),
    ("", "events", "create", JOB), ("batch", "jobs", "get", JOB),
    ("", "nodes", "patch", CLUSTER), ("", "nodes", "delete", CLUSTER),
    ("coordination.k8s.io", "leases", "list", "default"),
    ("coordination.k8s.io", "leases", "update", "kube-node-lease"),
]


def needed() -> set[Permission]:
    return {p for perms in KUBE_CALLS.values() for p in perms or ()}


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
    return one(docs, "Job")["spec"]["template"]["spec"]["containers"][0]


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

    def read_text(path: Path) -> str:  # the launcher's mounted ConfigMap files
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
    for path in (cfg.ssh_identity_file, cfg.discovery_file):
        assert str(path.parent) in mounts, f"{path}: not on a mounted volume"
    assert not mounts[str(cfg.discovery_file.parent)].get("readOnly")


def test_an_unknown_variable_in_an_overlay_is_caught(manifests: Path) -> None:
    doctored = manifests / "overlays" / "doctored"
    doctored.mkdir()
    (doctored / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../../base"],
        "patches": [{"patch": yaml.safe_dump({
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
    assert images == {f"elastic-supervisor-launcher:{version[1]}",
                      f"elastic-supervisor-worker:{version[1]}"}  # what `make kind-load` builds


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
    """Return (API methods, API classes) supervisor/kube.py uses from the Kubernetes client."""
    text = KUBE_PY.read_text()
    apis = {name for name in dir(client) if name.endswith("Api")}
    methods = {m for m in re.findall(r"\.([a-z_]+)\b", text)
               if any(hasattr(getattr(client, api), m) for api in apis) and not m.startswith("_")
               and m not in ("api_client",)}
    return methods, {c for c in re.findall(r"client\.(\w+Api)\(", text)}


def test_every_kube_call_is_accounted_for() -> None:
    methods, classes = kube_calls()
    assert methods and methods <= set(KUBE_CALLS), sorted(methods - set(KUBE_CALLS))
    assert classes == KUBE_API_CLASSES


def granted(docs: list[dict[str, Any]]) -> set[Permission]:
    """Every (group, resource, verb, namespace) the manifests grant their supervisor account."""
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
        where = JOB if ns == NAMESPACE else ns
        out |= {(g, r, v, where) for rule in rules for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_the_manifests_grant_exactly_what_the_supervisor_needs(
        built: dict[str, list[dict[str, Any]]]) -> None:
    assert granted(built["base"]) == needed()


def test_one_verb_too_many_is_caught(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = copy.deepcopy(built["base"])
    one(docs, "Role", "elastic-supervisor")["rules"][1]["verbs"].append("delete")
    assert granted(docs) - needed() == {("", "configmaps", "delete", JOB)}


def apply_rbac(cp: ControlPlane, core: client.CoreV1Api, docs: list[dict[str, Any]],
               path: Path) -> tuple[Path, str, str]:
    """Apply the RBAC objects of `docs` for real into a fresh namespace; return a kubeconfig
    with a token of its ServiceAccount, that namespace, and the applied listing (to delete)."""
    ns = make_namespace(core)
    rbac = [retarget(d, ns) for d in docs
            if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                             "ClusterRoleBinding")]
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac})
    kubectl("apply", "-f", "-", kubeconfig=cp.kubeconfig, stdin=listing)
    token = core.create_namespaced_service_account_token(
        "elastic-supervisor", ns, {"spec": {"audiences": [], "expirationSeconds": 600}})
    return cp.write_token_kubeconfig(path, token.status.token, ns), ns, listing


@pytest.fixture(scope="module")
def supervisor_token(control_plane: ControlPlane, api_client: client.ApiClient,
                     built: dict[str, list[dict[str, Any]]],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The manifests' RBAC applied for real into a fresh namespace; yields a kubeconfig with a
    token of its ServiceAccount, and that namespace."""
    core = client.CoreV1Api(api_client)
    path, ns, listing = apply_rbac(control_plane, core, built["base"],
                                   tmp_path_factory.mktemp("rbac") / "supervisor.kubeconfig")
    yield path, ns
    kubectl("delete", "-f", "-", "--wait=false", kubeconfig=control_plane.kubeconfig,
            stdin=listing)
    core.delete_namespace(ns)


def retarget(doc: dict[str, Any], ns: str) -> dict[str, Any]:
    """`doc` moved from the manifests' namespace to `ns`; cluster-wide bindings renamed apart."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    if meta.get("namespace") == NAMESPACE:
        meta["namespace"] = ns
    if doc["kind"] in ("ClusterRoleBinding", "RoleBinding") and meta.get("namespace") != ns:
        meta["name"] = f"{meta['name']}-{ns}"
    for subject in doc.get("subjects", []):
        if subject.get("namespace") == NAMESPACE:
            subject["namespace"] = ns
    return doc


def refused_or_allowed(token: tuple[Path, str], permissions: list[Permission],
                       *, want: bool) -> list[Permission]:
    """Return the permissions whose SelfSubjectAccessReview, made with the token, is not `want`."""
    kubeconfig, job_ns = token
    api = config.new_client_from_config(config_file=str(kubeconfig))
    authz = client.AuthorizationV1Api(api)
    out = []
    try:
        for p in permissions:
            group, resource, verb, ns = p
            resource, _, sub = resource.partition("/")
            attrs = {"group": group, "resource": resource, "verb": verb, "subresource": sub,
                     "namespace": job_ns if ns == JOB else ns}
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


def replacement_run(cp: ControlPlane, api: client.ApiClient, docs: list[dict[str, Any]],
                    tmp: Path) -> tuple[SupervisorProcess, Job]:
    """A supervisor with a token of `docs`' ServiceAccount owning 2 workers; one is killed."""
    kubeconfig, ns, _ = apply_rbac(cp, client.CoreV1Api(api), docs, tmp / "sa.kubeconfig")
    job = Job(api, ns)
    job.node("n1")
    sup = SupervisorProcess(cp, ns, tmp, KUBECONFIG=str(kubeconfig),
                            SUPERVISOR_WORKER_TEMPLATE=str(job.template(tmp / "worker.json")))
    return sup, job


def test_the_manifests_rbac_is_enough_for_a_replacement(
        control_plane: ControlPlane, api_client: client.ApiClient,
        built: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    sup, job = replacement_run(control_plane, api_client, built["base"], tmp_path)
    kubelet = AutoKubelet(job)
    try:
        sup.start()
        wait_for(lambda: len(job.live()) == 2 and all(
            job.pods()[n].get("status", {}).get("phase") == "Running" for n in job.live()),
            30, what="2 running workers")
        job.terminate("job1-w0-1", 137)
        sup.wait_log("worker.created", timeout=20, pod="job1-w0-2")
        assert "forbidden" not in sup.output().lower()
    finally:
        sup.close()
        kubelet.close()
        job.close()


def test_one_verb_less_fails_the_run_naming_the_permission(
        control_plane: ControlPlane, api_client: client.ApiClient,
        built: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    docs = copy.deepcopy(built["base"])
    for rule in one(docs, "Role", "elastic-supervisor")["rules"]:
        if "pods" in rule["resources"]:
            rule["verbs"].remove("create")
    sup, job = replacement_run(control_plane, api_client, docs, tmp_path)
    try:
        assert sup.start().wait_exit(30) == ExitCode.KUBE_FATAL
        fatal = sup.wait_log("kube.fatal", action="create")
        assert 'cannot create resource "pods"' in fatal["reason"]
    finally:
        sup.close()
        job.close()
