"""Who is blamed: a reference that dies at import, a card whose params break its own input factory,
and an honest solution on a workload with a random scalar input (no false REWARD_HACK)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fuzz_helpers import sol_problem, write_json
from sol_helpers import logs, statuses

from mini_kv.errors import ExitCode
from mini_kv.model import WorkerResults
from mini_kv.settings import DEFAULTS
from mini_kv.solexec.run import BenchOptions, bench

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "repeats": 1, "samples": 3, "timeout": 60.0}
REFERENCE = "import torch\n\n\ndef run(x, w, alpha):\n    y = x * w * alpha\n    return y, y.sum()\n"


def _bench(
    tmp_path,
    definition: dict | None = None,
    workloads: list | None = None,
    solution_code: str | None = None,
    **kw,
) -> dict:
    d, default_def, default_wls, sol = sol_problem(tmp_path)
    if definition is not None:
        write_json(d / "definition.json", definition)
    if workloads is not None:
        (d / "workload.jsonl").write_text("".join(__import__("json").dumps(w) + "\n" for w in workloads))
    if solution_code is not None:
        sol["sources"][0]["content"] = solution_code
    path = write_json(tmp_path / "sol" / "solution.json", sol)
    return bench(
        str(d), BenchOptions(solution=str(path), artifacts=str(tmp_path / "artifacts"), **{**FAST, **kw})
    )


def test_random_scalar_input_and_a_copy_of_the_reference_passes(tmp_path):
    _, definition, wls, _ = sol_problem(tmp_path / "src")
    wls = [{**w, "inputs": {**w["inputs"], "alpha": {"type": "random"}}} for w in wls]
    code = REFERENCE.replace("def run(", "def forward(")
    result = _bench(tmp_path, workloads=wls, solution_code=code)
    assert set(statuses(result).values()) == {"PASSED"}, logs(result)
    assert result.exit_code == ExitCode.OK


@pytest.mark.parametrize(
    "prelude, timeout",
    [
        ("import sys\nsys.exit(3)\n", 60.0),
        ("import os\nos._exit(3)\n", 60.0),
        ("import time\ntime.sleep(600)\n", 4.0),
    ],
)
def test_a_reference_that_dies_or_hangs_at_import_is_invalid_reference(
    tmp_path, monkeypatch, prelude, timeout
):
    # a load that hangs costs the timeout and the load allowance (settings.load_s, 30 s for a loaded
    # host's imports): 4 s of it here, ample for importing this reference, keeps the hang cheap
    monkeypatch.setattr("mini_kv.runner.DEFAULTS", dataclasses.replace(DEFAULTS, load_s=4.0))
    _, definition, _, _ = sol_problem(tmp_path / "src")
    definition["reference"] = prelude + REFERENCE
    result = _bench(tmp_path, definition=definition, timeout=timeout)
    assert set(statuses(result).values()) == {"INVALID_REFERENCE"}, logs(result)
    assert result.exit_code == ExitCode.CONFIG
    assert all("reference" in log for log in logs(result).values())


def test_a_solution_that_exits_at_import_is_still_its_own_fault(tmp_path):
    result = _bench(tmp_path, solution_code="import os\nos._exit(3)\n")
    assert set(statuses(result).values()) == {"RUNTIME_ERROR"}, logs(result)


def test_a_card_factory_failure_is_the_cards_fault():
    from mini_kv.codec import to_json
    from mini_kv.references.vector_add import make_inputs
    from mini_kv.store.headline import summarize_correctness
    from mini_kv.worker import engine
    from mini_kv.worker.formats import CardCase, CardCaseRecord, CardFormat, correctness_record

    def run(case: dict, made: list) -> CardCaseRecord:
        tol = {"float32": {"atol": 0, "rtol": 0}}
        fmt = CardFormat(
            "vector_add", "cpu", "salt", lambda a, b: a + b, lambda a, b: a + b, make_inputs, tol
        )
        return correctness_record(
            engine.JobContext.local(fmt), CardCase.of(case), on_inputs=lambda: made.append(1)
        )

    case = {"id": "neg-float32", "kind": "core", "dtype": "float32", "params": {"n": -5}}
    made = []
    rec = run(case, made)
    assert rec.status == "INVALID_CASE" and "params {'n': -5}" in rec.reason and not made
    ok = run({**case, "id": "n8-float32", "params": {"n": 8}}, made)
    assert ok.status == "PASSED" and made == [1] and ok.inputs and ok.calls == 2
    summary = summarize_correctness(
        WorkerResults(
            load={"ok": True, "kernels": {"CPU": True, "Meta": True}}, cases=[to_json(rec), to_json(ok)]
        ),
        "cpu",
    )
    assert summary.invalid_cases == ["neg-float32"] and not summary.ok


@pytest.mark.slow
def test_verify_blames_the_card_for_params_its_factory_rejects(tmp_path):
    """End to end on CPU (one build of the naive candidate): a negative size, a string size and a size
    far beyond the worker's memory are INVALID_CASE, exit 2, not a candidate failure."""
    from fuzz_helpers import card_project, cli_main, shipped_card, write_card

    project = card_project(tmp_path)
    card = shipped_card()
    card["cases"] = [
        {"id": "ok", "kind": "core", "params": {"n": 8}, "dtypes": ["float32"]},
        {"id": "negative", "kind": "core", "params": {"n": -5}, "dtypes": ["float32"]},
        {"id": "text", "kind": "core", "params": {"n": "abc"}, "dtypes": ["float32"]},
        {"id": "huge", "kind": "core", "params": {"n": 1e11}, "dtypes": ["float32"]},
    ]
    path = write_card(project, card, "params.yaml")
    code, out = cli_main(
        "verify",
        "--task",
        str(path),
        "--device",
        "cpu",
        "--skip-benchmark",
        "--memory-limit",
        "4",
        "--artifacts",
        str(tmp_path / "artifacts"),
        "--json",
    )
    # stdout's JSON line; stderr (progress lines, when not a terminal) follows it in `out`
    summary = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    assert code == ExitCode.CONFIG, out
    assert summary["status"] == "INVALID_CASE"
    assert sorted(summary["correctness"]["invalid_cases"]) == [
        "huge-float32",
        "negative-float32",
        "text-float32",
    ]


