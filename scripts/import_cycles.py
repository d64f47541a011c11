#!/usr/bin/env python3
"""CI check: no import cycles among the package's modules. An import inside a function counts too: a
lazy import hides a cycle from the interpreter, not from the design. Prints every cycle (a strongly
connected component of the import graph) and exits 1 when there is one.

    python scripts/import_cycles.py [SRC_DIR]   (default: src)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `root` (a package's name for its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(name: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement of module `name` (file `path`) may refer to."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (and the packages above them,
    whose __init__ runs first)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _imported(name, path, node):
                parts = target.split(".")
                graph[name].update(
                    p
                    for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                    if p in mods and p != name and not name.startswith(p + ".")
                )
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "src")
    graph = import_graph(modules(root))
    found = cycles(graph)
    for comp in found:
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]
        print(f"import cycle among {len(comp)} modules: {', '.join(comp)}\n  " + "\n  ".join(edges))
    print(f"{len(graph)} modules, {len(found)} import cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
