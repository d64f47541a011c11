"""The Python API (docs/api.md): its documented example runs as written, and results carry verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mini_kv import api
from mini_kv.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems/sol-execbench/custom_inputs_matmul"
# an in-memory solution one off on every element
WRONG = api.Solution(
    name="matmul_wrong",
    entry_point="kernel.py::run",
    destination_passing_style=True,
    sources={"kernel.py": "import torch\n\ndef run(A, B, C):\n    torch.mm(A, B, out=C)\n    C.add_(1)\n"},
)


def _first_python_block() -> str:
    text = (ROOT / "docs/api.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.slow
def test_documented_example_runs_as_written(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the example's paths are the repository's, as a user runs it from the root
    exec(compile(_first_python_block(), "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "matmul_in_memory PASSED" in out
    assert re.search(r"custom_matmul\S* PASSED", out)


@pytest.mark.slow
def test_wrong_in_memory_solution_is_a_verdict_and_stored(tmp_path):
    (result,) = api.evaluate(PROBLEM, [WRONG], device="cpu", artifacts=tmp_path)
    assert not result.passed
    assert result.status != "PASSED"
    assert result.cases and all(c.status == "INCORRECT_NUMERICAL" for c in result.cases)
    assert result.attempt is not None and (result.attempt / "attempt.json").is_file()
    assert result.reason and "INCORRECT_NUMERICAL" in result.reason
    # the static pre-check read its in-memory source, as stored in the attempt; nothing to name in it
    assert result.static_check.ran and result.static_check.files == ("kernel.py",)
    assert result.static_check.findings == () and result.static_check.classification == "valid"


def test_empty_selection_and_unknown_options_are_errors():
    with pytest.raises(UserError, match="no solutions"):
        list(api.evaluate(PROBLEM, []))
    with pytest.raises(UserError, match="unknown option"):
        list(api.evaluate(PROBLEM, ["x.json"], device="cpu", no_such_option=1))


def test_a_result_reads_the_stored_records_and_refuses_one_no_reader_can_read(tmp_path):
    """Result.cases come from the store's typed records; a resealed record that passes the store's checks
    but cannot be read (a case's roofline rewritten to a string) makes the result INVALID, naming it."""
    import json
    from types import SimpleNamespace

    from test_index import make_attempt
    from test_store_forgery import _reseal

    a = make_attempt(tmp_path / "artifacts", status="INCORRECT")
    out = SimpleNamespace(detail=None, attempt=str(a), candidate="v0", status="x", exit_code=1, kind="verify")
    res = api._result(out, keep=False)
    assert res.status == "INCORRECT" and [c.status for c in res.cases] == ["PASSED", "INCORRECT"]
    assert res.reason == f"1 case(s) failed; first {res.cases[1].id}: INCORRECT"
    bench = json.loads((a / "benchmark.json").read_text())
    bench["cases"][0]["roofline"] = "fast"
    (a / "benchmark.json").write_text(json.dumps(bench))
    _reseal(a)
    res = api._result(out, keep=False)
    assert res.status == "INVALID" and res.cases == () and str(a) in res.reason


@pytest.mark.slow
def test_calls_within_kept_judges_share_a_judge_and_keep_their_verdicts(started, tmp_path):
    """A loop of one-solution calls: within api.kept_judges the second call's judge is the first's (each
    solution still gets its own subject), whatever store each call writes to; it ends with the block."""
    from mini_kv import runner

    good = ROOT / "solutions/custom_inputs_matmul/pytorch/solution.json"
    with api.kept_judges():
        (first,) = api.evaluate(PROBLEM, [good], device="cpu", store=False)
        (second,) = api.evaluate(PROBLEM, [WRONG], device="cpu", artifacts=tmp_path / "store")
        assert runner.KeptJudges._idle  # the judge waits for a next call
    assert first.passed and not second.passed and second.status != "PASSED"
    assert started == ["judge", "subject", "subject"]
    assert runner.KeptJudges._idle == [] and not runner.KeptJudges.keeping()
