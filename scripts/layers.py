"""`python scripts/layers.py [ROOT]`: the import contract of `supervisor/decide/` (make lint).

The decisions are pure: nothing that `supervisor.decide` imports, directly or through other
modules of the package `supervisor`, may
- import an adapter module (ADAPTERS: the Kubernetes client's wrapper, the actuator, the hook
  channel and the hook, processes, the sidecar link, leader election, metrics, logs, the loop,
  the CLI), or
- import what does I/O, reads a clock or runs concurrently (FORBIDDEN: os, socket, threading,
  time, subprocess, ...; the Kubernetes client, structlog, prometheus_client, yaml), or
- call open() or read the wall clock (`datetime.now()` and the like).

The graph is read from the source (ast), so the check needs none of the modules to import:
`import a.b.c` and `from a.b import c` reach a.b.c and its parent packages' __init__, as Python
does. Imports under `if TYPE_CHECKING:` are annotations only and do not count. Each violation
is one line naming the file, the line, the chain from a decide module and what it reached;
exit 1 when there is any, 0 when the contract holds.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "supervisor"
DECIDE = "supervisor.decide"
ADAPTERS = frozenset({
    "supervisor.actuator", "supervisor.carry", "supervisor.channel", "supervisor.cli",
    "supervisor.cleanup", "supervisor.datagrams", "supervisor.hook", "supervisor.horovodrun",
    "supervisor.hostfile", "supervisor.keeper", "supervisor.kube", "supervisor.launch",
    "supervisor.leader", "supervisor.logs", "supervisor.loop", "supervisor.metrics",
    "supervisor.nodeleases", "supervisor.operate", "supervisor.outcomes", "supervisor.proc",
    "supervisor.reload", "supervisor.reports", "supervisor.runner", "supervisor.sidecar",
    "supervisor.startup", "supervisor.watches",
})
FORBIDDEN = frozenset({
    "os", "socket", "threading", "time", "subprocess", "signal", "select", "selectors",
    "asyncio", "multiprocessing", "concurrent", "tempfile", "shutil", "io", "http", "urllib",
    "importlib", "random", "kubernetes", "urllib3", "structlog", "prometheus_client", "yaml",
})
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "monotonic", "perf_counter"})


@dataclass(frozen=True)
class Edge:
    target: str  # a module of the package, or the top-level name of any other
    line: int


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    edges: tuple[Edge, ...]
    calls: tuple[tuple[str, int], ...]  # (what, line) of open() and clock reads


def modules(root: Path) -> dict[str, Module]:
    """Every module of PACKAGE under `root` (the repository), by dotted name."""
    found: dict[str, Module] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        tree = ast.parse(path.read_text(), str(path))
        found[name] = Module(name, path, tuple(_edges(tree, name, path.name == "__init__.py")),
                             tuple(_calls(tree)))
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def _edges(tree: ast.AST, name: str, package: bool) -> Iterator[Edge]:
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield Edge(module, node.lineno)
            for alias in node.names:  # `from pkg import mod` reaches pkg.mod where it is one
                yield Edge(f"{module}.{alias.name}", node.lineno)


def _calls(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                yield "open()", node.lineno
            elif isinstance(f, ast.Attribute) and f.attr in CLOCK_CALLS:
                yield f".{f.attr}()", node.lineno


def _reached(edge: str, known: dict[str, Module]) -> list[str]:
    """The modules of the package an import of `edge` runs: it and its parent packages."""
    parts = edge.split(".")
    return [m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in known]


def violations(root: Path) -> list[str]:
    """One line per violation of the contract; empty when it holds."""
    known = modules(root)
    out: list[str] = []
    starts = [n for n in known if n == DECIDE or n.startswith(DECIDE + ".")]
    chain: dict[str, list[str]] = {n: [n] for n in starts}
    todo = list(starts)
    while todo:
        name = todo.pop(0)
        mod = known[name]
        via = " -> ".join(chain[name])
        rel = mod.path.relative_to(root)
        seen_external: set[tuple[int, str]] = set()
        seen_adapters: set[tuple[int, str]] = set()
        for what, line in mod.calls:
            out.append(f"{rel}:{line}: {via} calls {what}: decide/ reads no clock and opens "
                       "no file (scripts/layers.py)")
        for edge in mod.edges:
            top = edge.target.split(".")[0]
            if top != PACKAGE:
                if top in FORBIDDEN and (edge.line, top) not in seen_external:
                    seen_external.add((edge.line, top))
                    out.append(f"{rel}:{edge.line}: {via} imports {edge.target}: decide/ does no "
                               "I/O, reads no clock and runs no thread (scripts/layers.py)")
                continue
            for target in _reached(edge.target, known):
                adapter = next((a for a in ADAPTERS
                                if target == a or target.startswith(a + ".")), None)
                if adapter is not None and (edge.line, adapter) in seen_adapters:
                    break
                if adapter is not None:  # said once per import and adapter
                    seen_adapters.add((edge.line, adapter))
                    out.append(f"{rel}:{edge.line}: {via} imports {edge.target}, an adapter "
                               f"({adapter}): decide/ imports no adapter (scripts/layers.py)")
                    break
                if target not in chain:
                    chain[target] = [*chain[name], target]
                    todo.append(target)
    return sorted(set(out))


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = violations(root)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(f"scripts/layers.py: {len(found)} violation(s) of decide/'s import contract",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
