"""Rendering the discovery file from real pod/node shapes, the publish decision, atomic writes."""

from __future__ import annotations

import copy
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from supervisor import discovery, observe
from supervisor.decide import hostlist
from supervisor.decide.hostlist import HostMode, Publish, Withdraw
from supervisor.observe import ClusterView, EventType, Kind, Unusable, pod_problem, slim
from tests.unit.shapes import load, node, pod, with_condition


def view_of(*objs: dict) -> ClusterView:
    v = ClusterView()
    for o in objs:
        v.apply(Kind.POD if o["kind"] == "Pod" else Kind.NODE, EventType.ADDED, o)
    return v


def deleting(p: dict) -> dict:
    d = load("pod_deleting_graceful")
    out = copy.deepcopy(p)
    out["metadata"]["deletionTimestamp"] = d["metadata"]["deletionTimestamp"]
    out["metadata"]["deletionGracePeriodSeconds"] = d["metadata"]["deletionGracePeriodSeconds"]
    return out


def tainted(n: dict, key: str, effect: str = "NoExecute") -> dict:
    out = copy.deepcopy(n)
    out.setdefault("spec", {}).setdefault("taints", []).append({"key": key, "effect": effect})
    return out


READY_NODE = node("node-a")
CASES = [
    ("a running ready pod on a ready node is usable", [pod(), READY_NODE], None),
    ("the captured graceful delete shape is left out",
     [load("pod_deleting_graceful"), node("node-a")], Unusable.DELETING),
    ("a pod with a deletionTimestamp is left out", [deleting(pod()), READY_NODE],
     Unusable.DELETING),
    ("a pending pod is left out", [pod(phase="Pending"), READY_NODE], Unusable.NOT_RUNNING),
    ("a failed pod is left out", [pod(phase="Failed"), READY_NODE], Unusable.NOT_RUNNING),
    ("a pod whose Ready condition is False is left out",
     [with_condition(pod(), "Ready", "False"), READY_NODE], Unusable.NOT_READY),
    ("a pod without conditions is left out", [pod(conditions=[]), READY_NODE],
     Unusable.NOT_READY),
    ("a running pod without an IP is left out", [pod(ip=None), READY_NODE],
     Unusable.NO_ADDRESS),
    ("a pod whose node was never observed is left out", [pod(node="elsewhere"), READY_NODE],
     Unusable.NODE_UNKNOWN),
    ("a pod on the captured unreachable node is left out",
     [pod(), node("node-a", "node_unreachable")], Unusable.NODE_NOT_READY),
    ("a pod on a node whose Ready is False is left out",
     [pod(), with_condition(READY_NODE, "Ready", "False")], Unusable.NODE_NOT_READY),
    ("a Ready node with the not-ready taint is left out",
     [pod(), tainted(READY_NODE, "node.kubernetes.io/not-ready")], Unusable.NODE_TAINTED),
    ("a Ready node with the unreachable NoSchedule taint is left out",
     [pod(), tainted(READY_NODE, "node.kubernetes.io/unreachable", "NoSchedule")],
     Unusable.NODE_TAINTED),
    ("other taints (cordon) do not matter",
     [pod(), tainted(READY_NODE, "node.kubernetes.io/unschedulable", "NoSchedule")], None),
    ("an IPv6 pod IP cannot be expressed to horovodrun", [pod(ip="fd00::1"), READY_NODE],
     Unusable.NO_ADDRESS),
]


