"""The decisions' memory (`decide.memory.Core`) is written only in decide/: outside it, code may
keep what a decide function returned (`st.core = on.node_seen(st.core, ...)`, the pass's
`p.core`) but never build a changed copy itself (`replace(st.core, ...)`). Checked on the source
of every module of `supervisor` outside decide/ (the loop, mainly), and shown failing on the
loop's writes as they were before decide/on.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "supervisor"
DECIDERS = {"on", "core", "memory"}  # modules of decide/ whose functions return the memory


def _mentions_core(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr == "core")
               or (isinstance(n, ast.Name) and n.id == "c") for n in ast.walk(node))


def _is_memory(target: ast.AST) -> bool:
    """`st.core` or `self.state.core`: the loop's memory (kube's `self.core` is a client)."""
    return isinstance(target, ast.Attribute) and target.attr == "core" and (
        (isinstance(target.value, ast.Name) and target.value.id == "st")
        or (isinstance(target.value, ast.Attribute) and target.value.attr == "state"))


def writes(source: str, where: str) -> list[str]:
    """The lines of `source` that write Core's fields outside decide/."""
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "replace" and node.args and _mentions_core(node.args[0]):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets
                       for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if not any(_is_memory(t) for t in targets):
                continue
            value = node.value
            decided = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                       and isinstance(value.func.value, ast.Name)
                       and value.func.value.id in DECIDERS) or (
                isinstance(value, ast.Attribute) and value.attr == "core")
            if not decided:
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return out


def test_nothing_outside_decide_writes_a_field_of_the_memory() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "decide" in path.relative_to(ROOT).parts or "hook" in path.relative_to(ROOT).parts:
            continue
        found += writes(path.read_text(), str(path.relative_to(ROOT.parent)))
    assert found == []


@pytest.mark.parametrize("line", [
    pytest.param("st.core = replace(st.core, scale_request=workers)", id="a field replaced"),
    pytest.param("self.state.core = replace(c, expected={})", id="through a local copy"),
    pytest.param("st.core = Core(fleet=None)", id="a memory made up in the loop"),
    pytest.param("st.core, x = replace(st.core, saved=None), 1", id="in a tuple"),
])
def test_the_loops_old_writes_are_found(line: str) -> None:
    assert writes(f"def f(st, c):\n    {line}\n", "reconcile.py") != []


def test_keeping_what_decide_returned_is_not_a_write() -> None:
    assert writes("def f(st, p):\n    st.core = on.node_seen(st.core, 'n', None, 1.0)\n"
                  "    st.core = p.core\n    st.core, f = memory.fail(st.core, 1, 'x')\n",
                  "reconcile.py") == []
