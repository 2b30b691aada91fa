"""manifests/overlays/sidecar, built with kustomize (`kubectl kustomize`, offline), held to the
native-sidecar contract (issue 25) and to the local overlay it changes.

The launcher pod: shareProcessNamespace, the emptyDir `elastic-supervisor`, the init containers
`elastic-supervisor-install` (a regular one: it runs to completion first) then the native
sidecar `elastic-supervisor` (restartPolicy Always, `run`, the base's supervisor container with
SUPERVISOR_MODE=sidecar and every SUPERVISOR_* of the base but the discovery file, its mounts
plus the shared directory and the ServiceAccount's token, which no other container of the pod
gets: automountServiceAccountToken false, issue 39 item 9), and the container `launcher` running
the local overlay's training command through es-run in an image without the supervisor; the
worker template is the base's with that image. Every other object is the local overlay's,
unchanged. `problems` is also fed doctored builds, so each check can fail, and a base whose env
order changed stops the build.
The manifests are copied to a temporary directory with placeholder ssh files (the Secret's
contents are not looked at), so the repository is never written.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.controlplane import default_bin_dir
from localcluster.images import image_names, project_version
from localcluster.job import set_training

ROOT = Path(__file__).resolve().parents[2]
NAMES = image_names(project_version((ROOT / "pyproject.toml").read_text()))
OURS = {NAMES.launcher, NAMES.worker, NAMES.sidecar}  # the images holding the supervisor
SHARED = "/opt/elastic-supervisor"
KEEPER = ["python", "-m", "supervisor.keeper", "--", "elastic-supervisor", "run"]
NOT_KEPT = "does not run `python -m supervisor.keeper -- elastic-supervisor run`"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the client looks (in-cluster)
TOKEN_MOUNT = {"name": "elastic-supervisor-token", "mountPath": TOKEN_DIR, "readOnly": True}
SSH_FILES = ("id_ed25519", "id_ed25519.pub", "hook.key", "host_ed25519", "known_hosts")
Doc = dict[str, Any]


def kubectl() -> Path:
    found = default_bin_dir() / "kubectl"
    if not found.exists():
        pytest.fail(f"{found} not found (the control plane's kubectl): run make setup")
    return found


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy_dir = tmp_path_factory.mktemp("manifests") / "manifests"
    shutil.copytree(ROOT / "manifests", copy_dir,
                    ignore=shutil.ignore_patterns("ssh", "__pycache__"))
    (copy_dir / "base" / "ssh").mkdir()
    for name in SSH_FILES:
        (copy_dir / "base" / "ssh" / name).write_text(f"placeholder {name}\n")
    return copy_dir


def build(overlay: Path) -> list[Doc]:
    done = subprocess.run([str(kubectl()), "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def built(manifests: Path) -> dict[str, list[Doc]]:
    return {name: build(manifests / "overlays" / name) for name in ("local", "sidecar")}


def job(docs: list[Doc]) -> Doc:
    (found,) = [d for d in docs if d["kind"] == "Job"]
    return found


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = job(docs)["spec"]["template"]["spec"]
    return spec


def template(docs: list[Doc]) -> Doc:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"] == "elastic-supervisor-worker-template"]
    loaded: Doc = yaml.safe_load(cm["data"]["worker-template.yaml"])
    return loaded


def by_name(containers: list[Doc]) -> dict[str, Doc]:
    return {c["name"]: c for c in containers}


def env_of(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", ())}


def problems(sidecar: list[Doc], local: list[Doc]) -> list[str]:
    """Return what keeps the sidecar overlay's build from the contract and from the local
    overlay's (`local`), one line each."""
    found: list[str] = []
    spec, base_spec = pod_spec(sidecar), pod_spec(local)
    (base,) = base_spec["containers"]  # the baked launcher: supervisor + horovodrun
    if spec.get("shareProcessNamespace") is not True:
        found.append("the launcher pod does not share its process namespace")
    volumes = by_name(spec.get("volumes", []))
    if volumes.get("elastic-supervisor") != {"name": "elastic-supervisor", "emptyDir": {}}:
        found.append("no emptyDir volume elastic-supervisor")
    inits = spec.get("initContainers", [])
    if [c["name"] for c in inits] != ["elastic-supervisor-install", "elastic-supervisor"]:
        found.append(f"init containers {[c['name'] for c in inits]}: expected "
                     "elastic-supervisor-install, then elastic-supervisor")
        return found
    install, sidecar_c = inits
    mount = {"name": "elastic-supervisor", "mountPath": SHARED}
    if (install.get("image"), install.get("args"), install.get("restartPolicy")) != (
            NAMES.sidecar, ["install", SHARED], None):
        found.append("elastic-supervisor-install is not a regular init container running "
                     f"`install {SHARED}` from {NAMES.sidecar}")
    if mount not in install.get("volumeMounts", []):
        found.append(f"elastic-supervisor-install does not mount the shared directory at {SHARED}")
    if sidecar_c.get("restartPolicy") != "Always":
        found.append("elastic-supervisor is not a native sidecar (restartPolicy Always)")
    if (sidecar_c.get("image"), sidecar_c.get("command"), sidecar_c.get("args")) != (
            NAMES.sidecar, KEEPER, None):
        found.append("elastic-supervisor does not run `python -m supervisor.keeper -- "
                     f"elastic-supervisor run` from {NAMES.sidecar}")
    expected_env = {k: v for k, v in env_of(base).items() if k != "SUPERVISOR_DISCOVERY_FILE"}
    expected_env["SUPERVISOR_MODE"] = "sidecar"
    if env_of(sidecar_c) != expected_env:
        missing = sorted(set(expected_env) - set(env_of(sidecar_c)))
        extra = sorted(set(env_of(sidecar_c)) - set(expected_env))
        changed = sorted(k for k in set(expected_env) & set(env_of(sidecar_c))
                         if expected_env[k] != env_of(sidecar_c)[k])
        found.append(f"elastic-supervisor's env: missing {missing}, extra {extra}, "
                     f"changed {changed}")
    if sidecar_c.get("volumeMounts") != [*base["volumeMounts"], mount, TOKEN_MOUNT]:
        found.append("elastic-supervisor's mounts are not the base's plus the shared directory "
                     f"and the ServiceAccount token at {TOKEN_DIR}")
    # The token in the supervisor's container alone (issue 39, item 9).
    if spec.get("automountServiceAccountToken") is not False:
        found.append("the launcher pod mounts the ServiceAccount token in every container "
                     "(automountServiceAccountToken is not false)")
    sources = (volumes.get("elastic-supervisor-token", {}).get("projected") or {}).get(
        "sources", [])
    if not any(src.get("serviceAccountToken", {}).get("path") == "token" for src in sources):
        found.append("no projected ServiceAccount token volume elastic-supervisor-token")
    for c in [install, *spec["containers"]]:
        if any(m["name"] == "elastic-supervisor-token" or m["mountPath"] == TOKEN_DIR
               for m in c.get("volumeMounts", [])):
            found.append(f"container {c['name']} mounts the supervisor's token")
    for key in ("ports", "resources", "securityContext", "imagePullPolicy"):
        if sidecar_c.get(key) != base.get(key):
            found.append(f"elastic-supervisor's {key} differ from the base container's")
    containers = by_name(spec["containers"])
    if list(containers) != ["launcher"]:
        found.append(f"containers {list(containers)}: expected launcher alone")
        return found
    launcher = containers["launcher"]
    if launcher.get("image") in OURS:
        found.append(f"the launcher container runs {launcher.get('image')}, which holds the "
                     "supervisor")
    if launcher.get("command") != [f"{SHARED}/bin/es-run"]:
        found.append(f"the launcher container's command is not [{SHARED}/bin/es-run]")
    if launcher.get("args") != base["args"]:
        found.append("the launcher container's args are not the local overlay's training "
                     "command")
    if mount not in launcher.get("volumeMounts", []):
        found.append(f"the launcher container does not mount the shared directory at {SHARED}")
    if launcher.get("securityContext") != base["securityContext"]:
        found.append("the launcher container's securityContext differs from the base's")
    if env_of(launcher):
        found.append("the launcher container has env: the supervisor's belongs to the sidecar")
    rules = job(sidecar)["spec"]["podFailurePolicy"]["rules"]
    named = {r["onExitCodes"]["containerName"] for r in rules if "onExitCodes" in r}
    if named != {"launcher"}:
        found.append(f"the podFailurePolicy reads exit codes from {sorted(named)}")
    worker = template(sidecar)
    image = worker["spec"]["containers"][0].get("image")
    if image in OURS:
        found.append(f"the worker template runs {image}, which holds the supervisor")
    expected = copy.deepcopy(template(local))
    expected["spec"]["containers"][0]["image"] = image
    if worker != expected:
        found.append("the worker template differs from the base's in more than its image")
    return found


