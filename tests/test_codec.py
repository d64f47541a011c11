"""codec: typed records to JSON data and back; load.schema.read_record checks them against their
schema at the edge."""

from __future__ import annotations

import json

import pytest

from mini_kv.codec import from_json, to_json
from mini_kv.errors import ConfigError
from mini_kv.leaderboard import Board, Entry, Group, SigningState
from mini_kv.load.schema import read_record
from mini_kv.store.index import StoreProblem


def _board() -> Board:
    entry = Entry(1, "v1", 2.0, "a1", "2026-01-01T00:00:00+00:00", "t/a1", None, "unsigned", {"c": 2.0})
    group = Group("t", "s" * 64, "env", "cpu", (entry,))
    return Board(
        1, "now", "artifacts", None, (group,), (StoreProblem("p", "stray", "why"),), SigningState(None, False)
    )


def test_a_record_round_trips_through_json_text():
    board = _board()
    doc = json.loads(json.dumps(to_json(board)))
    assert doc["groups"][0]["entries"][0]["cases"] == {"c": 2.0}
    assert doc["problems"] == [{"path": "p", "kind": "stray", "message": "why"}]
    back = from_json(Board, doc)
    assert back == board  # nested records, tuples and optional fields rebuilt with their types
    assert isinstance(back.groups[0].entries[0], Entry) and isinstance(back.signing, SigningState)


def test_a_document_that_breaks_its_schema_is_refused_naming_file_and_field():
    with pytest.raises(ConfigError) as err:
        read_record(dict, {"schema_version": 1, "verdict": "MAYBE"}, "regression", "x/regression.json")
    assert "x/regression.json" in str(err.value)


def test_a_document_that_passes_its_schema_reads_as_its_record():
    from mini_kv.judge.regression import RegressionVerdict, Thresholds, Verdict

    verdict = RegressionVerdict(Verdict.PASS, ("same",), Thresholds())
    back = read_record(RegressionVerdict, to_json(verdict), "regression", "r.json")
    assert back == verdict and isinstance(back.thresholds, Thresholds)
