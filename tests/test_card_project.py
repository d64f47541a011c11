"""A task card run from outside its project: its candidate dirs resolve inside the card's project, and
its `module:function` references may name modules of that project, importable from its root wherever
the command runs (in the loader and in the worker alike)."""

import shutil
from pathlib import Path

import pytest
from build_helpers import share_build_cache

from mini_kv.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
REFS = "from mini_kv.references.vector_add import make_inputs, reference  # noqa: F401\n"


@pytest.fixture
def project(tmp_path) -> Path:
    """A project of its own: a card whose reference module lives in the project, not in mini_kv."""
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "candidates" / "vector_add", proj / "candidates" / "vector_add")
    (proj / ".mini-kv-project").touch()
    (proj / "my_vector_add_refs.py").write_text(REFS)
    card = (ROOT / "tasks" / "vector_add.yaml").read_text()
    card = card.replace("mini_kv.references.vector_add:", "my_vector_add_refs:")
    (proj / "tasks").mkdir()
    (proj / "tasks" / "my.yaml").write_text(card)
    (tmp_path / "elsewhere").mkdir()
    return share_build_cache(proj)  # the candidate is the shipped v0_naive: its build is shared


def test_card_with_project_module_validates_from_elsewhere(cli, project):
    res = cli("validate-task", str(project / "tasks" / "my.yaml"), cwd=project.parent / "elsewhere")
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr


@pytest.mark.slow
def test_card_with_project_module_verifies_from_elsewhere(cli, project):
    elsewhere = project.parent / "elsewhere"
    res = cli(
        "verify",
        "--task",
        str(project / "tasks" / "my.yaml"),
        "--candidate",
        "v0_naive",
        "--device",
        "cpu",
        "--skip-benchmark",
        "--case",
        "n33",
        "--case",
        "shape_mismatch",
        cwd=elsewhere,
    )
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert (project / "artifacts" / "vector_add").is_dir() and (project / ".build").is_dir()
    assert list(elsewhere.iterdir()) == []
