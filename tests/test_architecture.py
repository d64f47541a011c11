"""The package keeps its layers and has no import cycle: the import-linter contracts in pyproject.toml
hold (CI runs `lint-imports` too), and the cycle contract sees an import inside a function, which hides
a cycle from the interpreter, not from the design. And every module imports the names of mini_kv's it
names, which the contracts cannot check."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def _lint(cwd: Path, pythonpath: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [*LINT, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_package_keeps_its_layers_and_has_no_cycle():
    res = _lint(ROOT, ROOT / "src")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 2 kept, 0 broken." in res.stdout, res.stdout


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


CYCLE_CONTRACT = """[importlinter]
root_package = pkg

[importlinter:contract:acyclic]
name = acyclic
type = acyclic_siblings
ancestors = pkg
"""


def test_a_lazy_relative_import_that_closes_a_cycle_breaks_the_contract(tmp_path):
    files = {
        ".importlinter": CYCLE_CONTRACT,
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from .. import c  # lazy and relative\n",
        "pkg/c.py": "import pkg.a\n",
    }
    res = _lint(_tree(tmp_path, files), tmp_path)
    assert res.returncode == 1 and "BROKEN" in res.stdout, res.stdout + res.stderr
    # without the lazy import the same tree passes: it is what closed the cycle
    (tmp_path / "pkg/sub/b.py").write_text("def f():\n    pass\n")
    res = _lint(tmp_path, tmp_path)
    assert res.returncode == 0 and "KEPT" in res.stdout, res.stdout + res.stderr


IMPORT_ALL = """
import importlib, pkgutil, sys
import mini_kv
bad = []
for m in pkgutil.walk_packages(mini_kv.__path__, "mini_kv."):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except ImportError as exc:
        # a missing optional package (dask, triton, ...) is the machine's; a missing name of mini_kv's is a bug
        if (getattr(exc, "name", None) or "").startswith("mini_kv") or "mini_kv" in str(exc):
            bad.append(f"{m.name}: {exc}")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_module_imports_what_mini_kv_names():
    """An import of a moved or renamed name of mini_kv's is not an edge the contracts can see (the
    package exists, the name does not): import every module, as the worker and the CLI would."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr


# a `name.attr` in the docs that is a record's field or a file, not code, though its first part is also
# the name of one of mini_kv's modules
DOC_FIELDS = {"manifest.attempt_files"}
FILE_SUFFIXES = {
    "py",
    "json",
    "jsonl",
    "sqlite",
    "html",
    "ninja",
    "rep",
    "toml",
    "txt",
    "csv",
    "h",
    "cu",
    "cpp",
}


def _resolves(modules: list[str], attr: str) -> bool:
    import importlib

    for name in modules:
        try:
            obj = importlib.import_module(name)
            for part in attr.split("."):
                obj = (
                    getattr(obj, part)
                    if hasattr(obj, part)
                    else importlib.import_module(f"{obj.__name__}.{part}")
                )
            return True
        except (ImportError, AttributeError):
            continue
    return False


def test_the_docs_name_only_code_that_exists():
    """A `module.name` in docs/ whose module is one of mini_kv's (by its last part: `engine.post_check`,
    `remote.RemoteWorkload`) names something that module has: a page that still names a function
    after it moved sends its reader nowhere. (A module that is gone altogether is not seen: its name is
    then no module's, like a record's field; five such names of merged modules were in integrity.md.)"""
    import pkgutil
    import re

    import mini_kv

    modules: dict[str, list[str]] = {}
    for m in pkgutil.walk_packages(mini_kv.__path__, "mini_kv."):
        modules.setdefault(m.name.rsplit(".", 1)[-1], []).append(m.name)
    stale = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for ref in re.finditer(r"`([a-z_]+)\.([A-Za-z_][A-Za-z_0-9.]*)`", text):
            mod, attr = ref.groups()
            if mod not in modules or attr.rsplit(".", 1)[-1] in FILE_SUFFIXES or ref[0][1:-1] in DOC_FIELDS:
                continue
            if not _resolves(modules[mod], attr):
                stale.append(f"{page.relative_to(ROOT)}:{text[: ref.start()].count(chr(10)) + 1}: {ref[0]}")
    assert not stale, "\n".join(stale)


def test_every_class_name_is_defined_once():
    """One class per name across the package: two records called `Workload` (a SOL workload, and the
    input sets timing rotates through) sent a reader of one to the other."""
    import ast

    where: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "mini_kv").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, twice


def test_the_bench_front_door_leaves_torch_to_the_children():
    """`bench` starts its judge and subject (each imports torch, 3.6 s of CPU on a 2-core machine)
    before this process needs torch: a module of the front door that imported it (the trace format
    took a record from worker/formats.py, which imports torch) put a whole torch import before the
    children's start, serially (10.2 s against 7.9 s for one `bench` here). The statistics module is
    torch-free too. Checked in a fresh interpreter: other tests in the session import torch."""
    code = (
        "import sys, mini_kv.cli, mini_kv.cli_bench, mini_kv.cli_batch, mini_kv.solexec.run, "
        "mini_kv.solexec.traces, mini_kv.pipeline, mini_kv.runner, mini_kv.stats; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
