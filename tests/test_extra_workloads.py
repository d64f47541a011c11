"""`bench --extra-workloads N`: unseen workloads drawn from a definition's var axes (solexec.workload)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mini_kv.errors import ConfigError
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.workload import extra_workloads, load_workloads

PROBLEM = Path(__file__).resolve().parent / "sol_solutions" / "problem"


def _problem():
    definition = load_definition(PROBLEM / "definition.json")
    return definition, load_workloads(PROBLEM / "workload.jsonl", definition)


def test_extra_workloads_are_unseen_within_range_and_the_same_for_a_seed():
    definition, shipped = _problem()
    drawn = extra_workloads(definition, shipped, 5, seed=3)
    assert [w.axes for w in drawn] == [w.axes for w in extra_workloads(definition, shipped, 5, seed=3)]
    assert [w.axes for w in drawn] != [w.axes for w in extra_workloads(definition, shipped, 5, seed=4)]
    rows = [w.axes["n"] for w in drawn]
    assert len(set(rows)) == 5 and not set(rows) & {3, 17} and all(3 < n < 17 for n in rows)
    assert all(w.resolved_axes["d"] == 8 for w in drawn)  # the const and expr axes resolved as usual
    assert len({w.uuid for w in drawn} | {w.uuid for w in shipped}) == 7
    assert extra_workloads(definition, shipped, 0, seed=3) == []


def test_more_extra_workloads_than_the_range_holds_is_a_clear_error():
    definition, shipped = _problem()
    with pytest.raises(ConfigError, match="no var-axis values left"):
        extra_workloads(definition, shipped, 14, seed=0)  # 4..16: 13 unseen row counts


def test_extra_workloads_refuse_safetensors_inputs(tmp_path):
    definition, shipped = _problem()
    line = {
        "uuid": "file",
        "axes": {"n": 3},
        "inputs": {
            "x": {"type": "safetensors", "path": "x.safetensors", "tensor_key": "x"},
            "w": {"type": "random"},
            "alpha": {"type": "scalar", "value": 1.0},
        },
    }
    fake = replace(shipped[0], inputs=line["inputs"], file=str(tmp_path / "workload.jsonl"))
    with pytest.raises(ConfigError, match="safetensors") as err:
        extra_workloads(definition, [fake], 1, seed=0)
    assert err.value.field == "line 1: inputs.x.type"
