"""Where `bench` keeps its attempts and builds when it runs outside the project: in the project of the
working directory, else of the solution, and never in a store made in whatever directory it runs in."""

import shutil
from pathlib import Path

import pytest

from mini_kv.errors import ConfigError
from mini_kv.load.task_card import project_root_of
from mini_kv.solexec.run import BenchOptions, bench

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"
FAST = {"device": "cpu", "rounds": 1, "warmup": 0, "repeats": 1, "samples": 2, "timeout": 120.0}


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A working directory in no project."""
    if project_root_of(tmp_path) is not None:
        pytest.skip(f"{tmp_path} is inside a project here")
    d = tmp_path / "elsewhere"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def _solution(folder: Path) -> Path:
    shutil.copytree(SOLS / "good_dps", folder)
    return folder / "solution.json"


def test_bench_outside_any_project_is_a_config_error(tmp_path, elsewhere):
    sol = _solution(tmp_path / "loose" / "good_dps")
    with pytest.raises(ConfigError) as err:
        bench(str(SOLS / "problem"), BenchOptions(solution=str(sol), **FAST))
    assert err.value.file == str(sol)
    assert "inside a project" in str(err.value) and ".mini-kv-project" in str(err.value)
    assert list(elsewhere.iterdir()) == []  # no store made here


def test_bench_from_elsewhere_stores_in_the_solution_project(tmp_path, elsewhere):
    project = tmp_path / "proj"
    sol = _solution(project / "solutions" / "good_dps")
    (project / ".mini-kv-project").touch()
    result = bench(str(SOLS / "problem"), BenchOptions(solution=str(sol), **FAST))
    assert result.exit_code == 0
    assert Path(result.attempt).is_relative_to(project / "artifacts")
    assert list(elsewhere.iterdir()) == []


def test_python_solution_with_artifacts_needs_no_project(tmp_path, elsewhere):
    sol = _solution(tmp_path / "loose" / "good_dps")
    result = bench(
        str(SOLS / "problem"), BenchOptions(solution=str(sol), artifacts=str(tmp_path / "store"), **FAST)
    )
    assert result.exit_code == 0 and Path(result.attempt).is_relative_to(tmp_path / "store")
