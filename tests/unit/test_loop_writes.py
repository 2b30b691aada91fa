"""The decisions' memory (`decide.memory.Memory`) is written only in decide/: outside it, code may
keep what a decide function returned (`self.core = on.node_seen(self.core, ...)`, the pass's
`p.core`) or what an adapter returned that was handed the memory (its own source is held to
the same rule), but never build a changed copy (`replace(c, ...)`) or make one up
(`Memory(...)`). Checked on the source of every module of `supervisor` outside decide/ (the
loop and its adapters), and shown failing on the loop's writes as they were before decide/on.py."""

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
    """`self.core` (the loop's memory; `st.core` as the loop had it)."""
    return isinstance(target, ast.Attribute) and target.attr == "core" and (
        (isinstance(target.value, ast.Name) and target.value.id in ("self", "st"))
        or (isinstance(target.value, ast.Attribute) and target.value.attr == "state"))


def _decided(value: ast.AST) -> bool:
    """What a decide function returned (`on.listed(...)`, a pass's `p.core`), or what an
    adapter returned that was handed the memory (`self.watches.event(self.core, ...)`: its own
    source is held to the same rule)."""
    if isinstance(value, ast.Attribute):
        return value.attr == "core"
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return False
    of = value.func.value
    return (isinstance(of, ast.Name) and of.id in DECIDERS) or bool(
        value.args and _is_memory(value.args[0]))


def writes(source: str, where: str) -> list[str]:
    """The lines of `source` that write Memory's fields outside decide/: a copy of it changed
    (`replace`), one made up (`Memory(...)`), or the loop's memory set to anything else than
    what decide (or an adapter handed the memory) returned."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                (node.func.id == "replace" and node.args and _mentions_core(node.args[0]))
                or node.func.id == "Memory"):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets
                       for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(_is_memory(t) for t in targets) and not _decided(node.value):
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return out


def test_nothing_outside_decide_writes_a_field_of_the_memory() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        # decide/ writes it; the hook and kube/ (whose clients are `self.core`) never hold it.
        if {"decide", "hook", "kube"} & set(path.relative_to(ROOT).parts):
            continue
        found += writes(path.read_text(), str(path.relative_to(ROOT.parent)))
    assert found == []


@pytest.mark.parametrize("line", [
    pytest.param("st.core = replace(st.core, scale_request=workers)", id="a field replaced"),
    pytest.param("self.state.core = replace(c, expected={})", id="through a local copy"),
    pytest.param("st.core = Memory(fleet=None)", id="a memory made up in the loop"),
    pytest.param("st.core, x = replace(st.core, saved=None), 1", id="in a tuple"),
    pytest.param("self.core = c", id="a memory from elsewhere"),
    pytest.param("self.core = self.watches.event(c, ev)", id="an adapter handed another memory"),
    pytest.param("return Memory(fleet=c.fleet)", id="a memory made up in an adapter"),
    pytest.param("return replace(c, fatal=(4, 'x'))", id="an adapter changing what it was handed"),
])
def test_the_loops_old_writes_are_found(line: str) -> None:
    assert writes(f"def f(st, c):\n    {line}\n", "loop.py") != []


def test_keeping_what_decide_returned_is_not_a_write() -> None:
    assert writes("def f(st, p):\n    st.core = on.node_seen(st.core, 'n', None, 1.0)\n"
                  "    st.core = p.core\n    st.core, f = memory.fail(st.core, 1, 'x')\n"
                  "    self.core = self.watches.event(self.core, ev)\n"
                  "    c, record = on.pod_seen(c, ev, None)\n", "loop.py") == []
