"""Fuzzing the attempt store: random edits of a real attempt's attempt.json, benchmark.json,
correctness.json (with and without the attacker fixing up the SHA-256 list) and of index.sqlite.

Properties, for every edit:
  * `rebuild-index` and `leaderboard` finish (no hang), never exit 10 (a traceback): 0, or 2 with a
    message for an index they cannot use;
  * the untouched sibling attempt is always indexed and ranked (one bad attempt blocks nothing);
  * the edited attempt is either not ranked or ranked with exactly its original values: a mutated
    value never reaches the leaderboard.

The store is synthesized once per module through the store's writer (AttemptWriter, with the headline
from the same function `verify` uses); each example works on a fresh copy.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_index import make_attempt  # tests/ is on sys.path (its conftest.py)

from mini_kv.cli import main
from mini_kv.errors import UserError
from mini_kv.leaderboard import build_leaderboard
from mini_kv.store.index import INDEX_NAME, rebuild_index

FUZZ = settings(
    max_examples=int(os.environ.get("MINI_KV_FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HANG_S = 120

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict]:
    art = tmp_path_factory.mktemp("store") / "artifacts"
    make_attempt(art, candidate="v0", seed=1, speedups={"bench_a": 1.5, "bench_b": 2.5})
    make_attempt(art, candidate="v1", seed=2, speedups={"bench_a": 2.0})
    make_attempt(art, candidate="v2", seed=3, bench=False, stable=None)
    rebuild_index(art)
    return art, _ranked(build_leaderboard(art))


def _ranked(board: dict) -> dict[str, tuple]:
    return {
        e.candidate: (e.attempt_id, e.geomean_speedup, tuple(sorted(e.cases.items())))
        for g in board.groups
        for e in g.entries
    }


@contextlib.contextmanager
def _no_hang(seconds: int = HANG_S):
    def fail(*_):
        raise AssertionError(f"store command still running after {seconds} s (hang)")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fresh(pristine, tmp_path_factory) -> Path:
    art = tmp_path_factory.mktemp("case") / "artifacts"
    shutil.copytree(pristine[0], art)
    return art


def _attempt(art: Path, candidate: str) -> Path:
    return next(d for d in (art / "vector_add").iterdir() if f"-{candidate}-" in d.name)


def _paths(obj, prefix=()):
    """Every path (tuple of keys/indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


# keys the store reads somewhere: an "add" edit puts one of them into an object that lacks it
KEYS = (
    "format",
    "files",
    "status",
    "benchmark",
    "cases",
    "summary",
    "seed_salt",
    "stability",
    "samples",
    "candidate",
    "speedup",
    "id",
    "key",
    "schema_version",
    "device",
    "workloads",
    "path",
    "size",
)


def _mutate(obj, path, action: str, value, key: str):
    if not path:
        return value
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if action == "delete":
        del parent[path[-1]]
    elif action == "add" and isinstance(parent[path[-1]], dict):
        parent[path[-1]][key] = value
    else:
        parent[path[-1]] = value
    return obj


def _at(obj, path, kind) -> bool:
    for k in path:
        obj = obj[k]
    return isinstance(obj, kind)


def _reseal(attempt: Path) -> None:
    import hashlib

    meta = attempt / "attempt.json"
    try:
        header = json.loads(meta.read_text())
        for e in header["files"]:
            data = (attempt / e.path).read_bytes()
            e.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    except (ValueError, KeyError, TypeError, OSError, AttributeError):
        return  # attempt.json itself no longer has a usable file list: nothing to fix up
    meta.write_text(json.dumps(header))


def _check(art: Path, pristine_ranked: dict, mutated: str = "v0") -> None:
    """The three properties of the module docstring."""
    out = io.StringIO()
    with _no_hang(), contextlib.redirect_stdout(out):
        rc_rebuild = main(["rebuild-index", "--artifacts", str(art)])
        rc_board = main(["leaderboard", "--artifacts", str(art)])
    assert rc_rebuild in (0, 2) and rc_board in (0, 2), (rc_rebuild, rc_board)
    try:
        with _no_hang():
            ranked = _ranked(build_leaderboard(art))
    except UserError:  # an index it cannot use: said clearly (exit 2), nothing ranked
        return
    for cand, entry in ranked.items():
        assert entry == pristine_ranked.get(cand), (
            f"{cand} ranked with {entry}, originally {pristine_ranked.get(cand)}"
        )
    if mutated != "v1":
        assert ranked.get("v1") == pristine_ranked["v1"]


FILES = ("attempt.json", "benchmark.json", "correctness.json", "environment.json")


@FUZZ
@given(
    data=st.data(),
    file=st.sampled_from(FILES),
    action=st.sampled_from(["set", "delete", "add"]),
    value=JSON_VALUE,
    key=st.sampled_from(KEYS),
    reseal=st.booleans(),
    candidate=st.sampled_from(["v0", "v2"]),
)
def test_json_edits_never_crash_and_never_rank_a_mutated_value(
    pristine, tmp_path_factory, data, file, action, value, key, reseal, candidate
):
    art = _fresh(pristine, tmp_path_factory)
    a = _attempt(art, candidate)
    obj = json.loads((a / file).read_text())
    paths = list(_paths(obj))
    path = data.draw(st.sampled_from(paths), label="path")
    if action == "delete" and not path:
        action = "set"
    if action == "add":  # add to an object: the root or an object inside
        path = data.draw(st.sampled_from([p for p in paths if _at(obj, p, dict)]), label="object")
        if not path:
            obj[key] = value
    if not (action == "add" and not path):
        obj = _mutate(obj, path, action, value, key)
    (a / file).write_text(json.dumps(obj, allow_nan=True))
    if reseal:
        _reseal(a)
    _check(art, pristine[1], candidate)


@FUZZ
@given(
    file=st.sampled_from(FILES),
    cut=st.integers(min_value=0, max_value=4000),
    junk=st.binary(max_size=40),
    reseal=st.booleans(),
)
def test_byte_edits_never_crash_and_never_rank_a_mutated_value(
    pristine, tmp_path_factory, file, cut, junk, reseal
):
    art = _fresh(pristine, tmp_path_factory)
    a = _attempt(art, "v0")
    raw = (a / file).read_bytes()
    cut = min(cut, len(raw))
    (a / file).write_bytes(raw[:cut] + junk + raw[cut + len(junk) :])
    if reseal:
        _reseal(a)
    _check(art, pristine[1])


@FUZZ
@given(
    table=st.sampled_from(["attempts", "bench_cases", "meta"]),
    column=st.integers(min_value=0, max_value=15),
    value=st.one_of(JSON_LEAF, st.binary(max_size=8)),
    row=st.integers(min_value=0, max_value=5),
)
def test_index_edits_never_crash_and_never_rank_a_mutated_value(
    pristine, tmp_path_factory, table, column, value, row
):
    art = _fresh(pristine, tmp_path_factory)
    con = sqlite3.connect(str(art / INDEX_NAME))
    with con:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        rowids = [r[0] for r in con.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
        if isinstance(value, float) and value != value:
            value = None  # SQLite stores NaN as NULL anyway
        with contextlib.suppress(sqlite3.IntegrityError, OverflowError):
            con.execute(
                f"UPDATE {table} SET {cols[column % len(cols)]}=? WHERE rowid=?",
                (value, rowids[row % len(rowids)]),
            )
    con.close()
    with _no_hang():
        rc = main(["leaderboard", "--artifacts", str(art)])
        assert rc in (0, 2)
        try:
            ranked = _ranked(build_leaderboard(art))
        except UserError:
            return
    for cand, entry in ranked.items():
        assert entry == pristine[1].get(cand), (
            f"{cand} ranked with {entry}, originally {pristine[1].get(cand)}"
        )
