"""The built package is complete: a wheel carries every data file mini_kv reads at run time (the JSON
Schemas), and an installed mini_kv works from any directory, with nothing of the checkout on its path."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mini_kv.errors import ExitCode, UserError
from mini_kv.load import schema

ROOT = Path(__file__).resolve().parents[1]
# what a build reads: the package sources and the packaging files
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "src", "schemas")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout (a build in place would leave build/ behind)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in BUILD_INPUTS:
        src = ROOT / name
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, tree / name)
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (found,) = out.glob("mini_kv-*.whl")
    return found


@pytest.mark.slow
def test_wheel_carries_every_schema(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"mini_kv/schemas/{p.name}" for p in (ROOT / "schemas").glob("*.schema.json")}
    assert expected and expected <= names, sorted(expected - names)


@pytest.mark.slow
def test_wheel_carries_the_report_template(wheel):
    """`mini-kv report` renders through a Jinja2 template that is package data, not code."""
    assert "mini_kv/html_report/templates/report.html.j2" in zipfile.ZipFile(wheel).namelist()


@pytest.mark.slow
def test_installed_wheel_validates_a_card_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # only the installed package: not the checkout's src/ (PYTHONPATH) nor, first on the path, an editable install
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import mini_kv; print(mini_kv.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    card = ROOT / "tasks" / "vector_add.yaml"
    res = subprocess.run(
        [sys.executable, "-m", "mini_kv", "validate-task", str(card)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert f"{card}: ok" in res.stdout.replace("\n", "")


def test_missing_schema_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(schema, "CHECKOUT_SCHEMA_DIR", tmp_path)
    schema.load_schema.cache_clear()
    try:
        with pytest.raises(UserError) as err:
            schema.load_schema("task_card")
    finally:
        schema.load_schema.cache_clear()
    assert err.value.exit_code == ExitCode.CONFIG
    assert "task_card.schema.json is missing" in str(err.value) and str(tmp_path) in str(err.value)
