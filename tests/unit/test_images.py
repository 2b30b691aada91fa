"""The four Dockerfiles and the build context, read as text (Docker is not needed).

What hadolint (tests/integration/test_images.py) cannot know about this repository: base images
pinned once build ARGs are resolved, every COPY source present and not dropped by .dockerignore,
ENTRYPOINT/CMD in exec form, a non-root USER in the final stage, the launcher's and the sidecar's
entrypoints, the same training stack in the launcher and worker images as in pyproject.toml, a
trainer stage without the supervisor and a sidecar without the training stack, a TensorFlow
trainer with the TensorFlow environment's pin, the torch trainer's sshd and nothing of ours, and
a build context that keeps .git, .venv and the job's ssh keys out. Each check is also fed a doctored
Dockerfile, so it can fail.
Then the pure parts of localcluster/images.py, which builds them: the pause image's docker-save
archive, build args, the builds and the docker build command line, the checks of the built
images' layers and contents (the content probe run here), the wheelhouse's requirements, the
build context and cache keys, apt's sources for the base image, dockerd's flags.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import json
import re
import socket
import subprocess
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster import images, pythons
from localcluster.images import dockerignore_excludes, dockerignore_patterns

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"launcher": ROOT / "launcher_image" / "Dockerfile",
               "worker": ROOT / "worker_image" / "Dockerfile",
               "sidecar": ROOT / "sidecar_image" / "Dockerfile",
               "trainer-tf": ROOT / "trainer_tf_image" / "Dockerfile"}
# COPY sources another branch is adding: allowed to be missing until they land (then checked).
PENDING = {"worker_image/train.py"}
# Must never reach the build context (the Docker daemon, and every layer's cache).
NEVER_IN_CONTEXT = [".git/HEAD", ".venv/bin/python", "manifests/base/ssh/id_ed25519",
                    "tests/conftest.py", "supervisor/__pycache__/cli.cpython-311.pyc"]


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str  # upper case
    args: str


def parse(text: str) -> list[Instruction]:
    """Return the instructions of a Dockerfile: comments dropped, continuations joined."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # inside a continuation too, as Docker does
        if not parts:
            start = n
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            keyword, _, args = " ".join(parts).partition(" ")
            out.append(Instruction(start, keyword.upper(), args.strip()))
            parts = []
    return out


def _substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def _exec_form(args: str) -> list[str] | None:
    try:
        value = json.loads(args)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name_tag = image.rsplit("/", 1)[-1]
    return ":" in name_tag and name_tag.rsplit(":", 1)[1] not in ("", "latest")


def problems(text: str, *, role: str, ignore: list[str], root: Path = ROOT) -> list[str]:
    """Return what is wrong with a Dockerfile's text (one line each, citing its line)."""
    found: list[str] = []
    steps = parse(text)
    build_args: dict[str, str] = {}
    stages: set[str] = set()
    final: list[Instruction] = []
    for ins in steps:
        if ins.keyword == "ARG" and not stages and "=" in ins.args:
            key, _, value = ins.args.partition("=")
            build_args[key] = value
        elif ins.keyword == "FROM":
            words = ins.args.split()
            image = _substitute(words[0], build_args)
            if image not in stages and image != "scratch" and not _pinned(image):
                found.append(f"line {ins.line}: FROM {image}: pin a tag other than latest")
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
            final = []
        final.append(ins)
        if ins.keyword in ("COPY", "ADD"):
            words = [w for w in ins.args.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in ins.args.split()):
                continue
            for src in words[:-1]:
                if not list(root.glob(src)) and src not in PENDING:
                    found.append(f"line {ins.line}: {ins.keyword} {src}: not in the repository")
                if dockerignore_excludes(ignore, src):
                    found.append(f"line {ins.line}: {ins.keyword} {src}: excluded by "
                                 ".dockerignore")
        if ins.keyword in ("ENTRYPOINT", "CMD") and _exec_form(ins.args) is None:
            found.append(f"line {ins.line}: {ins.keyword} {ins.args}: use the exec (JSON) form")
    users = [i for i in final if i.keyword == "USER"]
    if not users:
        found.append("final stage: no USER: the container would run as root")
    elif users[-1].args.split(":")[0] in ("root", "0"):
        found.append(f"line {users[-1].line}: USER {users[-1].args}: run as a non-root user")
    entry = [_exec_form(i.args) for i in final if i.keyword == "ENTRYPOINT"]
    if role == "launcher" and entry[-1:] != [["elastic-supervisor", "run", "--"]]:
        found.append("final stage: ENTRYPOINT must be [\"elastic-supervisor\", \"run\", \"--\"]")
    cmd = [_exec_form(i.args) for i in final if i.keyword == "CMD"]
    if role == "sidecar" and (entry[-1:], cmd[-1:]) != ([["elastic-supervisor"]], [["run"]]):
        found.append("final stage: ENTRYPOINT must be [\"elastic-supervisor\"], CMD [\"run\"]")
    return found


def build_arg(text: str, name: str) -> str | None:
    m = re.search(rf"^ARG {name}=(\S+)$", text, re.M)
    return m[1] if m else None


@pytest.fixture(scope="module")
def ignore() -> list[str]:
    return dockerignore_patterns((ROOT / ".dockerignore").read_text())


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_the_dockerfile_has_no_problems(role: str, ignore: list[str]) -> None:
    assert problems(DOCKERFILES[role].read_text(), role=role, ignore=ignore) == []


