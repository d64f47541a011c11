"""The package's import graph has no cycles (scripts/import_cycles.py, a CI check), and the check
itself finds a cycle however its imports are written."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_cycles.py"


def _run(src: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True, timeout=120
    )


def _cycles(stdout: str) -> set[tuple[str, ...]]:
    prefix = "import cycle among "
    return {
        tuple(line.split(": ", 1)[1].split(", ")) for line in stdout.splitlines() if line.startswith(prefix)
    }


def test_the_package_has_no_import_cycles():
    res = _run(ROOT / "src")
    assert not _cycles(res.stdout) and res.returncode == 0, res.stdout + res.stderr


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_lazy_or_relative_import_closes_a_cycle(tmp_path):
    src = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "def f():\n    from .. import c  # lazy and relative\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg import a\n",  # imports into the cycle, is not part of it
        },
    )
    res = _run(src)
    assert res.returncode == 1
    assert _cycles(res.stdout) == {("pkg.a", "pkg.c", "pkg.sub.b")}, res.stdout
    assert "pkg.sub.b -> pkg.c" in res.stdout


def test_an_acyclic_tree_passes(tmp_path):
    src = _tree(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import os\n"}
    )
    res = _run(src)
    assert res.returncode == 0 and "0 import cycle(s)" in res.stdout, res.stdout
