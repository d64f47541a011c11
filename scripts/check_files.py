#!/usr/bin/env python3
"""CI check: every schema is a valid Draft 2020-12 schema, every task card and baseline validates, and every
SOL-ExecBench problem (problems/sol-execbench/) and solution (solutions/, examples/) loads strictly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema

from mini_kv.errors import UserError
from mini_kv.load.schema import validate
from mini_kv.load.task_card import load_task_card
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.solution import load_solution
from mini_kv.solexec.workload import load_workloads

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    failures = 0
    checked = 0

    def check(label, fn, errors=(UserError,), files: int = 1) -> None:
        """Run one check; a failure is printed with `label` (what the error does not name itself)."""
        nonlocal failures, checked
        try:
            fn()
        except errors as exc:
            print(f"FAIL {label}{exc}")
            failures += 1
        checked += files

    for path in sorted((ROOT / "schemas").glob("*.json")):
        check(
            f"{path.relative_to(ROOT)}: ",
            lambda p=path: jsonschema.Draft202012Validator.check_schema(json.loads(p.read_text())),
            (ValueError, jsonschema.SchemaError),
        )
    for path in sorted((ROOT / "tasks").glob("*.yaml")):
        check("", lambda p=path: load_task_card(p))
    for path in sorted((ROOT / "baselines").glob("*.json")):
        check(
            f"{path.relative_to(ROOT)}: ",
            lambda p=path: validate(json.loads(p.read_text()), "baseline", str(p)),
            (ValueError, UserError),
        )
    for problem in sorted((ROOT / "problems" / "sol-execbench").glob("*/definition.json")):
        check("", lambda p=problem: load_workloads(p.parent / "workload.jsonl", load_definition(p)), files=2)
    for path in sorted([*ROOT.glob("solutions/*/*/solution.json"), *ROOT.glob("examples/*/*/solution.json")]):
        check("", lambda p=path: load_solution(p))
    print(
        f"checked {checked} files under schemas/, tasks/, baselines/, problems/, solutions/, examples/: "
        f"{failures} failed"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
