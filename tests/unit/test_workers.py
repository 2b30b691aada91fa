"""Worker pods from the template: validation errors, names, labels, owner, anti-affinity."""

from __future__ import annotations

import copy

import pytest
import yaml

from supervisor.workers import (
    ANNOTATION_AHEAD_OF,
    LABEL_INCARNATION,
    LABEL_SLOT,
    TemplateError,
    kept_off,
    pod_name,
    validate_template,
    worker_pod,
)

TEMPLATE = yaml.safe_load("""
apiVersion: v1
kind: Pod
metadata:
  name: ignored
  labels: {team: ml}
spec:
  restartPolicy: Never
  containers:
    - name: worker
      image: worker:1.0
      command: [/usr/sbin/sshd, -D]
""")
SELECTOR = {"elastic-supervisor/job": "bert", "elastic-supervisor/role": "worker"}
LAUNCHER = {"apiVersion": "batch/v1", "kind": "Job", "name": "bert", "uid": "u-1"}


def test_a_replacement_pod() -> None:
    t = validate_template(TEMPLATE, SELECTOR)
    pod = worker_pod(t, job="bert", slot=2, incarnation=5, owner=LAUNCHER, avoid_node="node-b")
    assert pod["metadata"] == {
        "name": "bert-w2-5",
        "labels": {"team": "ml", "elastic-supervisor/job": "bert",
                   "elastic-supervisor/role": "worker", LABEL_SLOT: "2", LABEL_INCARNATION: "5"},
        # The launcher Job, not as controller (its controller would release the pod).
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "bert",
                             "uid": "u-1", "blockOwnerDeletion": True}],
    }
    # By the node's name (a field), not the hostname label, which differs from it on some
    # clusters.
    assert pod["spec"]["affinity"] == {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn",
                             "values": ["node-b"]}]}}]}}
    assert pod["spec"]["containers"] == TEMPLATE["spec"]["containers"]


def test_the_template_is_never_mutated_and_affinity_is_merged() -> None:
    tmpl = copy.deepcopy(TEMPLATE)
    tmpl["spec"]["affinity"] = {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["a100"]}]}}]}}
    t = validate_template(tmpl, SELECTOR)
    before = copy.deepcopy(t)
    pod = worker_pod(t, job="bert", slot=0, incarnation=1, owner=None, avoid_node="n1")
    assert t == before
    prefs = pod["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert [p["weight"] for p in prefs] == [10, 100]
    assert "ownerReferences" not in pod["metadata"]


def test_nodes_already_lost_are_excluded_in_every_required_term() -> None:
    """A replacement must not land on a node whose kubelet went silent before the node
    controller taints it (40-50 s later); the template's own required terms still hold."""
    plain = worker_pod(validate_template(TEMPLATE, SELECTOR), job="bert", slot=0,
                       incarnation=2, owner=None, lost_nodes=["n3", "n2"])
    away = [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]},
            {"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}]  # one value each
    assert plain["spec"]["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": away}]}}
    tmpl = copy.deepcopy(TEMPLATE)
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    pool = {"key": "pool", "operator": "In", "values": ["cpu"]}
    tmpl["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [zone]}, {"matchExpressions": [pool]}]}}}
    t = validate_template(tmpl, SELECTOR)
    before = copy.deepcopy(t)
    pod = worker_pod(t, job="bert", slot=0, incarnation=2, owner=None, lost_nodes=["n3", "n2"])
    assert t == before
    assert pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [zone], "matchFields": away},
        {"matchExpressions": [pool], "matchFields": away}]
    unchanged = worker_pod(t, job="bert", slot=0, incarnation=1, owner=None, lost_nodes=[])
    assert unchanged["spec"]["affinity"] == tmpl["spec"]["affinity"]


def test_names_are_unique_per_incarnation_and_dns_labels() -> None:
    assert pod_name("bert", 0, 1) != pod_name("bert", 0, 2)
    assert pod_name("a" * 54, 1, 12345) == "a" * 54 + "-w1-12345"
    with pytest.raises(ValueError, match="longer than 63"):
        pod_name("a" * 55, 1, 12345)  # never truncated: two jobs would share pod names


