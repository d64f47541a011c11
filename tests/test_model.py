"""One model for both front doors: a task card and a SOL-ExecBench problem load into the same frozen
Problem / Case / Candidate, and what the worker and the stored records see of them is as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from mini_kv.codec import to_json
from mini_kv.load.task_card import load_task_card
from mini_kv.model import Candidate, Case, Problem, canonical_json, sha256_text
from mini_kv.solexec.run import BenchOptions, load_problem
from mini_kv.worker.jobs import BandwidthJob

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"


def _sol(name: str) -> Problem:
    return load_problem(str(SOLS / "problem"), BenchOptions(str(SOLS / name / "solution.json")))


def test_a_card_and_a_sol_problem_are_the_same_types():
    card, sol = load_task_card(ROOT / "tasks" / "vector_add.yaml"), _sol("good_return")
    for prob in (card, sol):
        assert type(prob) is Problem and prob.cases and prob.candidates
        assert all(type(c) is Case for c in prob.cases)
        assert all(type(c) is Candidate for c in prob.candidates)
        assert prob.candidate(prob.default_candidate) in prob.candidates
    assert (card.format, sol.format) == ("task-card", "sol-execbench")
    assert card.reference == card.operator["reference"] and "def run" in sol.reference
    assert [c.id for c in sol.cases] == [wl.uuid for wl in sol.payload[1]]


def test_a_solution_is_a_candidate_with_its_build_spec_and_entry_point():
    py, cpp = _sol("good_return").candidates[0], _sol("cuda_good").candidates[0]
    assert (py.id, py.op, py.entry_file, py.entry_function) == (
        "scale_mul_good_return",
        "main.py::forward",
        "main.py",
        "forward",
    )
    assert py.group == "python" and py.dps is False and py.python_module
    assert cpp.group == "cpp" and cpp.cuda_sources == ("kernel.cu",) and cpp.cpu_sources == ("binding.cpp",)
    assert cpp.resolved()["sources"][0]["content"] == cpp.sources[0].content
    card_cand = load_task_card(ROOT / "tasks" / "vector_add.yaml").candidates[0]
    assert card_cand.group == "cpp" and not card_cand.python_module
    # the card candidate's record (candidate_manifest.json of a verify and a profile) keeps its eight fields
    assert list(to_json(card_cand.manifest()))[:8] == [
        "id",
        "path",
        "op",
        "cpu_sources",
        "cuda_sources",
        "cflags",
        "cuda_cflags",
        "backward",
    ]


def test_case_records_and_the_card_suite_hash_are_unchanged():
    card = load_task_card(ROOT / "tasks" / "vector_add.yaml")
    keys = ["id", "base_id", "kind", "params", "dtype", "devices"]
    assert all(list(c.to_dict()) == keys for c in card.cases)
    old = {
        "cases": [{k: getattr(c, k) for k in keys} for c in card.cases],
        "benchmark": card.benchmark,
        "tolerances": card.tolerances,
    }
    assert card.suite_hash() == sha256_text(canonical_json(old))
    sol = _sol("good_return")
    job_case = sol.cases[0].to_dict()  # what the worker gets: the workload's record, flattened
    assert job_case["kind"] == "workload" and job_case["dtype"] is None
    assert job_case["workload"]["uuid"] == job_case["id"] and job_case["index"] == 0
    assert {"signature", "workload"} <= set(job_case)


def test_jobs_are_read_by_attribute_not_by_key():
    job = BandwidthJob(device="cpu", nbytes=1, iterations=2)
    assert job.device == "cpu" and job.to_dict()["device"] == "cpu"
    with pytest.raises(TypeError):
        job["device"]
