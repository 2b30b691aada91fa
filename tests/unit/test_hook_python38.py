"""The hook stays Python 3.8 code: every file of supervisor/hook (and the stdlib test script that
runs it under Debian's interpreters) parses as 3.8 and uses nothing 3.9 to 3.13 added at run time.

`ast.parse(..., feature_version=(3, 8))` rejects the newer syntax the parser knows to check
(match, except*, parenthesized context managers, type parameters); `newer` adds what it does not
see: relaxed decorators (3.9), `X | Y` and builtin generics evaluated at run time (3.9, 3.10:
fine in annotations under `from __future__ import annotations`, which is then required), and
standard-library names and keywords added since (a list of those the code could reach for).
tests/integration/test_hook_pythons.py runs the hook on real 3.9 and 3.13 interpreters.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from supervisor.hook import HOOK_DIR

ROOT = Path(__file__).resolve().parents[2]
FILES = [*sorted(HOOK_DIR.rglob("*.py")), ROOT / "tests" / "integration" / "hook_unittests.py"]

# name -> the version that added it: methods, module attributes (module.name), modules, builtins
METHODS = {"removeprefix": "3.9", "removesuffix": "3.9", "is_relative_to": "3.9",
           "with_stem": "3.9", "bit_count": "3.10"}
MODULE_NAMES = {("functools", "cache"): "3.9", ("math", "lcm"): "3.9",
                ("random", "randbytes"): "3.9", ("itertools", "pairwise"): "3.10",
                ("itertools", "batched"): "3.12", ("typing", "TypeAlias"): "3.10",
                ("typing", "ParamSpec"): "3.10", ("typing", "TypeGuard"): "3.10",
                ("typing", "Self"): "3.11", ("typing", "Never"): "3.11",
                ("typing", "override"): "3.12", ("typing", "Annotated"): "3.9",
                ("enum", "StrEnum"): "3.11", ("datetime", "UTC"): "3.11",
                ("contextlib", "chdir"): "3.11", ("asyncio", "TaskGroup"): "3.11"}
MODULES = {"zoneinfo": "3.9", "graphlib": "3.9", "tomllib": "3.11"}
BUILTINS = {"aiter": "3.10", "anext": "3.10", "ExceptionGroup": "3.11",
            "BaseExceptionGroup": "3.11", "EncodingWarning": "3.10"}
KEYWORDS = {("zip", "strict"): "3.10", ("dataclass", "slots"): "3.10",
            ("dataclass", "kw_only"): "3.10"}
GENERIC = {"list", "dict", "tuple", "set", "frozenset", "type"}  # subscriptable since 3.9
TYPES = GENERIC | {"int", "str", "float", "bytes", "bool", "object"}


def _dotted(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute)
                                          and _dotted(node.value))


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation."""
    roots: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            roots += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs,
                                             *filter(None, (a.vararg, a.kwarg)))
                      if x.annotation is not None]
            roots += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _typeish(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (
        isinstance(node, ast.Name) and node.id in TYPES) or isinstance(node, ast.Subscript)


def newer(source: str, name: str = "<source>") -> list[str]:
    """What in `source` needs a Python newer than 3.8: one line each (empty: none)."""
    try:
        tree = ast.parse(source, name, feature_version=(3, 8))
    except SyntaxError as e:
        return [f"{name}:{e.lineno}: not Python 3.8 syntax: {e.msg}"]
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in tree.body)
    lazy = _annotations(tree) if future else set()
    found: list[str] = []

    def say(node: ast.AST, what: str, version: str) -> None:
        found.append(f"{name}:{getattr(node, 'lineno', 0)}: {what} needs Python {version}")

    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                if not (_dotted(d) or (isinstance(d, ast.Call) and _dotted(d.func))):
                    say(d, "a decorator that is not a dotted name or a call of one", "3.9")
        elif isinstance(node, ast.Attribute):
            if node.attr in METHODS:
                say(node, f".{node.attr}", METHODS[node.attr])
            if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in MODULE_NAMES:
                say(node, f"{node.value.id}.{node.attr}",
                    MODULE_NAMES[node.value.id, node.attr])
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (node.module, a.name) in MODULE_NAMES:
                    say(node, f"{node.module}.{a.name}", MODULE_NAMES[node.module, a.name])
            if (node.module or "").split(".")[0] in MODULES:
                say(node, f"module {node.module}", MODULES[(node.module or "").split(".")[0]])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in MODULES:
                    say(node, f"module {a.name}", MODULES[a.name.split(".")[0]])
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            say(node, node.id, BUILTINS[node.id])
        elif isinstance(node, ast.Call):
            callee = node.func.id if isinstance(node.func, ast.Name) else (
                node.func.attr if isinstance(node.func, ast.Attribute) else "")
            for k in node.keywords:
                if (callee, k.arg) in KEYWORDS:
                    say(node, f"{callee}({k.arg}=...)", KEYWORDS[callee, k.arg])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id in GENERIC:
            say(node, f"{node.value.id}[...] evaluated at run time", "3.9")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) \
                and (_typeish(node.left) or _typeish(node.right)):
            say(node, "X | Y of types evaluated at run time", "3.10")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_hook_is_python_38_code(path: Path) -> None:
    assert newer(path.read_text(), path.name) == []


def test_every_hook_file_is_checked() -> None:
    names = {p.name for p in FILES}
    assert {"sitecustomize.py", "__init__.py", "driver.py", "watch.py", "wire.py",
            "worker.py", "hook_unittests.py"} <= names


@pytest.mark.parametrize(("source", "needs"), [
    pytest.param("match x:\n    case 1:\n        pass\n", "not Python 3.8 syntax", id="match"),
    pytest.param("with (open(a) as f, open(b) as g):\n    pass\n", "not Python 3.8 syntax",
                 id="parenthesized context managers"),
    pytest.param("try:\n    pass\nexcept* E:\n    pass\n", "not Python 3.8 syntax",
                 id="except star"),
    pytest.param("@buttons[0].clicked.connect\ndef f(): pass\n", "decorator", id="decorator"),
    pytest.param("x = s.removeprefix('a')\n", ".removeprefix needs Python 3.9", id="removeprefix"),
    pytest.param("import functools\n@functools.cache\ndef f(): pass\n", "functools.cache",
                 id="functools.cache"),
    pytest.param("from itertools import pairwise\n", "itertools.pairwise needs Python 3.10",
                 id="pairwise"),
    pytest.param("import tomllib\n", "module tomllib needs Python 3.11", id="tomllib"),
    pytest.param("for a, b in zip(x, y, strict=True): pass\n", "zip(strict=...)",
                 id="zip strict"),
    pytest.param("x = isinstance(v, int | float)\n", "X | Y", id="a union at run time"),
    pytest.param("Alias = dict[str, int]\n", "dict[...] evaluated at run time",
                 id="a builtin generic at run time"),
    pytest.param("def f(x: int | None) -> list[int]: pass\n", "X | Y",
                 id="in annotations without the __future__ import"),
    pytest.param("try:\n    pass\nexcept ExceptionGroup:\n    pass\n", "ExceptionGroup",
                 id="ExceptionGroup"),
])
def test_newer_code_is_found(source: str, needs: str) -> None:
    found = newer(source)
    assert any(needs in line for line in found), found


def test_annotations_are_free_under_the_future_import() -> None:
    source = ("from __future__ import annotations\n"
              "def f(x: int | None, *a: dict[str, int]) -> list[int] | None:\n"
              "    y: tuple[int, ...] = ()\n    return None\n")
    assert newer(source) == []
    assert newer(source.replace("    return None", "    return isinstance(x, int | None)"))