def test_the_sidecar_overlay_meets_the_contract(built: dict[str, list[Doc]]) -> None:
    assert problems(built["sidecar"], built["local"]) == []
    # The stand-in for a user's image: the training layers only.
    assert by_name(pod_spec(built["sidecar"])["containers"])["launcher"]["image"] == \
        NAMES.trainer
    assert template(built["sidecar"])["spec"]["containers"][0]["image"] == NAMES.trainer


IMAGE_VARIABLES = ("hookImage", "workerImages")  # what the overlay copies into the policy


def policy_variable(docs: list[Doc], name: str) -> str:
    """The CEL expression of the creates' admission policy's variable `name`."""
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                 and "elastic-supervisor/admission" in (d["metadata"].get("labels") or {})]
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == name]
    return str(variable["expression"])


def test_everything_else_is_the_local_overlays(built: dict[str, list[Doc]]) -> None:
    def rest(docs: list[Doc]) -> list[Doc]:
        docs = copy.deepcopy(docs)
        for d in docs:  # the images aside (below)
            if d["kind"] == "ValidatingAdmissionPolicy":
                for v in d["spec"].get("variables") or ():
                    if v["name"] in IMAGE_VARIABLES:
                        v["expression"] = "IMAGE"
        return [d for d in docs if d["kind"] != "Job" and d["metadata"]["name"]
                != "elastic-supervisor-worker-template"]

    assert rest(built["sidecar"]) == rest(built["local"])
    # The admission policy admits the workers with the training image and the init container
    # the supervisor adds to them with its own (the native sidecar's); the baked mode adds none.
    (sidecar_c,) = [c for c in pod_spec(built["sidecar"])["initContainers"]
                    if c["name"] == "elastic-supervisor"]
    assert policy_variable(built["sidecar"], "hookImage") == f"'{sidecar_c['image']}'" == \
        f"'{NAMES.sidecar}'"
    assert policy_variable(built["local"], "hookImage") == "''"
    assert policy_variable(built["sidecar"], "workerImages") == \
        f"['{template(built['sidecar'])['spec']['containers'][0]['image']}']" == \
        f"['{NAMES.trainer}']"
    assert policy_variable(built["local"], "workerImages") == f"['{NAMES.worker}']"
    sidecar, local = job(built["sidecar"]), job(built["local"])
    assert {k: v for k, v in sidecar["spec"].items() if k != "template"} == \
        {k: v for k, v in local["spec"].items() if k != "template"}
    assert sidecar["spec"]["template"]["metadata"] == local["spec"]["template"]["metadata"]
    changed = {"shareProcessNamespace", "initContainers", "containers", "volumes",
               "automountServiceAccountToken"}
    assert {k: v for k, v in pod_spec(built["sidecar"]).items() if k not in changed} == \
        {k: v for k, v in pod_spec(built["local"]).items() if k not in changed}