@pytest.mark.parametrize(
    ("module_text", "field", "target", "why"),
    [
        (
            "raise RuntimeError('broken at import')\n\n\ndef reference(a, b):\n    return a + b\n",
            "reference",
            "cardmods_raise:reference",
            "broken at import",
        ),
        ("nope = 3\n", "inputs", "cardmods_value:nope", "has no callable 'nope'"),
    ],
    ids=["raises-at-import", "no-callable"],
)
def test_a_card_whose_modules_do_not_import_is_the_cards_error_before_any_build(
    tmp_path, module_text, field, target, why
):
    """verify loads a card without running its modules; its judge imports them as it starts (jailed, the
    front door imports no torch for them), and one that does not import, or names no callable, is the
    card's error: exit 2 naming the card's file and the field, before the candidate is built. (A name
    the module does not define at all is the loader's error, read without running it.)"""
    from fuzz_helpers import card_project, cli_main, shipped_card, write_card

    project = card_project(tmp_path / "p")
    (project / f"{target.partition(':')[0]}.py").write_text(module_text)  # a name of its own: sys.path
    card = shipped_card()
    card["operator"][field] = target
    path = write_card(project, card, "mods.yaml")
    code, out = cli_main(
        "verify", "--task", str(path), "--device", "cpu", "--skip-benchmark",
        "--artifacts", str(tmp_path / "artifacts"),
    )  # fmt: skip
    assert code == ExitCode.CONFIG, out
    assert str(path) in out and f"operator.{field}" in out and why in out, out
    assert "compile v0_naive" not in out, out  # told before any build
