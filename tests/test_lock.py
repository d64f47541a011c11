"""uv.lock matches pyproject.toml. uv is a dev dependency, so this runs wherever the tests do (CI used to
skip the check where uv was not installed)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_uv_lock_matches_pyproject():
    from uv import find_uv_bin

    res = subprocess.run(
        [find_uv_bin(), "lock", "--check", "--offline"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
