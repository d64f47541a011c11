"""Helpers shared by the `bench` tests on CPU (test_sol_bench.py) and GPU (test_sol_gpu.py)."""

import json
from pathlib import Path

from mini_kv.solexec.run import BenchResult


def bench_result(**fields) -> BenchResult:
    """A BenchResult of `fields`, the others empty: for the report's own tests."""
    empty = {"traces": (), "status": "PASSED", "exit_code": 0, "attempt": "", "index_warning": None}
    empty |= {"compile": None, "device": "cpu", "settings": {}, "unavailable": None, "skipped": ()}
    empty |= {"counts": {}, "benchmark": None, "staging": None, "definition": "d", "solution": "s"}
    empty |= {"duration_s": 0.0, "phases": {}, "regression": None, "sandbox": None, "kernels": {}}
    return BenchResult(**{**empty, **fields})


def statuses(result: BenchResult) -> dict:
    return {t.workload.uuid: t.evaluation.status for t in result.traces}


def logs(result: BenchResult) -> dict:
    return {t.workload.uuid: t.evaluation.log for t in result.traces}


def write_solution(
    folder: Path,
    name: str,
    definition: str,
    source: str,
    code: str,
    entry: str = "run",
    languages=("pytorch",),
    hardware: str = "LOCAL",
    dps: bool | None = None,
) -> Path:
    """A one-file solution in `folder`: `source` holding `code`, and its solution.json (returned)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / source).write_text(code)
    spec = {"languages": list(languages), "target_hardware": [hardware], "entry_point": f"{source}::{entry}"}
    if dps is not None:
        spec["destination_passing_style"] = dps
    path = folder / "solution.json"
    path.write_text(
        json.dumps(
            {
                "name": name,
                "definition": definition,
                "author": "tests",
                "spec": spec,
                "sources": [{"path": source}],
            }
        )
    )
    return path
