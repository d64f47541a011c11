"""Helpers shared by the `bench` tests on CPU (test_sol_bench.py) and GPU (test_sol_gpu.py)."""

import json
from pathlib import Path


def statuses(result: dict) -> dict:
    return {t["workload"]["uuid"]: t["evaluation"]["status"] for t in result["traces"]}


def logs(result: dict) -> dict:
    return {t["workload"]["uuid"]: t["evaluation"]["log"] for t in result["traces"]}


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