@pytest.mark.parametrize(("objs", "problem"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_usability_rules(objs: list[dict], problem: Unusable | None) -> None:
    r = hostlist.render(view_of(*objs), 2, HostMode.POD_IP, {})
    name = objs[0]["metadata"]["name"]
    if problem is None:
        assert r.lines == (f"{objs[0]['status']['podIP']}:2",)
        assert r.left_out == {}
    else:
        assert r.lines == ()
        assert r.left_out == {name: problem}


@pytest.mark.parametrize(("down", "problem"), [
    pytest.param(with_condition(READY_NODE, "Ready", "False"), Unusable.NODE_NOT_READY,
                 id="Ready False (a kubelet's blip)"),
    pytest.param(node("node-a", "node_unreachable"), Unusable.NODE_NOT_READY,
                 id="Ready Unknown (the captured unreachable node)"),
    pytest.param(tainted(READY_NODE, "node.kubernetes.io/not-ready"), Unusable.NODE_TAINTED,
                 id="Ready again, the not-ready taint not removed yet"),
])
def test_a_host_on_a_down_node_stays_while_its_processes_heartbeat(
        down: dict, problem: Unusable) -> None:
    """Issue 27, item 12: a node's Ready blip does not take out a host whose training
    processes still heartbeat; one that does not heartbeat (or the hook off) leaves."""
    p, other = pod("w-0", "10.1.0.10"), pod("w-1", "10.1.0.11", "b")
    v = view_of(p, other, down, node("b"))
    talking = hostlist.render(v, 1, HostMode.POD_IP, {}, heartbeating=frozenset({"10.1.0.10"}))
    assert talking.lines == ("10.1.0.10:1", "10.1.0.11:1") and talking.left_out == {}
    silent = hostlist.render(v, 1, HostMode.POD_IP, {})
    assert silent.lines == ("10.1.0.11:1",) and silent.left_out == {"w-0": problem}
    elsewhere = hostlist.render(v, 1, HostMode.POD_IP, {},
                                 heartbeating=frozenset({"10.1.0.11"}))
    assert elsewhere.left_out == {"w-0": problem}
    failed = hostlist.render(v, 1, HostMode.POD_IP, {}, heartbeating=frozenset({"10.1.0.10"}),
                              declared=frozenset({p["metadata"]["uid"]}))
    assert failed.left_out == {"w-0": Unusable.FOUND_FAILED}, "past the grace: failed, out"


def test_a_pod_the_node_controller_marked_not_ready_stays_while_its_processes_heartbeat() -> None:
    """After an API outage the node controller marks the node NotReady and every pod on it
    Ready=False (seen in the stock tour): the render sees PodNotReady first. The same rule
    holds: kept while its processes heartbeat; out when they do not."""
    down = with_condition(READY_NODE, "Ready", "Unknown")
    marked = with_condition(pod("w-0", "10.1.0.10"), "Ready", "False")
    v = view_of(marked, pod("w-1", "10.1.0.11", "b"), down, node("b"))
    talking = hostlist.render(v, 1, HostMode.POD_IP, {}, heartbeating=frozenset({"10.1.0.10"}))
    assert talking.lines == ("10.1.0.10:1", "10.1.0.11:1") and talking.left_out == {}
    silent = hostlist.render(v, 1, HostMode.POD_IP, {})
    assert silent.left_out == {"w-0": Unusable.NOT_READY}
    # The node Ready again, the pod still marked (the kubelet clears it at its next update:
    # seen in the stock tour, where the other worker's kill then left the driver no host of
    # the last world): kept while it heartbeats.
    up = view_of(marked, pod("w-1", "10.1.0.11", "b"), READY_NODE, node("b"))
    assert hostlist.kept_while_heartbeating(up, HostMode.POD_IP, lambda: ["10.1.0.10"]) == {
        "10.1.0.10"}
    assert hostlist.kept_while_heartbeating(up, HostMode.POD_IP, list) == frozenset()
    # A container not ready while the pod has no readiness probe (the kubelet's status of the
    # moment after an outage: seen in the stock tour, both workers out while they trained):
    # kept while it heartbeats, out when it does not (a container that does not run).
    unprobed = copy.deepcopy(marked)
    unprobed["status"]["containerStatuses"][0]["ready"] = False
    after = view_of(unprobed, pod("w-1", "10.1.0.11", "b"), READY_NODE, node("b"))
    assert hostlist.kept_while_heartbeating(after, HostMode.POD_IP, lambda: ["10.1.0.10"]) == {
        "10.1.0.10"}
    assert hostlist.kept_while_heartbeating(after, HostMode.POD_IP, list) == frozenset()
    # A pod not Ready because its own readiness probe says so (its sshd down) on a Ready node
    # is out, heartbeats or not.
    probe = copy.deepcopy(unprobed)
    probe["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 2222}}
    sshd_down = view_of(probe, pod("w-1", "10.1.0.11", "b"), READY_NODE, node("b"))
    assert hostlist.kept_while_heartbeating(sshd_down, HostMode.POD_IP,
                                           lambda: ["10.1.0.10"]) == set()


def test_the_hosts_kept_on_down_nodes_are_those_that_heartbeat() -> None:
    down = with_condition(READY_NODE, "Ready", "False")
    v = view_of(pod("w-0", "10.1.0.10"), pod("w-1", "10.1.0.11", "b"), down, node("b"))
    talking = lambda: ["10.1.0.10", "10.1.0.11"]  # noqa: E731
    assert hostlist.kept_while_heartbeating(v, HostMode.POD_IP, talking) == {"10.1.0.10"}
    assert hostlist.kept_while_heartbeating(v, HostMode.POD_IP, list) == frozenset()
    up = view_of(pod("w-0", "10.1.0.10"), READY_NODE)

    def never() -> list[str]:
        raise AssertionError("heartbeats are read only while a node is down")

    assert hostlist.kept_while_heartbeating(up, HostMode.POD_IP, never) == frozenset()


def test_lines_are_sorted_and_carry_slots() -> None:
    v = view_of(pod("w-2", "10.1.0.9"), pod("w-0", "10.1.0.10"), pod("w-1", "10.1.0.11", "b"),
                READY_NODE, node("b"))
    r = hostlist.render(v, 4, HostMode.POD_IP, {})
    assert r.lines == ("10.1.0.10:4", "10.1.0.11:4", "10.1.0.9:4")
    assert r.content == "10.1.0.10:4\n10.1.0.11:4\n10.1.0.9:4\n"
    assert r.slots(4) == 12
    assert dict(r.hosts) == {"10.1.0.10": "w-0", "10.1.0.11": "w-1", "10.1.0.9": "w-2"}


def test_a_host_string_is_never_reused_by_a_later_pod() -> None:
    v = view_of(pod("w-3", "10.1.0.10", uid="new-uid"), READY_NODE)
    r = hostlist.render(v, 1, HostMode.POD_IP, {"10.1.0.10": "old-uid"})
    assert r.lines == ()
    assert r.left_out == {"w-3": Unusable.HOST_REUSED}
    same = hostlist.render(v, 1, HostMode.POD_IP, {"10.1.0.10": "new-uid"})
    assert same.lines == ("10.1.0.10:1",)


@pytest.mark.parametrize("mode", [HostMode.POD_IP, HostMode.POD_DNS])
def test_the_workers_addresses_kept_up_to_date_equal_those_made_anew(mode: HostMode) -> None:
    """hostlist.Addresses, which the loop keeps: only the pods the view's change log names are
    looked at again (a new IP, none yet, another hostname, gone); after every change the same
    as addresses made anew, a host two pods claim (hostname "other") among them; a log that no
    longer reaches back starts it over."""
    rng = random.Random(7)
    v = ClusterView()
    kept = hostlist.Addresses(mode)
    claimed = 0
    for step in range(600):
        for _ in range(rng.choice([1, 1, 2, 5])):
            name = f"w-{rng.randrange(12)}"
            if rng.random() < 0.25:
                v.apply(Kind.POD, EventType.DELETED, {"metadata": {"name": name}})
                continue
            p = pod(name, ip=rng.choice([None, f"10.1.0.{rng.randrange(5)}", "fd00::1"]))
            p["spec"]["subdomain"] = rng.choice([None, "workers"])
            p["spec"]["hostname"] = rng.choice([None, name, "other"])
            p["metadata"]["resourceVersion"] = str(step)
            v.apply(Kind.POD, EventType.MODIFIED, slim(Kind.POD, p))
        if step == 300:  # more changes than the log holds: Addresses starts over
            v.log.clear()
            v.version += 1
        assert kept.update(v) == hostlist.addresses(v.pods, mode), step
        assert kept.of.keys() <= v.pods.keys()
        claimed += any(len(c) > 1 for c in kept.claims.values())
    assert mode is HostMode.POD_IP or claimed, "a host claimed twice was tried"
    two = {n: slim(Kind.POD, pod(n, ip=ip)) for n, ip in (("w-1", "10.1.0.1"), ("w-2", "10.1.0.2"))}
    for p in two.values():
        p["spec"].update(subdomain="workers", hostname="other")
    assert hostlist.addresses(two, HostMode.POD_DNS) == {"other.workers.default.svc": "10.1.0.2"}


def test_dns_mode_names_pods_by_hostname_and_subdomain() -> None:
    p = pod("w-0")
    p["spec"]["subdomain"] = "job1-workers"
    plain = pod("w-1", "10.1.0.11")  # no subdomain: no resolvable name
    r = hostlist.render(view_of(p, plain, READY_NODE), 1, HostMode.POD_DNS, {})
    assert r.lines == ("w-0.job1-workers.default.svc:1",)
    assert r.left_out == {"w-1": Unusable.NO_ADDRESS}
    p["spec"]["hostname"] = "worker-zero"
    r = hostlist.render(view_of(p, READY_NODE), 1, HostMode.POD_DNS, {})
    assert r.lines == ("worker-zero.job1-workers.default.svc:1",)


def test_view_ignores_replayed_resource_versions_and_applies_deletes() -> None:
    v = ClusterView()
    p = pod()
    assert v.apply(Kind.POD, EventType.ADDED, p) is True
    assert v.apply(Kind.POD, EventType.MODIFIED, copy.deepcopy(p)) is False
    p2 = copy.deepcopy(p)
    p2["metadata"]["resourceVersion"] = "999"
    assert v.apply(Kind.POD, EventType.MODIFIED, p2) is True
    assert v.apply(Kind.POD, EventType.DELETED, p2) is True
    assert v.apply(Kind.POD, EventType.DELETED, p2) is False
    assert v.pods == {}


RENDERED = hostlist.render(view_of(pod(), READY_NODE), 1, HostMode.POD_IP, {})
EMPTY = hostlist.render(ClusterView(), 1, HostMode.POD_IP, {})


@pytest.mark.parametrize(("synced", "broken_for", "rendered", "expected"), [
    pytest.param(True, 0.0, RENDERED, Publish("10.1.0.10:1\n"), id="synced and fresh: publish"),
    pytest.param(False, 0.0, RENDERED, Withdraw("view not synced"), id="not synced: withdraw"),
    pytest.param(True, 30.0, RENDERED, Publish("10.1.0.10:1\n"),
                 id="broken within the staleness bound: still publish"),
    pytest.param(True, 60.5, RENDERED, Withdraw("watch broken for 60s (> 60s)"),
                 id="broken beyond the staleness bound: withdraw"),
    pytest.param(True, 0.0, EMPTY, Withdraw("no usable worker"),
                 id="never an empty list: withdraw instead"),
])
def test_publish_or_withdraw(synced: bool, broken_for: float, rendered, expected) -> None:
    assert hostlist.decide(synced, broken_for, 60.0, rendered) == expected


def test_view_staleness_is_the_longest_broken_source() -> None:
    v = ClusterView()
    assert v.broken_for(100.0) == 0.0
    v.health[Kind.NODE].broken_since = 90.0
    v.health[Kind.POD].broken_since = 95.0
    assert v.broken_for(100.0) == 10.0
    assert not v.synced
    for h in v.health.values():
        h.synced = True
    assert v.synced


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    f = tmp_path / "hostfile"
    discovery.write_atomic(f, "a:1\n")
    inode = f.stat().st_ino
    discovery.write_atomic(f, "a:1\nb:1\n")
    assert f.read_text() == "a:1\nb:1\n"
    assert f.stat().st_ino != inode  # a rename, not an in-place rewrite
    assert oct(f.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(tmp_path) == ["hostfile"]
    assert discovery.withdraw(f) is True
    assert discovery.withdraw(f) is False
    assert discovery.read_current(f) is None


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    f = tmp_path / "hostfile"
    small, big = "a:1\n", "".join(f"10.0.{i // 250}.{i % 250}:1\n" for i in range(2000))
    discovery.write_atomic(f, small)
    stop = threading.Event()
    seen: set[str] = set()

    def reader() -> None:
        while not stop.is_set():
            seen.add(f.read_text())

    t = threading.Thread(target=reader)
    t.start()
    for i in range(300):
        discovery.write_atomic(f, big if i % 2 else small)
    stop.set()
    t.join()
    assert seen <= {small, big}
    assert len(seen) == 2


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    f = tmp_path / "hostfile"
    discovery.write_atomic(f, "a:1\n")

    with pytest.raises(TypeError):
        discovery.write_atomic(f, 42)  # type: ignore[arg-type]
    assert f.read_text() == "a:1\n"
    assert os.listdir(tmp_path) == ["hostfile"]


def test_slim_keeps_what_decisions_read_and_drops_the_rest() -> None:
    full = load("pod_deleting_graceful")
    full["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:x": {}}}]
    full["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "{...}", "team": "ml"}
    s = slim(Kind.POD, full)
    assert "managedFields" not in s["metadata"]
    assert s["metadata"]["annotations"] == {"team": "ml"}
    for key in ("name", "uid", "resourceVersion", "labels", "deletionTimestamp",
                "deletionGracePeriodSeconds"):
        assert s["metadata"][key] == full["metadata"][key]
    # Container statuses: name, restart count, states without timestamps.
    assert s["status"]["containerStatuses"] == [
        {"name": "worker", "restartCount": 0, "state": {"running": {}}}]
    # Conditions: only the ones decisions read (Ready, DisruptionTarget, PodScheduled),
    # type/status/reason.
    read = ("Ready", "DisruptionTarget", "PodScheduled")
    assert s["status"]["conditions"] == [
        {k: c[k] for k in ("type", "status", "reason") if k in c}
        for c in full["status"]["conditions"] if c["type"] in read]
    assert sorted(c["type"] for c in s["status"]["conditions"]) == ["PodScheduled", "Ready"]
    assert s["spec"] == {"nodeName": full["spec"]["nodeName"],
                         "restartPolicy": full["spec"]["restartPolicy"],
                         "containers": [{"name": "worker"}]}
    # Of the affinity, only the required node affinity (the nodes a replacement is kept off).
    kept = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}]}
    full["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": kept,
                         "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}
    assert slim(Kind.POD, full)["spec"]["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": kept}}
    n = load("node_unreachable")
    n["status"]["images"] = [{"names": ["big"], "sizeBytes": 1}]
    sn = slim(Kind.NODE, n)
    assert sn["spec"]["taints"] == n["spec"]["taints"]
    assert sn["status"] == {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}
    # Every usability rule gives the same answer on the slim objects.
    for pod_shape, node_shape in [("pod_running_ready", "node_ready"),
                                  ("pod_running_ready", "node_unreachable"),
                                  ("pod_deleting_graceful", "node_ready")]:
        p, nd = load(pod_shape), load(node_shape)
        nodes, slim_nodes = {"node-a": nd}, {"node-a": slim(Kind.NODE, nd)}
        assert pod_problem(slim(Kind.POD, p), slim_nodes) == pod_problem(p, nodes)