def _spec(docs: list[Doc]) -> Doc:
    return pod_spec(docs)


def _init(name: str) -> Callable[[list[Doc]], Doc]:
    return lambda docs: by_name(pod_spec(docs)["initContainers"])[name]


def _launcher(docs: list[Doc]) -> Doc:
    return by_name(pod_spec(docs)["containers"])["launcher"]


def _template_container(docs: list[Doc]) -> Doc:
    # Edits go through the ConfigMap's text: see _doctor.
    return template(docs)["spec"]["containers"][0]


def _swap_inits(spec: Doc) -> None:
    spec["initContainers"].reverse()


def _drop_env(name: str) -> Callable[[Doc], None]:
    def drop(c: Doc) -> None:
        c["env"] = [e for e in c["env"] if e["name"] != name]
    return drop


def _set(key: str, value: Any) -> Callable[[Doc], None]:
    def set_(c: Doc) -> None:
        c[key] = value
    return set_


def _pop(key: str) -> Callable[[Doc], None]:
    return lambda c: c.pop(key)


# (id, where, change, expected problem fragment)
DOCTORED: list[tuple[str, Callable[[list[Doc]], Doc], Callable[[Doc], None], str]] = [
    ("no shared process namespace", _spec, _pop("shareProcessNamespace"),
     "does not share its process namespace"),
    ("no shared volume", _spec,
     lambda s: s.update(volumes=[v for v in s["volumes"] if v["name"] != "elastic-supervisor"]),
     "no emptyDir volume"),
    ("the install after the sidecar", _spec, _swap_inits, "expected elastic-supervisor-install"),
    ("a sidecar that is a plain init container", _init("elastic-supervisor"),
     _pop("restartPolicy"), "not a native sidecar"),
    ("an install that is a sidecar too", _init("elastic-supervisor-install"),
     _set("restartPolicy", "Always"), "not a regular init container"),
    ("a sidecar still running the training command", _init("elastic-supervisor"),
     _set("args", ["run", "--", "python", "/workspace/train.py"]), NOT_KEPT),
    ("a sidecar from the launcher image", _init("elastic-supervisor"),
     _set("image", NAMES.launcher), NOT_KEPT),
    ("no SUPERVISOR_MODE", _init("elastic-supervisor"), _drop_env("SUPERVISOR_MODE"),
     "missing ['SUPERVISOR_MODE']"),
    ("a base variable lost", _init("elastic-supervisor"), _drop_env("SUPERVISOR_FENCE_PORT"),
     "missing ['SUPERVISOR_FENCE_PORT']"),
    ("the baked discovery file kept", _init("elastic-supervisor"),
     lambda c: c["env"].append({"name": "SUPERVISOR_DISCOVERY_FILE",
                                "value": "/etc/edl/hostfile"}),
     "extra ['SUPERVISOR_DISCOVERY_FILE']"),
    ("a sidecar without the shared directory", _init("elastic-supervisor"),
     lambda c: c["volumeMounts"].pop(-2), "base's plus the shared directory"),
    ("a sidecar without its metrics port", _init("elastic-supervisor"),
     lambda c: c["ports"].pop(0), "ports differ"),
    ("the launcher on the launcher image", _launcher, _set("image", NAMES.launcher),
     "which holds the supervisor"),
    ("the launcher on the worker image", _launcher, _set("image", NAMES.worker),
     "which holds the supervisor"),
    ("the launcher without es-run", _launcher, _pop("command"), "command is not"),
    ("the launcher with another training command", _launcher,
     _set("args", ["python", "/workspace/train.py"]), "args are not the local overlay's"),
    ("the launcher without the shared directory", _launcher, _pop("volumeMounts"),
     "does not mount the shared directory"),
    ("the launcher as root", _launcher, _set("securityContext", {}),
     "securityContext differs"),
    ("the supervisor's env on the launcher", _launcher,
     _set("env", [{"name": "SUPERVISOR_MODE", "value": "sidecar"}]), "has env"),
    ("the token in every container", _spec, _pop("automountServiceAccountToken"),
     "automountServiceAccountToken is not false"),
    ("the token not projected", _spec,
     lambda s: s["volumes"].__setitem__(-1, {"name": "elastic-supervisor-token",
                                             "emptyDir": {}}),
     "no projected ServiceAccount token"),
    ("the token in the training container", _launcher,
     lambda c: c["volumeMounts"].append(dict(TOKEN_MOUNT)), "launcher mounts the supervisor's"),
    ("a sidecar without the token", _init("elastic-supervisor"),
     lambda c: c["volumeMounts"].pop(), "and the ServiceAccount token"),
    ("the worker template on the worker image", _template_container,
     _set("image", NAMES.worker), "which holds the supervisor"),
    ("the worker template changed otherwise", _template_container,
     _set("imagePullPolicy", "Always"), "differs from the base's in more than its image"),
]


