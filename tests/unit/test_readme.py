"""The README's env-var table is the code's: every variable, default and meaning, nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.config import PREFIX, VARIABLES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_env_table_matches_the_variables_the_supervisor_knows() -> None:
    text = README.read_text()
    table = text.split("<!-- env-table:")[1].split("<!-- /env-table -->")[0]
    rows = re.findall(r"^\| `(SUPERVISOR_[A-Z_]+)` \| (.*?) \| (.*) \|$", table, re.M)
    documented = {name: (default, meaning) for name, default, meaning in rows}
    expected = {
        f"{PREFIX}{v.name}": (f"`{v.default}`" if v.default else "-", v.meaning)
        for v in VARIABLES
    }
    assert documented == expected