DOCTORED = [
    # (id, role, old text, new text, expected problem fragment)
    ("an unpinned base image", "launcher", "ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm",
     "ARG PYTHON_IMAGE=python", "FROM python: pin a tag"),
    ("a latest base image", "worker", "ARG TRAINING_IMAGE=elastic-supervisor-training:0.1.0",
     "ARG TRAINING_IMAGE=elastic-supervisor-training:latest",
     "FROM elastic-supervisor-training:latest: pin"),
    ("a shell-form entrypoint", "launcher", 'ENTRYPOINT ["elastic-supervisor", "run", "--"]',
     "ENTRYPOINT elastic-supervisor run --", "use the exec (JSON) form"),
    ("another entrypoint", "launcher", 'ENTRYPOINT ["elastic-supervisor", "run", "--"]',
     'ENTRYPOINT ["horovodrun"]', "ENTRYPOINT must be"),
    ("no USER in the launcher", "launcher", "USER 1000:1000\n", "", "no USER"),
    ("USER root in the worker", "worker", "USER 1000:1000", "USER root", "USER root: run as"),
    ("a COPY source that does not exist", "worker", "COPY worker_image/sshd_config ",
     "COPY worker_image/sshd_conf ", "worker_image/sshd_conf: not in the repository"),
    ("a COPY source .dockerignore drops", "launcher", "COPY supervisor /src/supervisor",
     "COPY tests /src/tests", "tests: excluded by .dockerignore"),
    ("the sidecar running horovodrun", "sidecar", 'ENTRYPOINT ["elastic-supervisor"]',
     'ENTRYPOINT ["elastic-supervisor", "run", "--"]', "CMD [\"run\"]"),
    ("the sidecar without its run command", "sidecar", 'CMD ["run"]', 'CMD ["explain"]',
     "CMD [\"run\"]"),
    ("no USER in the sidecar", "sidecar", "USER 1000:1000\n", "", "no USER"),
    ("an unpinned sidecar base", "sidecar", "ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm",
     "ARG PYTHON_IMAGE=python:latest", "FROM python:latest: pin"),
    ("USER root in the TensorFlow trainer", "trainer-tf", "USER 1000:1000", "USER 0:0",
     "USER 0:0: run as"),
    ("a COPY source the TensorFlow trainer lacks", "trainer-tf",
     "scripts/build-training-venv.sh /opt", "scripts/venv.sh /opt",
     "scripts/venv.sh: not in the repository"),
]


@pytest.mark.parametrize(("role", "old", "new", "expected"),
                         [d[1:] for d in DOCTORED], ids=[d[0] for d in DOCTORED])
def test_a_doctored_dockerfile_is_caught(role: str, old: str, new: str, expected: str,
                                         ignore: list[str]) -> None:
    text = DOCKERFILES[role].read_text()
    assert old in text
    found = problems(text.replace(old, new), role=role, ignore=ignore)
    assert any(expected in p for p in found), found


def test_the_pending_training_script_is_copied_into_the_worker() -> None:
    # Allowed to be missing only while its branch has not landed; then the usual checks apply.
    assert "COPY worker_image/train.py /workspace/train.py" in DOCKERFILES["worker"].read_text()


@pytest.mark.parametrize("path", NEVER_IN_CONTEXT)
def test_the_build_context_leaves_out(path: str, ignore: list[str]) -> None:
    assert dockerignore_excludes(ignore, path)


@pytest.mark.parametrize(("patterns", "path", "excluded"), [
    (["*"], ".venv/bin/python", True),
    (["*", "!supervisor/"], "supervisor/cli.py", False),
    (["*", "!supervisor/", "**/__pycache__"], "supervisor/__pycache__/x.pyc", True),
    (["*.md"], "docs/a.md", False),  # `*` stays within the top directory
    (["**/*.md"], "docs/a.md", True),
    ([".git"], ".github/workflows/ci.yml", False),
    ([], ".git/HEAD", False),
], ids=["star drops everything", "a negation re-includes a directory",
        "a later pattern drops again", "star does not cross directories",
        "double star does", "a name is not a prefix", "nothing ignored by default"])
def test_dockerignore_rules(patterns: list[str], path: str, excluded: bool) -> None:
    assert dockerignore_excludes(patterns, path) is excluded


