"""Issue 35 finding 8, end to end: outputs a broken candidate can produce (garbage bits, 1e38 everywhere,
a few 1e37s that overflow a float32 relative error, NaN) each get a verdict, a trace and an attempt from
`bench`, never exit 10. Each asserts the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sol_helpers import statuses, write_solution

from mini_kv.errors import ExitCode
from mini_kv.solexec.run import BenchOptions, bench

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

PROBLEM = Path(__file__).resolve().parent / "sol_solutions" / "problem"
SETTINGS = {"device": "cpu", "rounds": 2, "warmup": 1, "repeats": 1, "samples": 5, "timeout": 300.0}
# scale_mul: y = x * w * alpha (n x 8) and its sum
OUTPUTS = {
    "garbage_bits": (
        "y = torch.randint(-2**31, 2**31, (x.shape[0], 8), dtype=torch.int64).to(torch.int32).view(torch.float32)",
        "INCORRECT_NUMERICAL",
    ),
    "all_1e38": ("y = torch.full_like(x, 1e38)", "INCORRECT_NUMERICAL"),
    # where the reference is smallest, so the float32 relative error is likeliest to overflow
    "three_1e37": (
        "y = x * (w * alpha); y.view(-1)[y.abs().view(-1).argsort()[:3]] = 1e37",
        "INCORRECT_NUMERICAL",
    ),
    "nan": ("y = x * (w * alpha); y.view(-1)[0] = float('nan')", "INCORRECT_NUMERICAL"),
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_every_output_gets_a_verdict_a_trace_and_an_attempt(tmp_path, monkeypatch, name):
    (tmp_path / ".mini-kv-project").write_text("")
    monkeypatch.chdir(tmp_path)
    make_y, status = OUTPUTS[name]
    code = f"import torch\n\n\ndef forward(x, w, alpha):\n    {make_y}\n    return {{'y': y, 'total': y.sum()}}\n"
    sol = write_solution(
        tmp_path / name, f"scale_mul_{name}", "scale_mul", "main.py", code, entry="forward", dps=False
    )
    res = bench(str(PROBLEM), BenchOptions(solution=str(sol), **SETTINGS))
    assert res.exit_code == ExitCode.CORRECTNESS, res
    # 3 of the 24 elements of `small` are 1e37 (12.5 %): wrong by the matched ratio, like garbage
    assert set(statuses(res).values()) == {status}, statuses(res)
    lines = (Path(res.attempt) / "traces.jsonl").read_text().splitlines()
    assert len(lines) == len(res.traces) == 2
    for line in lines:
        corr = json.loads(line)["evaluation"]["correctness"]  # strict JSON, finite numbers
        assert corr is not None and corr["max_relative_error"] >= 0
