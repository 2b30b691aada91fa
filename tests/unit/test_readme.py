"""The env-var reference (docs/env-vars.md) is the code's: generated from supervisor/config.py."""

from __future__ import annotations

from pathlib import Path

from supervisor.config import PREFIX, VARIABLES, reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ENV_VARS = DOCS / "env-vars.md"


def test_the_committed_env_reference_is_the_generated_one() -> None:
    assert ENV_VARS.read_text() == reference(), (
        "docs/env-vars.md differs from supervisor/config.py's VARIABLES: regenerate it with "
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
