"""The red-team suite, C++ task-card candidates (and the cache, hard links, --sandbox required): see
test_sol_attacks.py and redteam_world.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from redteam_world import (
    HERE,
    INFO,
    MARK,
    copy_filled,
    escaped_files,
    planted_world,
    store_leaks,
)

from mini_kv import jail
from mini_kv.environment import BUILD_MEMORY_VAR

pytestmark = [
    pytest.mark.skipif(not INFO.enabled, reason=f"no jail on this machine: {INFO.reason}"),
    # the attacks meet a judge kept between candidates, as a batch's (conftest.judges_kept)
    pytest.mark.usefixtures("judges_kept"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with planted_world(tmp_path_factory.mktemp("redteam")) as w:
        yield w


# ---------------------------------------------------------------------------------------------
# C++ task-card candidates


@pytest.fixture(scope="module")
def card_runs(world):
    """The card's candidates verified in a project of their own (its .build/ holds the victim)."""
    from conftest import run_cli

    project = world["base"] / "cardproj"
    copy_filled(HERE / "card", project, world)
    (project / "pyproject.toml").write_text("[project]\nname = 'redteam-card'\n")
    store = world["store"]

    def verify(cand: str) -> dict:
        res = run_cli(
            "verify",
            "--task",
            str(project / "redteam.yaml"),
            "--candidate",
            cand,
            "--device",
            "cpu",
            "--skip-benchmark",
            "--artifacts",
            str(store),
            "--json",
            cwd=project,
            timeout=600,
        )
        lines = res.stdout.strip().splitlines()
        return {
            "code": res.returncode,
            "summary": json.loads(lines[-1]) if lines else None,
            "err": res.stderr,
        }

    runs = {"victim": verify("victim")}
    world["subst"]["BUILD"] = project / ".build"
    victim_lib = _libraries(project)
    runs["victim_sha"] = {p: _sha(p) for p in victim_lib}
    for name in ("static_init", "poison_cache", "include_abs", "incbin"):
        runs[name] = verify(name)
    # a cap the machine can afford to see reached (the default is half its memory)
    os.environ[BUILD_MEMORY_VAR], t0 = "2", time.monotonic()
    try:
        runs["include_zero"] = verify("include_zero")
    finally:
        del os.environ[BUILD_MEMORY_VAR]
    runs["include_zero"]["seconds"] = time.monotonic() - t0
    runs["victim_again"] = verify("victim")
    runs["project"] = project
    return runs


def _libraries(project: Path) -> list[Path]:
    return sorted(p for p in (project / ".build").glob("*/*.so"))


def _sha(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["static_init", "poison_cache", "include_abs", "incbin", "include_zero"])
def test_card_attack_fails_with_a_normal_verdict(name, world, card_runs):
    run = card_runs[name]
    assert run["summary"] is not None, run["err"][-3000:]  # a verdict, not a crash
    assert run["code"] in (3, 4), run  # COMPILE (build failed) or CORRECTNESS (no op loaded)
    assert escaped_files(world) == [] and not (card_runs["project"] / f"{MARK}static_init").exists()
    assert world["listener"].calls == []
    assert store_leaks(world) == []


def test_the_compile_time_attacks_fail_to_read_the_file(card_runs):
    for name in ("include_abs", "incbin"):
        assert card_runs[name]["summary"]["status"] == "COMPILE_ERROR", card_runs[name]["summary"]


def test_a_compiler_that_eats_memory_fails_alone_at_the_cap(card_runs):
    """`#include "/dev/zero"`: the compiler reads zeros until its address space cap (RLIMIT_AS on every
    process of a build that maps no CUDA) stops it, a COMPILE_ERROR saying so, long before the timeout."""
    run = card_runs["include_zero"]
    assert run["summary"]["status"] == "COMPILE_ERROR", run["summary"]
    log = Path(run["summary"]["attempt"]) / "logs"
    text = "".join(p.read_text(errors="replace") for p in log.rglob("*") if p.is_file())
    assert "out of memory" in text or "memory exhausted" in text, text[-2000:]
    assert run["seconds"] < 120, run["seconds"]


def test_another_candidate_cannot_poison_a_cached_build(card_runs):
    """The poisoner's static initializer walks .build/ and overwrites every library it can reach: none,
    so the victim's next verify is a cache hit of the same bytes."""
    assert card_runs["victim_sha"], "the victim built no library"
    for lib, sha in card_runs["victim_sha"].items():
        assert _sha(lib) == sha, lib
    again = card_runs["victim_again"]["summary"]
    assert again is not None and again["compile"]["cache_hit"] is True, again
    assert not list((card_runs["project"] / ".build").glob(f"{MARK}*"))


def test_a_cache_entry_that_no_longer_matches_its_hash_is_discarded_and_rebuilt(tmp_path, capsys):
    """The host-side half of poisoning: a library edited in the cache (by anyone) is never trusted."""
    from mini_kv.compile.compiler import compile_candidate
    from mini_kv.load.task_card import load_task_card

    world = {"subst": {k: "/nonexistent" for k in ("HOME", "HOSTTMP", "PROJECT", "BUILD", "SOCKET")}}
    world["subst"]["PORT"] = 9
    copy_filled(HERE / "card", tmp_path, world)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    card = load_task_card(tmp_path / "redteam.yaml")
    cand = card.candidate("victim")
    first = compile_candidate(tmp_path, cand, with_cuda=False)
    assert first.status == "ok" and first.library_sha256, first
    Path(first.library).write_bytes(b"swapped by someone")
    second = compile_candidate(tmp_path, cand, with_cuda=False)
    assert second.cache_hit is False and second.library_sha256 == first.library_sha256
    assert "does not match its record" in capsys.readouterr().err


def test_a_hard_link_to_a_secret_is_refused_before_anything_runs(world, tmp_path):
    from conftest import run_cli

    project = tmp_path / "proj"
    copy_filled(HERE / "card", project, {"subst": world["subst"]})
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    secret = tmp_path / "secret.txt"  # same file system as the project: a hard link is possible
    secret.write_text(world["token"])
    os.link(secret, project / "victim" / "notes.h")
    res = run_cli(
        "verify", "--task", str(project / "redteam.yaml"), "--candidate", "victim", "--device", "cpu"
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "hard links" in res.stderr and "notes.h" in res.stderr
    assert not (project / ".build").exists() or not any((project / ".build").iterdir())


def test_sandbox_required_refuses_where_a_layer_is_missing(monkeypatch, tmp_path):
    from conftest import run_cli

    broken = jail.JailInfo(
        mode="auto", enabled=True, tool="bwrap x", layers=(("landlock", "no Landlock here"),)
    )
    monkeypatch.setattr(jail, "probe", lambda: broken)
    res = run_cli(
        "verify",
        "--task",
        "tasks/vector_add.yaml",
        "--device",
        "cpu",
        "--sandbox",
        "required",
        "--artifacts",
        str(tmp_path),
    )
    assert res.returncode == 2 and "landlock" in res.stderr and "no candidate code runs" in res.stderr
    assert not any(tmp_path.iterdir())