def _doctor(docs: list[Doc], where: Callable[[list[Doc]], Doc],
            change: Callable[[Doc], None]) -> list[Doc]:
    docs = copy.deepcopy(docs)
    if where is _template_container:
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"] == "elastic-supervisor-worker-template"]
        loaded = yaml.safe_load(cm["data"]["worker-template.yaml"])
        change(loaded["spec"]["containers"][0])
        cm["data"]["worker-template.yaml"] = yaml.safe_dump(loaded)
    else:
        change(where(docs))
    return docs


@pytest.mark.parametrize(("where", "change", "expected"), [d[1:] for d in DOCTORED],
                         ids=[d[0] for d in DOCTORED])
def test_a_doctored_build_is_caught(built: dict[str, list[Doc]],
                                    where: Callable[[list[Doc]], Doc],
                                    change: Callable[[Doc], None], expected: str) -> None:
    found = problems(_doctor(built["sidecar"], where, change), built["local"])
    assert any(expected in p for p in found), found


def test_a_base_whose_env_order_changed_stops_the_build(manifests: Path,
                                                         tmp_path: Path) -> None:
    # The overlay removes SUPERVISOR_DISCOVERY_FILE by index, behind a JSON patch `test`: a
    # base that moved it must fail the build, not lose another variable.
    tree = tmp_path / "manifests"
    shutil.copytree(manifests, tree)
    job_file = tree / "base" / "launcher-job.yaml"
    text = job_file.read_text()
    entry = ("            - name: SUPERVISOR_DISCOVERY_FILE\n"
             "              value: /etc/edl/hostfile\n")
    assert entry in text
    job_file.write_text(text.replace(entry, ""))
    done = subprocess.run([str(kubectl()), "kustomize", str(tree / "overlays" / "sidecar")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "testing value /spec/template/spec/initContainers/0/env/7/name failed" in done.stderr


def test_the_job_helpers_set_the_training_command_and_the_supervisors_env(
        built: dict[str, list[Doc]]) -> None:
    # localcluster.job.render's edits (the end-to-end tests' training command and variables)
    # reach the same containers in both modes: args the container `launcher`, env the
    # supervisor's (the sidecar in sidecar mode, never the training container).
    args = ["python", "/workspace/train.py", "--steps", "40"]
    for mode, supervisor in (("local", lambda s: s["containers"][0]),
                             ("sidecar", lambda s: by_name(s["initContainers"])
                              ["elastic-supervisor"])):
        spec = copy.deepcopy(pod_spec(built[mode]))
        set_training(spec, args=args, env={"SUPERVISOR_LOG_LEVEL": "debug",
                                           "SUPERVISOR_STALL_TIMEOUT_SECONDS": "30"})
        assert by_name(spec["containers"])["launcher"]["args"] == args, mode
        env = env_of(supervisor(spec))
        assert (env["SUPERVISOR_LOG_LEVEL"], env["SUPERVISOR_STALL_TIMEOUT_SECONDS"]) == (
            "debug", "30"), mode
        assert env["SUPERVISOR_JOB_NAME"] == "elastic-train", mode
    sidecar_spec = copy.deepcopy(pod_spec(built["sidecar"]))
    set_training(sidecar_spec, env={"SUPERVISOR_LOG_LEVEL": "debug"})
    assert env_of(by_name(sidecar_spec["containers"])["launcher"]) == {}


def readme_yaml() -> Doc:
    """The pod spec changes README.md's "Use it with your own image" shows."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use it with your own image"):]
    block = section[section.index("```yaml\n") + 8:section.index("```\n", 8)]
    assert len(block.splitlines()) < 30, "the README promises under 30 lines"
    return yaml.safe_load(block)["spec"]


def is_part_of(small: Any, big: Any, where: str = "spec") -> list[str]:
    """Where `small` (the README's) is not in `big` (the overlay's): mappings key by key, lists
    of named entries by name, other lists item by item. The README's own values (the job's
    name, the image, the training command) are the user's: only names and the structure must
    match."""
    if isinstance(small, dict) and isinstance(big, dict):
        return [p for k, v in small.items()
                for p in ([f"{where}.{k}: missing"] if k not in big
                          else is_part_of(v, big[k], f"{where}.{k}"))]
    if isinstance(small, list) and isinstance(big, list):
        if all(isinstance(x, dict) and "name" in x for x in small):
            named = {x["name"]: x for x in big if isinstance(x, dict)}
            return [p for x in small for p in (
                [f"{where}[{x['name']}]: missing"] if x["name"] not in named
                else is_part_of({k: v for k, v in x.items() if k not in (
                    "value", "image", *(("args",) if x["name"] == "launcher" else ()))},
                                named[x["name"]], f"{where}[{x['name']}]"))]
        return [] if small == big[:len(small)] else [f"{where}: {small} != {big}"]
    return [] if small == big else [f"{where}: {small!r} != {big!r}"]


def test_the_readmes_recipe_is_the_tested_overlay(built: dict[str, list[Doc]]) -> None:
    """What a new user copies from the README is what the sidecar e2e tests run
    (tests/e2e/test_sidecar.py applies manifests/overlays/sidecar)."""
    recipe = readme_yaml()
    assert [c["name"] for c in recipe["initContainers"]] == [
        c["name"] for c in pod_spec(built["sidecar"])["initContainers"]]
    assert is_part_of(recipe, pod_spec(built["sidecar"])) == []
    # and the comparison can fail
    recipe["containers"][0]["command"] = ["/opt/es-run"]
    recipe["initContainers"][1]["restartPolicy"] = "OnFailure"
    assert is_part_of(recipe, pod_spec(built["sidecar"])) == [
        "spec.initContainers[elastic-supervisor].restartPolicy: 'OnFailure' != 'Always'",
        "spec.containers[launcher].command: ['/opt/es-run'] != "
        "['/opt/elastic-supervisor/bin/es-run']"]