def test_slim_keeps_exit_codes_and_shares_what_pods_have_alike() -> None:
    crashed = load("pod_running_ready")
    crashed["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 137, "reason": "OOMKilled", "signal": 9, "startedAt": "t", "finishedAt": "t",
        "containerID": "local://1"}}
    assert slim(Kind.POD, crashed)["status"]["containerStatuses"] == [
        {"name": "worker", "restartCount": 0,
         "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "signal": 9}}}]
    a, b = load("pod_running_ready"), load("pod_running_ready")
    b["metadata"]["name"], b["status"]["podIP"] = "other", "10.9.9.9"
    sa, sb = slim(Kind.POD, a), slim(Kind.POD, b)
    # One copy of what thousands of workers have alike (memory at 10,000 workers).
    assert sa["status"]["conditions"] is sb["status"]["conditions"]
    assert sa["status"]["containerStatuses"] is sb["status"]["containerStatuses"]
    assert sa["metadata"]["labels"] is sb["metadata"]["labels"]
    assert sa["status"]["podIP"] != sb["status"]["podIP"]


def test_a_memo_gives_the_same_result_as_judging_every_pod_again() -> None:
    pods = [pod(f"w-{i}", ip=f"10.1.0.{i}", node=f"node-{i % 2}") for i in range(6)]
    v = view_of(*pods, node("node-0"), node("node-1"))
    memo = hostlist.Memo()

    def both() -> tuple[hostlist.Rendered, hostlist.Rendered]:
        return (hostlist.render(v, 1, HostMode.POD_IP, {}, memo=memo),
                hostlist.render(v, 1, HostMode.POD_IP, {}))

    first, fresh = both()
    assert first == fresh and len(first.lines) == 6
    # A node change reaches every pod on it although their objects are unchanged.
    down = with_condition(node("node-1"), "Ready", "False")
    down["metadata"]["resourceVersion"] = "2"
    v.apply(Kind.NODE, EventType.MODIFIED, down)
    after, fresh = both()
    assert after == fresh
    assert after.left_out == {f"w-{i}": Unusable.NODE_NOT_READY for i in (1, 3, 5)}
    # A changed pod object is judged again; a deleted pod leaves the memo.
    flipped = with_condition(pods[0], "Ready", "False")
    flipped["metadata"]["resourceVersion"] = "2"
    v.apply(Kind.POD, EventType.MODIFIED, flipped)
    v.apply(Kind.POD, EventType.DELETED, pods[2])
    after, fresh = both()
    assert after == fresh and after.left_out["w-0"] is Unusable.NOT_READY
    assert "w-2" not in memo.judged
    assert v.version == 11  # 8 objects added, 3 changes


@pytest.mark.parametrize("seed", range(20))
def test_incremental_renders_equal_full_ones_over_random_changes(seed: int) -> None:
    """Pods come, flip, move between IPs (some shared), go; nodes go down and up; pods retire;
    hosts get first owners; the supervisor's own sets change (hung and declared UIDs, the
    active pods, hosts heartbeating on down nodes, pods that stay while evicted): after every
    step the memo's render equals a full one."""
    import random

    rng = random.Random(seed)
    v = ClusterView()
    memo = hostlist.Memo()
    first_owner: dict[str, str] = {}
    retiring: frozenset[str] = frozenset()
    sets: dict[str, Any] = {}
    rv = iter(range(10, 10**6))
    for name in ("node-0", "node-1", "node-2"):
        v.apply(Kind.NODE, EventType.ADDED, node(name))
    last, reused = None, 0
    for step in range(150):
        op = rng.random()
        name = f"w-{rng.randrange(12)}"
        if op < 0.45:
            p = pod(name, ip=rng.choice([f"10.1.0.{rng.randrange(20)}", None]),
                    node=f"node-{rng.randrange(4)}", uid=f"uid-{name}-{rng.randrange(3)}")
            if rng.random() < 0.3:
                p = with_condition(p, "Ready", "False")
            if rng.random() < 0.1:
                p = deleting(p)
            p["metadata"]["resourceVersion"] = str(next(rv))
            v.apply(Kind.POD, EventType.MODIFIED if name in v.pods else EventType.ADDED, p)
        elif op < 0.6 and name in v.pods:
            v.apply(Kind.POD, EventType.DELETED, v.pods[name])
        elif op < 0.75:
            n = node(f"node-{rng.randrange(3)}")
            if rng.random() < 0.5:
                n = with_condition(n, "Ready", "False")
            n["metadata"]["resourceVersion"] = str(next(rv))
            v.apply(Kind.NODE, EventType.MODIFIED, n)
        elif op < 0.8:
            retiring = frozenset(rng.sample(sorted(v.pods), min(2, len(v.pods))))
        elif op < 0.9:
            uids = sorted(p["metadata"]["uid"] for p in v.pods.values())
            which = rng.randrange(5)
            if which == 0:
                sets["hung"] = frozenset(rng.sample(uids, min(2, len(uids))))
            elif which == 1:
                sets["declared"] = frozenset(rng.sample(uids, min(2, len(uids))))
            elif which == 2:
                sets["active"] = (None if rng.random() < 0.2 else frozenset(
                    rng.sample(sorted(v.pods), min(8, len(v.pods)))))
            elif which == 3:
                sets["heartbeating"] = frozenset(
                    f"10.1.0.{rng.randrange(20)}" for _ in range(rng.randrange(4)))
            else:
                sets["staying"] = frozenset(rng.sample(sorted(v.pods), min(2, len(v.pods))))
        else:
            for host, owner in hostlist.render(v, 1, HostMode.POD_IP, first_owner,
                                                retiring=retiring).hosts.items():
                first_owner.setdefault(host, v.pods[owner]["metadata"]["uid"])
        got = hostlist.render(v, 1, HostMode.POD_IP, first_owner, retiring=retiring,
                               memo=memo, **sets)
        want = hostlist.render(v, 1, HostMode.POD_IP, first_owner, retiring=retiring, **sets)
        assert got == want, f"step {step}"
        reused += got is last  # an unchanged result is the last object (hostlist.Memo.rendered)
        last = got
    assert reused, "some steps changed nothing the render gives"


def test_a_change_of_the_supervisors_own_sets_costs_what_it_touches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure at 10,000 workers changes the declared UIDs, then the active pods, then the
    first owners: each used to render every pod again (py-spy: 15 % of the loop's time over
    100 failures). Now only the full renders a view change asks for remain."""
    full: list[int] = []
    real = hostlist._full
    monkeypatch.setattr(hostlist, "_full", lambda *a: (full.append(1), real(*a))[1])
    pods = [slotted(f"job1-w{i}-1", i, 1, f"10.1.0.{10 + i}") for i in range(5)]
    v = view_of(*pods, node("node-a"))
    memo = hostlist.Memo()
    owners: dict[str, str] = {}
    active = frozenset(p["metadata"]["name"] for p in pods)
    kw: dict[str, Any] = {"active": active}
    steps = [("declared", frozenset({"uid-job1-w1-1"})), ("hung", frozenset({"uid-job1-w2-1"})),
             ("active", active - {"job1-w1-1"}), ("heartbeating", frozenset({"10.1.0.13"})),
             ("staying", frozenset({"job1-w4-1"})), ("declared", frozenset())]
    hostlist.render(v, 1, HostMode.POD_IP, owners, memo=memo, **kw)
    assert len(full) == 1
    full.clear()
    for key, value in steps:
        kw[key] = value
        got = hostlist.render(v, 1, HostMode.POD_IP, owners, memo=memo, **kw)
        assert full == [], f"a full render after {key} changed"
        assert got == hostlist.render(v, 1, HostMode.POD_IP, owners, **kw), key
        full.clear()
    owners["10.1.0.10"] = "someone else"
    got = hostlist.render(v, 1, HostMode.POD_IP, owners, memo=memo, **kw)
    assert got.left_out["job1-w0-1"] is Unusable.HOST_REUSED
    assert full == [], "a full render after a host got its first owner"


def slotted(name: str, slot: int, incarnation: int, ip: str) -> dict:
    """A worker the supervisor created for job1 (slot and incarnation labels)."""
    p = pod(name, ip=ip)
    p["metadata"]["labels"] = {"elastic-supervisor/job": "job1",
                               "elastic-supervisor/role": "worker",
                               "elastic-supervisor/slot": str(slot),
                               "elastic-supervisor/incarnation": str(incarnation)}
    return p


@pytest.mark.parametrize(("declared", "active", "left_out"), [
    pytest.param(frozenset(), None, {}, id="nothing declared, workers not owned: all listed"),
    pytest.param(frozenset({"uid-job1-w1-1"}), None,
                 {"job1-w1-1": Unusable.FOUND_FAILED},
                 id="declared failed while it still looks Running and Ready: out at once"),
    pytest.param(frozenset(), frozenset({"job1-w0-2", "job1-w1-1"}),
                 {"job1-w0-1": Unusable.SLOT_NOT_ACTIVE},
                 id="an old incarnation still running beside its replacement: out"),
    pytest.param(frozenset(), frozenset({"job1-w0-2"}),
                 {"job1-w0-1": Unusable.SLOT_NOT_ACTIVE, "job1-w1-1": Unusable.SLOT_NOT_ACTIVE},
                 id="a dropped slot's pod: out"),
])
def test_the_file_follows_the_supervisors_own_decisions(
        declared: frozenset[str], active: frozenset[str] | None,
        left_out: dict[str, Unusable]) -> None:
    v = view_of(slotted("job1-w0-1", 0, 1, "10.1.0.10"), slotted("job1-w1-1", 1, 1, "10.1.0.11"),
                slotted("job1-w0-2", 0, 2, "10.1.0.12"), pod("stranger", ip="10.1.0.13"),
                READY_NODE)
    r = hostlist.render(v, 1, HostMode.POD_IP, {}, declared=declared, active=active)
    assert r.left_out == left_out
    # A pod without the supervisor's labels (not created from its template) is never judged
    # by slot.
    assert "10.1.0.13:1" in r.lines
    memo = hostlist.Memo()
    hostlist.render(v, 1, HostMode.POD_IP, {}, memo=memo)
    again = hostlist.render(v, 1, HostMode.POD_IP, {}, declared=declared, active=active,
                             memo=memo)
    assert again.lines == r.lines, "a change of the decisions renders again"


def test_an_evicted_worker_that_must_stay_for_a_while_stays_listed() -> None:
    """Evicted (its entrypoint holds SIGTERM) while it is the last of Horovod's world: it
    stays in the file until another worker joined (core's leave step names it)."""
    v = view_of(deleting(pod()), READY_NODE)
    assert hostlist.render(v, 1, HostMode.POD_IP, {}).lines == ()
    stays = hostlist.render(v, 1, HostMode.POD_IP, {}, staying=frozenset({"w-0"}))
    assert stays.lines == ("10.1.0.10:1",)
    other = hostlist.render(v, 1, HostMode.POD_IP, {}, staying=frozenset({"w-1"}))
    assert other.lines == ()


def test_the_views_change_log_names_every_change_after_a_version_in_order() -> None:
    """ClusterView.changes_since: what each incremental render (and the known_hosts kept beside
    it) reads; an unchanged object is no change, a version the log no longer reaches is None
    (a full pass), a version ahead of the view too."""
    v = ClusterView()
    applied: list[tuple[Kind, str]] = []
    rng = random.Random(3)
    for i in range(observe.CHANGE_LOG + 500):
        name = f"w-{rng.randrange(50)}"
        if rng.random() < 0.2:
            if v.apply(Kind.POD, EventType.DELETED, {"metadata": {"name": name}}):
                applied.append((Kind.POD, name))
            continue
        obj = slim(Kind.POD, pod(name, ip=f"10.1.0.{i % 200}"))
        obj["metadata"]["resourceVersion"] = str(i)
        assert v.apply(Kind.POD, EventType.MODIFIED, obj)
        applied.append((Kind.POD, name))
        assert not v.apply(Kind.POD, EventType.MODIFIED, obj), "the same resourceVersion"
    assert v.version == len(applied)
    for back in (0, 1, 7, observe.CHANGE_LOG - 1, observe.CHANGE_LOG):
        assert v.changes_since(v.version - back) == applied[len(applied) - back:], back
    assert v.changes_since(v.version - observe.CHANGE_LOG - 1) is None
    assert v.changes_since(v.version + 1) is None
