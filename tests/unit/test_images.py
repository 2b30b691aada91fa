"""The two Dockerfiles and the build context, read as text (Docker is not needed).

What hadolint (tests/integration/test_images.py) cannot know about this repository: base images
pinned once build ARGs are resolved, every COPY source present and not dropped by .dockerignore,
ENTRYPOINT/CMD in exec form, a non-root USER in the final stage, the launcher's entrypoint, the
same training stack in both images as in pyproject.toml, and a build context that keeps .git,
.venv and the job's ssh keys out. Each check is also fed a doctored Dockerfile, so it can fail.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"launcher": ROOT / "launcher_image" / "Dockerfile",
               "worker": ROOT / "worker_image" / "Dockerfile"}
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


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Return whether Docker leaves `path` (relative, '/'-separated) out of the build context.

    Docker's rules: patterns in order, the last one matching the path or one of its parent
    directories wins; `!` re-includes; `*` and `?` stay within one path segment, `**` spans any.
    """
    parents = [path] + ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = raw.removeprefix("!").strip().strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, p) for p in parents):
            excluded = not negated
    return excluded


def dockerignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


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
    ("a latest base image", "worker", "ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm",
     "ARG PYTHON_IMAGE=python:latest", "FROM python:latest: pin"),
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
    # Horovod needs the same versions on the launcher and every worker: the worker copies the
    # launcher's /opt/venv (this version's image), on the same Python image.
    launcher, worker = (DOCKERFILES[role].read_text() for role in ("launcher", "worker"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', pyproject, re.M)
    assert version is not None
    assert build_arg(worker, "LAUNCHER_IMAGE") == f"elastic-supervisor-launcher:{version[1]}"
    assert "FROM ${LAUNCHER_IMAGE} AS training" in worker
    assert "COPY --from=training /opt/venv /opt/venv" in worker
    assert build_arg(worker, "PYTHON_IMAGE") == build_arg(launcher, "PYTHON_IMAGE") is not None
    assert "RUN /src/scripts/build-training-venv.sh /opt/venv" in launcher
    torch_pin = re.search(r'"torch==([^"]+)"', pyproject)
    script = (ROOT / "scripts" / "build-training-venv.sh").read_text()
    default = re.search(r"^torch_version=\$\{TORCH_VERSION:-(.+)\}$", script, re.M)
    assert torch_pin is not None and default is not None
    assert default[1] == torch_pin[1]