def test_both_images_carry_the_same_training_stack_as_pyproject() -> None:
    # Horovod needs the same versions on the launcher and every worker: the worker starts FROM
    # the launcher Dockerfile's training stage (this version's), and the training venv's torch
    # default is pyproject's pin.
    launcher, worker = (DOCKERFILES[role].read_text() for role in ("launcher", "worker"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', pyproject, re.M)
    assert version is not None
    assert build_arg(worker, "TRAINING_IMAGE") == f"elastic-supervisor-training:{version[1]}"
    assert "FROM ${TRAINING_IMAGE} AS trainer\n" in worker
    assert "FROM trainer\n" in worker
    assert "FROM ${PYTHON_IMAGE} AS training\n" in launcher
    assert "FROM training\n" in launcher
    assert "RUN /opt/training/build-training-venv.sh torch /opt/venv" in launcher
    assert "RUN /opt/training/build-training-venv.sh horovod /opt/venv" in launcher
    torch_pin = re.search(r'"torch==([^"]+)"', pyproject)
    script = (ROOT / "scripts" / "build-training-venv.sh").read_text()
    default = re.search(r"^torch_version=\$\{TORCH_VERSION:-(.+)\}$", script, re.M)
    assert torch_pin is not None and default is not None
    assert default[1] == torch_pin[1]


def _stage_of(text: str, keyword_args: str) -> list[Instruction]:
    # The instructions of the stage that starts with FROM `keyword_args`, up to the next FROM.
    steps = parse(text)
    start = next(i for i, ins in enumerate(steps) if ins.keyword == "FROM"
                 and ins.args == keyword_args)
    end = next((i for i, ins in enumerate(steps) if i > start and ins.keyword == "FROM"),
               len(steps))
    return steps[start + 1:end]


def _of_the_supervisor(stage: list[Instruction]) -> list[str]:
    # The instructions of a stage that bring in anything of the supervisor.
    return [f"line {ins.line}: {ins.keyword} {ins.args}" for ins in stage
            if "supervisor" in ins.args or "pyproject" in ins.args]


def test_the_training_stage_holds_nothing_of_the_supervisor() -> None:
    # A change of the supervisor's code or dependencies must rebuild none of the heavy layers.
    stage = _stage_of(DOCKERFILES["launcher"].read_text(), "${PYTHON_IMAGE} AS training")
    copied = [w for ins in stage if ins.keyword == "COPY" for w in ins.args.split()[:-1]]
    assert copied == ["scripts/build-horovod.sh", "scripts/build-training-venv.sh"]
    assert _of_the_supervisor(stage) == []


TRAINER = "${TRAINING_IMAGE} AS trainer"


def test_the_trainer_holds_nothing_of_the_supervisor_and_the_worker_adds_it() -> None:
    # Sidecar mode's promise: a training image without elastic-supervisor (the worker's
    # trainer stage stands for the user's own image). The worker is the trainer + the package.
    text = DOCKERFILES["worker"].read_text()
    trainer = _stage_of(text, TRAINER)
    copied = [w for ins in trainer if ins.keyword == "COPY" for w in ins.args.split()[:-1]]
    assert copied == ["worker_image/sshd_config", "worker_image/entrypoint.sh",
                      "worker_image/train.py"]
    assert _of_the_supervisor(trainer) == []
    worker = _stage_of(text, "trainer")
    assert [ins.args for ins in worker if ins.keyword == "COPY"] == [
        "pyproject.toml /src/", "supervisor /src/supervisor"]
    assert [ins.args for ins in worker if ins.keyword == "USER"][-1] == "1000:1000"
    # The check can fail: the package installed a stage too early.
    doctored = text.replace("COPY worker_image/train.py /workspace/train.py",
                            "COPY worker_image/train.py /workspace/train.py\n"
                            "COPY supervisor /src/supervisor")
    found = _of_the_supervisor(_stage_of(doctored, TRAINER))
    assert [p.split(": ", 1)[1] for p in found] == ["COPY supervisor /src/supervisor"]


def test_the_tensorflow_trainer_is_the_torch_trainers_sshd_on_tensorflow_and_nothing_of_ours(
) -> None:
    text = DOCKERFILES["trainer-tf"].read_text()
    # The launcher's base image, and the TensorFlow the hook's TensorFlow tests run (the Horovod
    # wheel in the wheelhouse is built against that one).
    assert build_arg(text, "PYTHON_IMAGE") == build_arg(DOCKERFILES["launcher"].read_text(),
                                                       "PYTHON_IMAGE")
    assert build_arg(text, "TF_VERSION") == images.tf_pin(
        (ROOT / images.TF_ENV_SCRIPT).read_text()) == "2.15.1"
    stage = _stage_of(text, "${PYTHON_IMAGE}")
    assert _of_the_supervisor(stage) == []
    runs = [ins.args for ins in stage if ins.keyword == "RUN"]
    assert runs[:2] == ["/opt/training/build-training-venv.sh tensorflow /opt/venv",
                        "/opt/training/build-training-venv.sh horovod /opt/venv tensorflow"]
    copied = [w for ins in stage if ins.keyword == "COPY" for w in ins.args.split()[:-1]]
    assert copied == ["scripts/build-horovod.sh", "scripts/build-training-venv.sh",
                      "worker_image/sshd_config", "worker_image/entrypoint.sh"]
    # The torch trainer's user, sshd and entrypoint, instruction for instruction.
    torch = _stage_of(DOCKERFILES["worker"].read_text(), TRAINER)
    assert runs[2] == next(ins.args for ins in torch if ins.keyword == "RUN")
    tail = [(ins.keyword, ins.args) for ins in stage if ins.keyword in (
        "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT")]
    assert tail == [(ins.keyword, ins.args) for ins in torch if ins.keyword in (
        "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT")]
    assert [ins.args for ins in stage if ins.keyword == "ENV"] == [
        "PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1"]


def test_the_tensorflow_wheelhouse_holds_what_its_image_installs() -> None:
    script = (ROOT / "scripts" / "build-training-venv.sh").read_text()
    wanted = images.tf_wheelhouse_requirements("2.15.1")
    assert wanted[0] == "tensorflow-cpu==2.15.1"
    assert '"tensorflow-cpu==${TF_VERSION:?' in script
    runtime = re.search(r'^    "\$\{pip\[@\]\}" (cloudpickle .*)$', script, re.M)
    assert runtime is not None and runtime[1].split() == wanted[1:]
    # Nothing is compiled from the wheelhouse: Horovod comes as a wheel only.
    assert '--only-binary horovod "horovod==$horovod_version"' in script
    with pytest.raises(images.ImagesError, match="no TF_VERSION"):
        images.tf_pin("TF_VERSION=2.15.1\n")


SIDECAR_STAGE = "${PYTHON_IMAGE}"


def _training_stack(stage: list[Instruction]) -> list[str]:
    words = ("torch", "horovod", "build-training-venv", "openssh", "TRAINING_IMAGE")
    return [f"line {ins.line}: {ins.keyword} {ins.args}" for ins in stage
            if any(w in ins.args for w in words) and "find_spec" not in ins.args]


def test_the_sidecar_is_the_supervisor_alone_on_the_launchers_base() -> None:
    text = DOCKERFILES["sidecar"].read_text()
    assert build_arg(text, "PYTHON_IMAGE") == build_arg(DOCKERFILES["launcher"].read_text(),
                                                       "PYTHON_IMAGE")
    stage = _stage_of(text, SIDECAR_STAGE)
    assert _training_stack(stage) == []
    # Dependencies from pyproject.toml alone first, the code after: editing it reinstalls
    # nothing else; the build checks the installed command and that no torch came in.
    order = [ins.args for ins in stage if ins.keyword in ("COPY", "RUN")]
    deps = next(i for i, a in enumerate(order) if "requirements.txt" in a)
    code = order.index("supervisor /src/supervisor")
    assert order.index("pyproject.toml /src/") < deps < code
    assert "--no-deps" in order[code + 1]
    assert "elastic-supervisor --version" in order[code + 1]
    assert 'u.find_spec(m)]' in order[code + 1] and '"torch", "horovod"' in order[code + 1]
    doctored = text.replace("COPY pyproject.toml /src/",
                            "RUN pip install --no-cache-dir torch==2.13.0\n"
                            "COPY pyproject.toml /src/")
    assert len(_training_stack(_stage_of(doctored, SIDECAR_STAGE))) == 1


def test_the_supervisor_code_comes_after_its_dependencies() -> None:
    # Editing the code reinstalls nothing else: dependencies from pyproject.toml alone first.
    final = _stage_of(DOCKERFILES["launcher"].read_text(), "training")
    order = [ins.args for ins in final if ins.keyword in ("COPY", "RUN")]
    deps = next(i for i, a in enumerate(order) if "requirements.txt" in a)
    code = order.index("supervisor /src/supervisor")
    assert order.index("pyproject.toml /src/") < deps < code
    assert "--no-deps" in order[code + 1]


@pytest.mark.parametrize("path", ["pyproject.toml", "supervisor/cli.py",
                                  "supervisor/data/discover_hosts.sh",
                                  "scripts/build-horovod.sh", "scripts/build-training-venv.sh",
                                  "launcher_image/ssh_config", "worker_image/entrypoint.sh",
                                  "worker_image/sshd_config", "worker_image/train.py",
                                  "sidecar_image/Dockerfile", "trainer_tf_image/Dockerfile"])
def test_the_build_context_keeps(path: str, ignore: list[str]) -> None:
    assert not dockerignore_excludes(ignore, path)


def test_editing_the_readme_rebuilds_no_image(ignore: list[str]) -> None:
    assert dockerignore_excludes(ignore, "README.md")


# ---- localcluster/images.py: what builds the images, its pure parts ------------------------

PAUSE_NAME = "localhost/elastic-supervisor-pause:3.10"


def _members(archive: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                for m in tar.getmembers()}


def test_the_pause_archive_has_the_docker_save_layout() -> None:
    binary = b"\x7fELF pretend static binary"
    members = _members(images.pause_archive(binary, PAUSE_NAME))
    manifest = json.loads(members["manifest.json"][1])
    assert len(manifest) == 1
    entry = manifest[0]
    assert entry["RepoTags"] == [PAUSE_NAME]
    layer_name, = entry["Layers"]
    layer = members[layer_name][1]
    config_bytes = members[entry["Config"]][1]
    # Content addressed: the config named by its digest, the layer by its diff ID.
    assert entry["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    config = json.loads(config_bytes)
    assert config["rootfs"] == {"type": "layers",
                                "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
    assert layer_name == hashlib.sha256(layer).hexdigest() + "/layer.tar"
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert config["config"]["User"] == "65535:65535"
    assert sorted(members) == sorted([layer_name.split("/")[0], layer_name, entry["Config"],
                                      "manifest.json"])
    (info, data), = _members(layer).values()
    assert (info.name, info.mode, info.uid, info.gid, info.mtime) == ("pause", 0o755, 0, 0, 0)
    assert data == binary


def test_the_pause_archive_is_deterministic() -> None:
    one = images.pause_archive(b"binary", PAUSE_NAME)
    assert images.pause_archive(b"binary", PAUSE_NAME) == one
    assert images.pause_archive(b"binary2", PAUSE_NAME) != one
    assert images.pause_archive(b"binary", "localhost/other:1") != one


def test_build_args_with_and_without_a_wheelhouse() -> None:
    assert images.build_args(base_image="b:1", torch_version="2.13.0", wheelhouse=None) == {
        "PYTHON_IMAGE": "b:1", "TORCH_VERSION": "2.13.0"}
    assert images.build_args(base_image="b:1", torch_version="2.13.0",
                             wheelhouse=images.wheelhouse_url(29417),
                             training_image="t:1") == {
        "PYTHON_IMAGE": "b:1", "TORCH_VERSION": "2.13.0",
        "PIP_FIND_LINKS": "http://127.0.0.1:29417/", "PIP_NO_INDEX": "1",
        "TRAINING_IMAGE": "t:1"}


def test_the_docker_build_command_line() -> None:
    argv = images.docker_build_argv(dockerfile="launcher_image/Dockerfile", tag="l:1",
                                    args={"TORCH_VERSION": "2", "PYTHON_IMAGE": "b:1"},
                                    target="training")
    assert argv == ["build", "--network", "host", "--force-rm", "-f", "launcher_image/Dockerfile",
                    "-t", "l:1", "--target", "training", "--build-arg", "PYTHON_IMAGE=b:1",
                    "--build-arg", "TORCH_VERSION=2", "."]


def _declared_args(text: str) -> set[str]:
    return {ins.args.split("=")[0] for ins in parse(text) if ins.keyword == "ARG"}


def test_every_build_arg_passed_is_declared_by_its_dockerfile() -> None:
    # An undeclared one is ignored with a warning: a wheelhouse that silently is not used.
    launcher = images.build_args(base_image=images.BASE_IMAGE, torch_version="2.13.0",
                                 wheelhouse=images.wheelhouse_url(1))
    assert set(launcher) <= _declared_args(DOCKERFILES["launcher"].read_text())
    assert {"TRAINING_IMAGE"} <= _declared_args(DOCKERFILES["worker"].read_text())
    # The final launcher stage installs the supervisor's dependencies: it needs them too.
    final = _stage_of(DOCKERFILES["launcher"].read_text(), "training")
    assert {"PIP_FIND_LINKS", "PIP_NO_INDEX"} <= {i.args for i in final if i.keyword == "ARG"}


def _stages(text: str) -> set[str]:
    return {ins.args.split()[2] for ins in parse(text)
            if ins.keyword == "FROM" and len(ins.args.split()) == 3}


def test_every_build_declares_its_args_and_names_a_stage_that_exists() -> None:
    names = images.image_names("0.1.0")
    args = images.build_args(base_image=images.BASE_IMAGE, torch_version="2.13.0",
                             wheelhouse=images.wheelhouse_url(1))
    tf_args = images.tf_build_args(base_image=images.BASE_IMAGE, tf_version="2.15.1",
                                   wheelhouse=images.wheelhouse_url(1, "tf"))
    steps = images.build_steps(names, args, tf_args)
    assert [s.tag for s in steps] == [names.training, names.launcher, names.trainer,
                                      names.worker, names.sidecar, names.trainer_tf]
    for step in steps:
        text = (ROOT / step.dockerfile).read_text()
        assert set(step.args) <= _declared_args(text), step.tag
        assert step.target is None or step.target in _stages(text), step.tag
    by_tag = {s.tag: s for s in steps}
    # The trainer and the worker start FROM the training image; the sidecar knows no torch.
    assert by_tag[names.worker].args == by_tag[names.trainer].args == {
        "TRAINING_IMAGE": names.training}
    assert by_tag[names.sidecar].args == {"PYTHON_IMAGE": images.BASE_IMAGE,
                                          "PIP_FIND_LINKS": "http://127.0.0.1:1/",
                                          "PIP_NO_INDEX": "1"}
    # The TensorFlow trainer: the base image, its own pin and wheelhouse, no torch.
    assert by_tag[names.trainer_tf].args == {"PYTHON_IMAGE": images.BASE_IMAGE,
                                             "TF_VERSION": "2.15.1",
                                             "PIP_FIND_LINKS": "http://127.0.0.1:1/tf/",
                                             "PIP_NO_INDEX": "1"}
    assert images.tf_build_args(base_image="b:1", tf_version="2.15.1", wheelhouse=None) == {
        "PYTHON_IMAGE": "b:1", "TF_VERSION": "2.15.1"}
    assert by_tag[names.trainer].argv() == [
        "build", "--network", "host", "--force-rm", "-f", "worker_image/Dockerfile", "-t",
        names.trainer, "--target", "trainer", "--build-arg",
        f"TRAINING_IMAGE={names.training}", "."]


NAMES = images.image_names("0.1.0")
BASE_LAYERS = ["sha256:base"]
TRAINING_LAYERS = [*BASE_LAYERS, "sha256:scripts", "sha256:torch", "sha256:horovod"]
TRAINER_LAYERS = [*TRAINING_LAYERS, "sha256:sshd", "sha256:train.py"]
GOOD_LAYERS = {
    NAMES.base: BASE_LAYERS,
    NAMES.training: TRAINING_LAYERS,
    NAMES.launcher: [*TRAINING_LAYERS, "sha256:ssh-client", "sha256:deps", "sha256:code"],
    NAMES.trainer: TRAINER_LAYERS,
    NAMES.worker: [*TRAINER_LAYERS, "sha256:code"],
    NAMES.sidecar: [*BASE_LAYERS, "sha256:user", "sha256:deps", "sha256:code"],
    NAMES.trainer_tf: [*BASE_LAYERS, "sha256:scripts-tf", "sha256:tensorflow",
                       "sha256:horovod-tf", "sha256:sshd-tf"],
}


@pytest.mark.parametrize(("image", "layers", "expected"), [
    pytest.param(None, None, [], id="as built: no problem"),
    pytest.param(NAMES.worker, ["sha256:other-base", *TRAINER_LAYERS[1:], "sha256:code"],
                 [f"{NAMES.worker} does not start with the layers of {NAMES.trainer}: a node "
                  "would store them twice"], id="a worker not built on the trainer"),
    pytest.param(NAMES.trainer, [*BASE_LAYERS, "sha256:torch-again", "sha256:sshd"],
                 [f"{NAMES.trainer} does not start with the layers of {NAMES.training}: a "
                  "node would store them twice",
                  f"{NAMES.worker} does not start with the layers of {NAMES.trainer}: a node "
                  "would store them twice"], id="a trainer not built on the training stage"),
    pytest.param(NAMES.launcher, ["sha256:base", "sha256:torch", "sha256:code"],
                 [f"{NAMES.launcher} does not start with the layers of {NAMES.training}: a "
                  "node would store them twice"], id="a launcher with its own training stack"),
    pytest.param(NAMES.sidecar, [*TRAINING_LAYERS, "sha256:code"],
                 [f"{NAMES.sidecar} holds layers of {NAMES.training}: the sidecar must not "
                  "carry the training stack"], id="a sidecar on the training stage"),
    pytest.param(NAMES.trainer_tf, ["sha256:other-base", "sha256:tensorflow"],
                 [f"{NAMES.trainer_tf} does not start with the layers of {NAMES.base}: a node "
                  "would store them twice"], id="a TensorFlow trainer on another base"),
])
def test_the_layers_of_the_built_images(image: str | None, layers: list[str] | None,
                                        expected: list[str]) -> None:
    built = dict(GOOD_LAYERS)
    if image is not None and layers is not None:
        built[image] = layers
    assert images.layer_problems(NAMES, built) == expected


def test_what_the_trainers_and_the_sidecar_must_not_hold() -> None:
    rules = images.forbidden(NAMES)
    assert set(rules) == {NAMES.trainer, NAMES.trainer_tf, NAMES.sidecar}
    assert rules[NAMES.trainer_tf] == rules[NAMES.trainer]  # nothing of ours in either
    assert {"supervisor", "elastic_supervisor_hook"} <= set(rules[NAMES.trainer].modules)
    assert "elastic-supervisor" in rules[NAMES.trainer].distributions
    assert "elastic_supervisor_hook" in rules[NAMES.trainer].files
    assert {"torch", "horovod"} <= set(rules[NAMES.sidecar].modules)
    assert {"horovodrun", "ssh-keygen", "sshd"} <= set(rules[NAMES.sidecar].files)


def test_the_content_probe_finds_what_an_image_must_not_hold(tmp_path: Path) -> None:
    # The probe itself, run by this venv's python (which has the supervisor installed) on a
    # directory standing for an image's filesystem: what an image's `python` would print.
    (tmp_path / "opt" / "hook" / "elastic_supervisor_hook").mkdir(parents=True)
    (tmp_path / "opt" / "hook" / "sitecustomize.py").write_text("")
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "elastic-supervisor").write_text("")
    wanted = images.Forbidden(modules=("supervisor", "no_such_module_zz"),
                              distributions=("elastic-supervisor", "no-such-dist-zz"),
                              files=("elastic_supervisor_hook", "elastic-supervisor", "horovodrun"))
    argv = images.probe_argv("img:1", wanted, str(tmp_path))
    assert argv[:9] == ["run", "--rm", "--network", "none", "--user", "0", "--entrypoint",
                        "python", "img:1"]
    assert argv[9] == "-c"
    done = subprocess.run([sys.executable, *argv[9:]], capture_output=True, text=True,
                          check=True, timeout=60)
    found = json.loads(done.stdout)
    assert found == {"modules": ["supervisor"], "distributions": ["elastic-supervisor"],
                     "files": [str(tmp_path / "opt" / "hook" / "elastic_supervisor_hook"),
                               str(tmp_path / "usr" / "bin" / "elastic-supervisor")]}
    assert images.content_problem("img:1", found) == (
        "img:1 holds what it must not: module supervisor, distribution elastic-supervisor, "
        f"file {tmp_path}/opt/hook/elastic_supervisor_hook, "
        f"file {tmp_path}/usr/bin/elastic-supervisor")
    clean = images.Forbidden(modules=("no_such_module_zz",), files=("horovodrun",))
    done = subprocess.run([sys.executable, *images.probe_argv("img:1", clean,
                                                                str(tmp_path))[9:]],
                          capture_output=True, text=True, check=True, timeout=60)
    assert images.content_problem("img:1", json.loads(done.stdout)) is None


def test_the_content_probe_is_python_38_code() -> None:
    # It runs under whatever python a training image has.
    ast.parse(images.PROBE, feature_version=(3, 8))


def test_the_wheelhouse_holds_what_the_images_install() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    wanted = images.wheelhouse_requirements(pyproject)
    script = (ROOT / "scripts" / "build-training-venv.sh").read_text()
    for installed in ('"numpy>=1.26,<3"', '"setuptools>=68" wheel cffi cloudpickle packaging '
                      'psutil pyyaml'):
        assert installed in script
        for requirement in installed.replace('"', "").split():
            assert requirement in wanted
    assert "torch==2.13.0" in wanted
    assert set(images.project_dependencies(pyproject)) <= set(wanted)


@pytest.mark.parametrize(("text", "error"), [
    ('name = "x"\n', "no version"),
    ('version = "1"\n', "no \"torch==VERSION\""),
], ids=["no version", "no torch pin"])
def test_pyproject_without_what_the_images_need(text: str, error: str) -> None:
    with pytest.raises(images.ImagesError, match=error):
        images.project_version(text)
        images.torch_pin(text)


def test_the_project_version_and_torch_pin() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = images.project_version(pyproject)
    names = images.image_names(version)
    assert names.launcher == f"elastic-supervisor-launcher:{version}"
    assert names.worker == f"elastic-supervisor-worker:{version}"
    assert names.sidecar == f"elastic-supervisor-sidecar:{version}"
    assert names.trainer == f"elastic-supervisor-trainer:{version}"
    assert names.trainer_tf == f"elastic-supervisor-trainer-tf:{version}"
    assert names.pause == PAUSE_NAME
    assert images.torch_pin(pyproject) == "2.13.0"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_context_files_follow_the_dockerignore(tmp_path: Path, ignore: list[str]) -> None:
    _tree(tmp_path, {f: "x" for f in [
        ".git/HEAD", ".venv/bin/python", "tests/conftest.py", "manifests/base/ssh/id_ed25519",
        "supervisor/cli.py", "supervisor/__pycache__/cli.cpython-311.pyc", "supervisor/data/x.sh",
        "scripts/build-horovod.sh", "scripts/setup.sh", "pyproject.toml", "README.md",
        "worker_image/train.py", "localcluster/images.py"]})
    assert images.context_files(tmp_path, ignore) == [
        "pyproject.toml", "scripts/build-horovod.sh", "supervisor/cli.py",
        "supervisor/data/x.sh", "worker_image/train.py"]


def test_the_tree_digest_sees_content_mode_and_names(tmp_path: Path) -> None:
    _tree(tmp_path, {"a/x.sh": "echo", "b.txt": "b"})
    files = ["a/x.sh", "b.txt"]
    one = images.tree_digest(tmp_path, files)
    assert images.tree_digest(tmp_path, files) == one
    (tmp_path / "a/x.sh").chmod(0o755)
    two = images.tree_digest(tmp_path, files)
    assert two != one
    (tmp_path / "b.txt").write_text("B")
    three = images.tree_digest(tmp_path, files)
    assert three not in (one, two)
    (tmp_path / "b.txt").rename(tmp_path / "c.txt")
    assert images.tree_digest(tmp_path, ["a/x.sh", "c.txt"]) != three


INPUTS = images.Inputs(images.image_names("0.1.0"), "base", "wheels", "tf-wheels", "context",
                       (("t:1", "PYTHON_IMAGE=b:1"),))


@pytest.mark.parametrize("change", [
    {"names": images.image_names("0.2.0")}, {"base_key": "base2"}, {"wheelhouse": "wheels2"},
    {"tf_wheelhouse": "tf-wheels2"}, {"context": "context2"},
    {"args": (("t:1", "PYTHON_IMAGE=b:2"),)},
], ids=["version", "base recipe", "wheelhouse", "TensorFlow wheelhouse", "build context",
        "build args"])
def test_the_archive_key_changes_with_each_input(change: dict[str, object]) -> None:
    assert dataclasses.replace(INPUTS, **change).key != INPUTS.key  # type: ignore[arg-type]
    assert dataclasses.replace(INPUTS).key == INPUTS.key


def test_the_archive_is_named_by_every_tag_and_image_id() -> None:
    ids = {"l:1": "sha256:" + "a" * 64, "w:1": "sha256:" + "b" * 64,
           "s:1": "sha256:" + "c" * 64, "t:1": "sha256:" + "d" * 64}
    name = images.archive_name(ids)
    assert re.fullmatch(r"images-[0-9a-f]{16}\.tar", name)
    assert images.archive_name(dict(reversed(list(ids.items())))) == name  # order: none
    others = [{**ids, "s:1": "sha256:" + "e" * 64}, {**ids, "t:2": ids.pop("t:1")}]
    assert len({name, *(images.archive_name(o) for o in others)}) == 3


# This machine's apt configuration (deb822), plus a third-party source that must stay out.
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""
NODESOURCE = """\
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""
ONE_LINE = """\
# a local mirror
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
"""


def test_apt_sources_in_both_formats() -> None:
    sources = images.parse_apt_sources({"debian.sources": DEBIAN_SOURCES,
                                        "nodesource.sources": NODESOURCE,
                                        "sources.list": ONE_LINE})
    assert sources == [
        images.AptSource("http://deb.debian.org/debian", ("bookworm", "bookworm-updates"),
                         ("main",)),
        images.AptSource("http://deb.debian.org/debian-security", ("bookworm-security",),
                         ("main",)),
        images.AptSource("https://deb.nodesource.com/node_20.x", ("nodistro",), ("main",)),
        images.AptSource("http://mirror.example/debian", ("bookworm",), ("main", "contrib")),
        images.AptSource("https://packages.cloud.google.com/apt", ("cloud-sdk-bookworm",),
                         ("main",)),
    ]


def test_the_base_image_uses_apts_debian_sources_only() -> None:
    sources = images.parse_apt_sources({"debian.sources": DEBIAN_SOURCES,
                                        "nodesource.sources": NODESOURCE})
    mirror, lines = images.debian_sources(sources, "bookworm")
    assert mirror == "http://deb.debian.org/debian"
    assert lines == ["deb http://deb.debian.org/debian bookworm main",
                     "deb http://deb.debian.org/debian bookworm-updates main",
                     "deb http://deb.debian.org/debian-security bookworm-security main"]


def test_no_debian_source_is_a_precise_error() -> None:
    sources = images.parse_apt_sources({"nodesource.sources": NODESOURCE})
    with pytest.raises(images.ImagesError, match="no Debian 'bookworm main' entry"):
        images.debian_sources(sources, "bookworm")


def test_the_base_recipe_key_follows_the_recipe() -> None:
    base = images.BaseRecipe("bookworm", "http://deb.debian.org/debian", ("deb x bookworm main",))
    assert dataclasses.replace(base).key == base.key
    for change in ({"mirror": "http://mirror.example/debian"}, {"packages": ("python3",)},
                   {"sources_list": ()}, {"suite": "trixie"}):
        assert dataclasses.replace(base, **change).key != base.key  # type: ignore[arg-type]
    assert f"LABEL {images.RECIPE_LABEL}={base.key}" in base.docker_changes()


@pytest.mark.parametrize(("suite", "listed", "lines"), [
    pytest.param("trixie", "deb http://mirror.example/debian trixie main\n",
                 ["deb http://mirror.example/debian trixie main"],
                 id="a suite apt names: its own entry"),
    pytest.param("bullseye", "", ["deb http://deb.debian.org/debian bullseye main"],
                 id="a suite apt does not name: the host suite's Debian mirror"),
])
def test_the_hooks_interpreters_come_from_apts_debian_mirror(suite: str, listed: str,
                                                               lines: list[str]) -> None:
    sources = images.parse_apt_sources({"debian.sources": DEBIAN_SOURCES,
                                        "nodesource.sources": NODESOURCE, "x.list": listed})
    recipe = pythons.recipe(suite, sources, "bookworm")
    assert (recipe.suite, list(recipe.sources_list), recipe.packages, recipe.variant) == (
        suite, lines, ("python3", "python3-psutil"), "minbase")
    assert pythons.host_suite('NAME="Debian"\nVERSION_CODENAME=bookworm\n') == "bookworm"
    with pytest.raises(images.ImagesError, match="no VERSION_CODENAME: not a Debian host"):
        pythons.host_suite('NAME="Fedora"\n')


def test_the_hooks_interpreters_run_in_their_own_namespaces_on_a_copy() -> None:
    argv = pythons.run_argv(Path("/cache/pythons/trixie-1"), Path("/tmp/x y/run"),
                            ["python3", "-B", "/tmp/run/t.py"])
    assert argv[:6] == ["unshare", "--mount", "--pid", "--fork",
                        "--mount-proc=/cache/pythons/trixie-1/proc", "--"]
    assert argv[6:8] == ["sh", "-c"]
    assert argv[8] == (
        "mount -t tmpfs -o mode=1777 tmpfs /cache/pythons/trixie-1/tmp && mount --bind /dev "
        "/cache/pythons/trixie-1/dev && cp -r '/tmp/x y/run' /cache/pythons/trixie-1/tmp/ && "
        "exec chroot /cache/pythons/trixie-1 python3 -B /tmp/run/t.py")


def test_dockerd_leaves_the_hosts_network_alone() -> None:
    argv = images.dockerd_argv(Path("/cache/docker"), Path("/run/es-docker"))
    for flag in ("--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                 "--data-root=/cache/docker", "--exec-root=/run/es-docker/exec",
                 "--host=unix:///run/es-docker/docker.sock",
                 f"--cgroup-parent={images.CGROUP_PARENT}"):
        assert flag in argv
    assert argv[:4] == ["setpriv", "--pdeathsig", "TERM", "--"]


@pytest.mark.parametrize(("name", "ref"), [
    ("elastic-supervisor-launcher:0.1.0", "docker.io/library/elastic-supervisor-launcher:0.1.0"),
    ("someone/image:1", "docker.io/someone/image:1"),
    ("localhost/elastic-supervisor-pause:3.10", "localhost/elastic-supervisor-pause:3.10"),
    ("registry.example:5000/team/image:2", "registry.example:5000/team/image:2"),
], ids=["official", "docker hub user", "localhost", "a registry"])
def test_the_reference_containerd_stores(name: str, ref: str) -> None:
    assert images.containerd_ref(name) == ref


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_wheelhouse_server_serves_the_tensorflow_wheelhouse_under_its_mount(
        tmp_path: Path) -> None:
    # Both wheelhouses hold a Horovod wheel of the same file name: each build must see its own.
    wheel = "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    torch, tf = tmp_path / "torch", tmp_path / "tf"
    for directory in (torch, tf):
        directory.mkdir()
        (directory / wheel).write_text(directory.name)
    (tf / "tensorflow_cpu-2.15.1-cp311-cp311-manylinux_2_17_x86_64.whl").write_text("")
    port = free_port()
    assert images.wheelhouse_url(port, images.TF_WHEELHOUSE_PATH) == f"http://127.0.0.1:{port}/tf/"
    with images.WheelhouseServer(torch, port, {images.TF_WHEELHOUSE_PATH: tf}) as server:
        def get(path: str) -> str:
            with urllib.request.urlopen(f"{images.wheelhouse_url(port)}{path}", timeout=10) as r:
                return r.read().decode()
        assert get(wheel) == "torch"
        assert get(f"tf/{wheel}") == "tf"
        assert "tensorflow_cpu" in get("tf/") and "tensorflow_cpu" not in get("")
    assert server.served == [f"/{wheel}", f"/tf/{wheel}", "/tf/", "/"]
