"""The README and docs/ say what the code does: the env-var reference is generated from
supervisor/config/, the README stays short and names the commands CI runs, links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.config import PREFIX, VARIABLES, reference
from supervisor.model import ExitCode

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ENV_VARS = DOCS / "env-vars.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_committed_env_reference_is_the_generated_one() -> None:
    assert ENV_VARS.read_text() == reference(), (
        "docs/env-vars.md differs from supervisor/config/'s VARIABLES: regenerate it with "
        "`make docs` and commit it")


def test_the_env_reference_has_one_row_per_variable_with_its_default_and_meaning() -> None:
    rows = [line for line in reference().splitlines() if line.startswith("| `")]
    cells = [line.split(" | ") for line in rows]
    assert all(len(c) == 3 for c in cells), "a meaning or default holds ' | ': the table breaks"
    documented = {name.strip("| `"): (default, meaning.removesuffix(" |"))
                  for name, default, meaning in cells}
    expected = {
        f"{PREFIX}{v.name}": (f"`{v.default}`" if v.default else "-", v.meaning)
        for v in VARIABLES
    }
    assert documented == expected


def test_the_readme_is_read_in_ten_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines < 300, f"README.md has {lines} lines: move the depth to docs/"


def _quick_start() -> str:
    text = README.read_text()
    return text.split("## Quick start")[1].split("```sh")[1].split("```")[0]


def test_the_quick_start_commands_are_make_targets() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    commands = re.findall(r"^make (\S+)", _quick_start(), re.M)
    assert {"demo", "test", "setup"} <= set(commands)
    assert set(commands) <= targets


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test"
    assert re.search(r"^make test\b", _quick_start(), re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


PAGES = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_of_the_page_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md"
                                 and anchor not in _anchors(file)):
            broken.append(target)
    assert broken == []


def test_the_readme_maps_every_page_of_docs() -> None:
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(README.read_text())
              if t.startswith("docs/")}
    assert linked == {p.name for p in DOCS.glob("*.md")}


def layout_rows(text: str) -> list[list[str]]:
    """The rows of README's Layout table (cells stripped), its header left out."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")][2:]


def long_cells(rows: list[list[str]]) -> list[str]:
    """The start of every cell over 200 characters."""
    return [cell[:40] for row in rows for cell in row if len(cell) > 200]


def test_the_layout_names_every_package_of_the_product_in_short_cells() -> None:
    rows = layout_rows(README.read_text())
    assert long_cells(rows) == []
    named = " ".join(row[0] for row in rows)
    packages = sorted(p.name for p in (ROOT / "supervisor").iterdir()
                      if (p / "__init__.py").exists())
    assert [p for p in packages
            if f"supervisor/{p}/`" not in named and f"`{p}/`" not in named] == []


def test_the_architecture_page_puts_every_module_of_the_product_in_a_layer() -> None:
    page = (DOCS / "architecture.md").read_text()
    layers = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    modules = sorted(p.name for p in (ROOT / "supervisor").glob("*.py")
                     if p.stem not in ("__init__", "__main__"))
    assert [m for m in modules if f"`{m}`" not in layers] == []


def test_the_layout_check_fails_on_a_long_cell_and_reads_the_rows() -> None:
    text = ("\n## Layout\n\n| path | what |\n| --- | --- |\n| `a.py` | " + "x" * 201
            + " |\n## Next\n")
    rows = layout_rows(text)
    assert rows[0][0] == "`a.py`" and long_cells(rows) == ["x" * 40]
    assert long_cells(layout_rows(text.replace("x" * 201, "x" * 200))) == []


def test_the_slug_follows_github() -> None:
    assert _slug("`status` and `scale`") == "status-and-scale"
    assert _slug("The launcher's node lost") == "the-launchers-node-lost"
    assert _slug("Setup (`make setup`)") == "setup-make-setup"


MANIFESTS = ROOT / "manifests"


def _prose(path: Path) -> str:
    """The text of a page, or of a manifest's comments, as one line (sentences span lines)."""
    text = path.read_text()
    if path.suffix == ".yaml":
        text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return " ".join(text.split())


PAGES = sorted([README, *DOCS.glob("*.md"), *MANIFESTS.rglob("*.yaml")])
# A stall past the restart limit, in the words the pages use: "... RESTART_LIMIT times (then
# exit N)", "after ... RESTART_LIMIT restarts the job fails with exit N".
STALL_EXIT = re.compile(r"HOROVODRUN_RESTART_LIMIT`?(?: times| restarts)[^.;]*?\bexit (\d+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_stall_past_the_restart_limit_exits_with_the_code_the_code_uses(page: Path) -> None:
    said = [int(n) for n in STALL_EXIT.findall(_prose(page))]
    assert all(n == ExitCode.STALLED for n in said), (
        f"{page.relative_to(ROOT)} says a stall past the limit exits {said}; the supervisor "
        f"exits {int(ExitCode.STALLED)} (supervisor.model.ExitCode.STALLED)")


# The launcher Job's legend of its podFailurePolicy codes ("2 = bad configuration, ...").
LEGEND = [
    ("bad configuration", ExitCode.CONFIG),
    ("start timeout", ExitCode.START_TIMEOUT),
    ("the API refused for good", ExitCode.KUBE_FATAL),
    ("a FailJob rule matched", ExitCode.POLICY_FAILED),
    ("too few workers left", ExitCode.WORKERS_LOST),
    ("another launcher holds the leader Lease", ExitCode.LEADERSHIP_LOST),
    ("horovodrun's driver cannot be hardened", ExitCode.HOOK_REFUSED),
    ("training stalled again", ExitCode.STALLED),
]


@pytest.mark.parametrize(("meaning", "code"), LEGEND, ids=[m for m, _ in LEGEND])
def test_the_launcher_jobs_legend_of_exit_codes_is_the_codes(meaning: str,
                                                             code: ExitCode) -> None:
    text = _prose(MANIFESTS / "base" / "launcher-job.yaml")
    said = re.findall(rf"\b(\d+) (?:= |\(){re.escape(meaning)}", text)
    assert said == [str(int(code))], f"launcher-job.yaml: {meaning!r} is exit {said}"
