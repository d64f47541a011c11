"""Every attempt records the git commit of the candidate's project and whether its tree was dirty
(attempt.json `source`, schemas/attempt.schema.json), and `attempts list`, the leaderboard and the
report show it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv.environment import SourceRevision, source_revision
from mini_kv.html_report.collect import load_store
from mini_kv.leaderboard import rich_tables
from mini_kv.solexec.run import BenchOptions, bench
from mini_kv.store.attempts import read_attempt

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "sol_solutions" / "problem"
FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "repeats": 1, "samples": 3}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **env}
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    (repo / "sol").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "sol_solutions" / "good_return" / "solution.json", repo / "sol")
    (repo / ".gitignore").write_text("artifacts/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a solution")
    return repo


def test_source_revision_says_the_commit_and_whether_the_tree_differs(repo, tmp_path):
    head = _git(repo, "rev-parse", "HEAD")
    assert source_revision(repo / "sol") == SourceRevision(head, False)
    (repo / "artifacts").mkdir()
    (repo / "artifacts" / "x").write_text("ignored")  # a file git ignores leaves the tree clean
    assert source_revision(repo / "sol" / "solution.json") == SourceRevision(head, False)
    (repo / "sol" / "notes.txt").write_text("new")  # a new file it does not ignore: dirty
    assert source_revision(repo / "sol") == SourceRevision(head, True)
    (repo / "sol" / "notes.txt").unlink()
    (repo / ".gitignore").write_text("changed\n")  # a changed tracked file: dirty
    assert source_revision(repo).dirty is True
    outside = tmp_path / "plain"
    outside.mkdir()
    assert source_revision(outside) is None and source_revision(None) is None


def test_an_attempt_records_the_commit_and_attempts_list_shows_it(repo):
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "sol" / "draft.py").write_text("# not committed\n")
    store = repo / "artifacts"
    opts = BenchOptions(solution=str(repo / "sol" / "solution.json"), artifacts=str(store), **FAST)
    attempt = Path(bench(str(PROBLEM), opts).attempt)
    header = read_attempt(attempt)  # valid against schemas/attempt.schema.json
    assert header["source"] == {"commit": head, "dirty": True}
    listed = run_cli("attempts", "list", "--artifacts", str(store), "--json")
    (row,) = json.loads(listed.stdout)
    assert (row["source_commit"], row["source_dirty"]) == (head, 1)
    table = run_cli("attempts", "list", "--artifacts", str(store), env=None)
    assert f"{head[:12]}+dirty" in table.stdout.replace("\n", "").replace(" ", "").replace("│", ""), (
        table.stdout
    )
    (report_attempt,) = load_store(store).attempts
    assert report_attempt.source == f"{head[:12]}+dirty"


def test_the_leaderboard_table_shows_each_entrys_commit():
    from rich.console import Console

    from mini_kv.leaderboard import Board, Entry, Group, SigningState

    entry = Entry(1, "c", 1.5, "a1", "now", "t/a1", None, "unsigned", {}, "0123456789ab")
    group = Group("t", "s", "e", "cpu", (entry,))
    board = Board(1, "now", "store", None, (group,), (), SigningState(None, False))
    console = Console(width=200, record=True)
    for t in rich_tables(board, 200):
        console.print(t)
    assert "0123456789ab" in console.export_text()
