import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build of torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(*args, cwd=ROOT, timeout=900, env=None):
    """Run `python -m mini_kv ...` and return the CompletedProcess (text)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mini_kv", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def fuzz_project(tmp_path_factory):
    """For tests/fuzz: a project holding the shipped cards' candidates; fuzzed cards are written into it.
    (Here, not in a tests/fuzz/conftest.py: two modules named `conftest` would shadow each other.)"""
    from fuzz_helpers import card_project

    return card_project(tmp_path_factory.mktemp("fuzz-project"))
