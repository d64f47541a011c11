"""Finding 5 of issue 35: an attempt rewritten consistently (records, file list, headline) must never rank,
whatever is rebuilt, and no message may recommend an action that launders it.

The attacker can write anything under artifacts/ (attempt files, attempt.json, index.sqlite) but does not
have the operator's signing key, which lives outside the store (an environment variable or a key file).
`_rewrite` is that attacker's best tool: it regenerates every record of an attempt as the real writer
would (same attempt id, same seed salt, samples 50x faster) and reseals attempt.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_index import attempt_records, make_attempt
from test_store_forgery import _reseal

from mini_kv.cli import main
from mini_kv.cli_common import run_command
from mini_kv.errors import UserError
from mini_kv.leaderboard import build_leaderboard, why_nothing_ranked
from mini_kv.store import signing
from mini_kv.store.index import INDEX_NAME, IndexUnusable, rebuild_index, update_index

KEY = "k" * 40
OTHER_KEY = "o" * 40


def _rewrite(attempt: Path, speedup: float = 50.0, seed: int = 1, signature="keep") -> None:
    """Every record regenerated with `speedup` (same ids, same salt), attempt.json resealed; the old
    signature kept (`keep`), dropped (None) or copied from another attempt (a dict)."""
    files, header = attempt_records(speedups={"bench_a": speedup}, seed=seed)
    for rel, obj in files.items():
        (attempt / rel).write_text(json.dumps(obj))
    old = json.loads((attempt / "attempt.json").read_text())
    keep = {k: old[k] for k in ("attempt_id", "candidate", "op", "created_at", "schema_version")}
    sig = old.get("signature") if signature == "keep" else signature
    _reseal(attempt, {**header, **keep, "signature": sig})


def _ranked(board) -> dict[str, float]:
    return {e.candidate: e.geomean_speedup for g in board.groups for e in g.entries}


def _messages(board) -> str:
    return "\n".join(p.message for p in board.problems)


@pytest.fixture
def unsigned_store(tmp_path, monkeypatch):
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.delenv(signing.KEY_FILE_ENV, raising=False)
    art = tmp_path / "artifacts"
    slow = make_attempt(art, candidate="v0", seed=1, speedups={"bench_a": 1.5})
    make_attempt(art, candidate="v1", seed=2, speedups={"bench_a": 3.0})
    rebuild_index(art)
    assert _ranked(build_leaderboard(art)).keys() == {"v0", "v1"}
    return art, slow


@pytest.fixture
def signed_store(tmp_path, monkeypatch):
    monkeypatch.delenv(signing.KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(signing.KEY_ENV, KEY)
    art = tmp_path / "artifacts"
    slow = make_attempt(art, candidate="v0", seed=1, speedups={"bench_a": 1.5})
    make_attempt(art, candidate="v1", seed=2, speedups={"bench_a": 3.0})
    rebuild_index(art)
    assert _ranked(build_leaderboard(art, require_signed=True)).keys() == {"v0", "v1"}
    return art, slow


# ------------------------------------------------------------------------- laundering through rebuild


def test_a_consistent_rewrite_is_tampered_and_the_message_does_not_launder_it(unsigned_store):
    art, slow = unsigned_store
    _rewrite(slow)
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board)
    (p,) = [p for p in board.problems if p.path == str(slow)]
    assert p.kind == "tampered" and "rewritten after it was indexed" in p.message
    assert "rebuild-index" not in p.message  # the advice that used to launder it


@pytest.mark.parametrize("how", ["rebuild_index", "leaderboard --rebuild", "rebuild-index twice"])
def test_a_consistent_rewrite_never_ranks_whatever_is_rebuilt(unsigned_store, how, capsys):
    art, slow = unsigned_store
    _rewrite(slow)
    if how == "rebuild_index":
        result = rebuild_index(art)
        (p,) = [p for p in result.problems if p.path == str(slow)]
        assert (
            p.kind == "tampered" and "never ranked" in p.message and "rebuild" not in p.message.split(";")[0]
        )
    elif how == "leaderboard --rebuild":
        assert main(["leaderboard", "--artifacts", str(art), "--rebuild"]) == 0
    else:
        for _ in range(2):
            assert main(["rebuild-index", "--artifacts", str(art)]) == 0
    out = capsys.readouterr()
    for board in (build_leaderboard(art), build_leaderboard(art, rebuild=True)):
        assert _ranked(board) == {"v1": pytest.approx(3.0, rel=0.05)}
        assert any(p.path == str(slow) and p.kind == "tampered" for p in board.problems)
    assert "50.0" not in out.out


def test_an_update_never_brings_back_a_remembered_tampered_attempt(unsigned_store):
    art, slow = unsigned_store
    _rewrite(slow)
    rebuild_index(art)
    with pytest.raises(IndexUnusable, match="never ranked"):
        update_index(art, slow)
    assert "v0" not in _ranked(build_leaderboard(art))


def test_a_rewrite_that_fails_its_checks_is_remembered_after_it_is_fixed_up(unsigned_store):
    """First a partial edit (caught by the hashes), then the consistent one: still out."""
    art, slow = unsigned_store
    (slow / "logs" / "worker.log").write_text("edited\n")
    assert any(p.path == str(slow) for p in rebuild_index(art).problems)
    _rewrite(slow)
    rebuild_index(art)
    assert "v0" not in _ranked(build_leaderboard(art, rebuild=True))


def test_without_a_key_a_deleted_index_forgets_which_is_why_require_signed_exists(unsigned_store):
    """The documented limit: with no key, deleting index.sqlite too makes the rewrite indistinguishable."""
    art, slow = unsigned_store
    _rewrite(slow)
    (art / INDEX_NAME).unlink()
    board = build_leaderboard(art, rebuild=True)
    assert _ranked(board)["v0"] == pytest.approx(50.0, rel=0.05)
    assert board.groups[0].entries[0].signature == "unsigned"


# ---------------------------------------------------------------------------------------- signatures


def test_attempts_are_signed_with_the_key_and_unsigned_without(signed_store, tmp_path, monkeypatch):
    art, slow = signed_store
    sig = json.loads((slow / "attempt.json").read_text())["signature"]
    assert sig["algorithm"] == "hmac-sha256" and len(sig["mac"]) == 64
    assert KEY not in (slow / "attempt.json").read_text()
    assert {e.signature for g in build_leaderboard(art).groups for e in g.entries} == {"valid"}
    monkeypatch.delenv(signing.KEY_ENV)
    bare = make_attempt(tmp_path / "other", candidate="v9", seed=9)
    assert json.loads((bare / "attempt.json").read_text())["signature"] is None


@pytest.mark.parametrize("index", ["kept", "deleted"])
@pytest.mark.parametrize("signature", ["keep", "drop", "copied"])
def test_a_rewritten_signed_attempt_never_ranks_with_require_signed(signed_store, index, signature):
    art, slow = signed_store
    other = next(d for d in slow.parent.iterdir() if d != slow)
    copied = json.loads((other / "attempt.json").read_text())["signature"]
    _rewrite(slow, signature={"keep": "keep", "drop": None, "copied": copied}[signature])
    if index == "deleted":
        (art / INDEX_NAME).unlink()
    for rebuild in (False, True):
        board = build_leaderboard(art, rebuild=rebuild, require_signed=True)
        assert _ranked(board) == {"v1": pytest.approx(3.0, rel=0.05)}
        (p,) = [p for p in board.problems if p.path == str(slow)] or [
            p for p in rebuild_index(art).problems if p.path == str(slow)
        ]
        assert p.kind == ("unsigned" if signature == "drop" and index == "deleted" else "tampered")
        assert "rebuild-index" not in p.message


def test_a_signature_that_does_not_hold_is_tampered_even_without_require_signed(signed_store):
    art, slow = signed_store
    _rewrite(slow)
    (art / INDEX_NAME).unlink()
    result = rebuild_index(art)
    (p,) = [p for p in result.problems if p.path == str(slow)]
    assert p.kind == "tampered" and "signature does not hold" in p.message
    assert "v0" not in _ranked(build_leaderboard(art))


def test_require_signed_says_why_it_ranks_nothing_when_nothing_is_signed(unsigned_store, monkeypatch, capsys):
    art, _ = unsigned_store
    assert main(["leaderboard", "--artifacts", str(art), "--require-signed"]) == 2
    assert signing.KEY_ENV in capsys.readouterr().err
    monkeypatch.setenv(signing.KEY_ENV, KEY)
    assert main(["leaderboard", "--artifacts", str(art), "--require-signed"]) == 0
    out = capsys.readouterr().out
    assert "nothing to rank" in out and "2 unsigned" in out and "written without" in out


def test_an_attempt_signed_with_another_key_is_not_ranked_under_require_signed(signed_store, monkeypatch):
    art, _ = signed_store
    monkeypatch.setenv(signing.KEY_ENV, OTHER_KEY)
    board = build_leaderboard(art, require_signed=True)
    assert _ranked(board) == {}
    assert {p.kind for p in board.problems} == {"unsigned"}
    assert "another key" in _messages(board)
    assert "2 unsigned" in why_nothing_ranked(art, board)


# ----------------------------------------------------------------------------------------- the key


def test_a_key_file_inside_the_store_is_refused(tmp_path, monkeypatch):
    art = tmp_path / "artifacts"
    (art / "keys").mkdir(parents=True)
    (art / "keys" / "k").write_text(KEY)
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(art / "keys" / "k"))
    with pytest.raises(UserError, match="inside the artifact store"):
        signing.operator_key(art)
    with pytest.raises(UserError, match="inside the artifact store"):
        make_attempt(art, candidate="v0")


@pytest.mark.parametrize("value", ["short", ""])
def test_a_short_or_unreadable_key_is_a_clear_error(tmp_path, monkeypatch, value):
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    key_file = tmp_path / "key"
    if value:
        key_file.write_text(value)
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(key_file))
    with pytest.raises(UserError, match="at least 16" if value else "cannot read"):
        signing.operator_key(tmp_path / "artifacts")


def test_a_key_file_works_like_the_variable(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(key_file))
    from_file = signing.operator_key(tmp_path / "artifacts")
    monkeypatch.delenv(signing.KEY_FILE_ENV)
    monkeypatch.setenv(signing.KEY_ENV, KEY)
    assert from_file.key_id == signing.operator_key(tmp_path / "artifacts").key_id


def test_no_child_process_of_a_command_inherits_the_key(monkeypatch):
    monkeypatch.setenv(signing.KEY_ENV, KEY)
    seen = {}

    def command(_args) -> int:
        seen["own"] = signing.operator_key(None)
        seen["child"] = subprocess.run(
            [sys.executable, "-c", f"import os; print(os.environ.get({signing.KEY_ENV!r}, 'absent'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        seen["environ"] = os.environ.get(signing.KEY_ENV)
        return 0

    assert run_command(command, None) == 0
    assert seen["own"] is not None and seen["child"] == "absent" and seen["environ"] is None
    assert os.environ[signing.KEY_ENV] == KEY  # given back when the command ends


def test_the_run_says_whether_its_attempt_is_signed(signed_store, tmp_path, monkeypatch):
    from mini_kv.report import signature_line

    _, slow = signed_store
    assert signature_line(str(slow)) == f"signature: HMAC-SHA256, key id {signing.operator_key(None).key_id}"
    monkeypatch.delenv(signing.KEY_ENV)
    bare = make_attempt(tmp_path / "other", candidate="v9", seed=9)
    assert signature_line(str(bare)).startswith("signature: none (neither MINI_KV_SIGNING_KEY")