WHY_NEVER = (" (the supervisor replaces failed workers itself; a kubelet restarting one in "
             "place would give its slot a second, unplanned life)")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda t: t.update(kind="Deployment"), "template.kind: 'Deployment': expected Pod"),
    (lambda t: t.pop("spec"), "template.spec: missing: expected a pod spec"),
    (lambda t: t["spec"].update(containers=[]),
     "template.spec.containers: expected at least one container"),
    (lambda t: t["spec"]["containers"][0].pop("image"),
     "template.spec.containers[0]: expected name and image"),
    (lambda t: t["spec"].update(restartPolicy="Sometimes"),
     "template.spec.restartPolicy: 'Sometimes': expected Never" + WHY_NEVER),
    (lambda t: t["spec"].update(restartPolicy="OnFailure"),
     "template.spec.restartPolicy: 'OnFailure': expected Never" + WHY_NEVER),
    (lambda t: t["spec"].pop("restartPolicy"),
     "template.spec.restartPolicy: unset (Always, the Kubernetes default): expected Never"
     + WHY_NEVER),
    (lambda t: t["spec"].update(nodeName="n1"),
     "template.spec.nodeName: must be empty (the scheduler places workers)"),
    (lambda t: t["spec"].update(hostname="worker"),
     "template.spec.hostname: must be empty (every worker would get the same host name)"),
    (lambda t: t["metadata"]["labels"].update({LABEL_SLOT: "1"}),
     f"template.metadata.labels.{LABEL_SLOT}: set by the supervisor; remove it"),
])
def test_template_problems_are_named(mutate, message: str) -> None:
    t = copy.deepcopy(TEMPLATE)
    mutate(t)
    with pytest.raises(TemplateError) as err:
        validate_template(t, SELECTOR)
    assert err.value.problems == [message]


def test_the_template_must_match_a_custom_selector() -> None:
    with pytest.raises(TemplateError) as err:
        validate_template(TEMPLATE, {"app": "bert", "team": "ml"})
    assert err.value.problems == [
        "template.metadata.labels.app: expected 'bert' to match the worker selector"]


def test_nodes_where_a_worker_hung_are_avoided_like_the_failed_one() -> None:
    pod = worker_pod(validate_template(TEMPLATE, SELECTOR), job="bert", slot=0, incarnation=2,
                     owner=None, avoid_node="n1", suspect_nodes=["n3", "n1"])
    assert pod["spec"]["affinity"] == {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
                            {"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}]}}]}}


def test_kept_off_reads_back_the_nodes_worker_pod_excluded() -> None:
    """The rescheduling rule (plan._stale_exclusions) reads what worker_pod rendered: the lost
    nodes, from every term, and nothing of the template's own terms or preferences."""
    tmpl = copy.deepcopy(TEMPLATE)
    tmpl["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": ["n9"]}]}]}}}
    t = validate_template(tmpl, SELECTOR)
    pod = worker_pod(t, job="bert", slot=0, incarnation=2, owner=None, avoid_node="n1",
                     lost_nodes=["n3", "n2"])
    assert kept_off(pod) == {"n2", "n3"}
    # A pod an earlier version rendered (kept off by the hostname label) is read the same.
    old = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                   "values": ["n4"]}]}]}}}}}
    assert kept_off(old) == {"n4"}
    assert kept_off(worker_pod(t, job="bert", slot=0, incarnation=2, owner=None,
                               avoid_node="n1")) == frozenset()


@pytest.mark.parametrize(("grace", "env", "expected"), [
    (None, None, "25"),  # Kubernetes' default grace, 30 s, less the margin
    (60, None, "55"),
    (3, None, "0"),
    (30, [{"name": "A", "value": "1"}], "25"),
    (30, [{"name": "ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS", "value": "7"}], "7"),  # the user's
])
def test_the_training_container_gets_the_leave_hold(grace: int | None, env: list | None,
                                                     expected: str) -> None:
    t = copy.deepcopy(TEMPLATE)
    t["spec"]["containers"].append({"name": "helper", "image": "h:1"})
    if grace is not None:
        t["spec"]["terminationGracePeriodSeconds"] = grace
    if env is not None:
        t["spec"]["containers"][0]["env"] = env
    pod = worker_pod(validate_template(t, SELECTOR), job="bert", slot=0, incarnation=1,
                     owner=None, hold_in="worker")
    worker, helper = pod["spec"]["containers"]
    hold = [e["value"] for e in worker["env"]
            if e["name"] == "ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS"]
    assert hold == [expected]
    assert [e["name"] for e in worker["env"]][:len(env or [])] == [e["name"] for e in env or []]
    assert "env" not in helper
    assert "env" not in worker_pod(validate_template(TEMPLATE, SELECTOR), job="bert", slot=0,
                                   incarnation=1, owner=None)["spec"]["containers"][0]


def test_a_replacement_placed_ahead_of_a_move_names_the_worker_it_replaces() -> None:
    t = validate_template(TEMPLATE, SELECTOR)
    pod = worker_pod(t, job="bert", slot=0, incarnation=2, owner=None, ahead_of="bert-w0-1")
    assert pod["metadata"]["annotations"] == {ANNOTATION_AHEAD_OF: "bert-w0-1"}
    assert "annotations" not in worker_pod(t, job="bert", slot=0, incarnation=2,
                                           owner=None)["metadata"]
