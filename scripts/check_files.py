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
    for path in sorted((ROOT / "schemas").glob("*.json")):
        try:
            jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))
        except (ValueError, jsonschema.SchemaError) as exc:
            print(f"FAIL {path.relative_to(ROOT)}: {exc}")
            failures += 1
        checked += 1
    for path in sorted((ROOT / "tasks").glob("*.yaml")):
        try:
            load_task_card(path)
        except UserError as exc:
            print(f"FAIL {exc}")
            failures += 1
        checked += 1
    for path in sorted((ROOT / "baselines").glob("*.json")):
        try:
            validate(json.loads(path.read_text()), "baseline", str(path))
        except (ValueError, UserError) as exc:
            print(f"FAIL {path.relative_to(ROOT)}: {exc}")
            failures += 1
        checked += 1
    for problem in sorted((ROOT / "problems" / "sol-execbench").glob("*/definition.json")):
        try:
            load_workloads(problem.parent / "workload.jsonl", load_definition(problem))
        except UserError as exc:
            print(f"FAIL {exc}")
            failures += 1
        checked += 2
    for path in sorted([*ROOT.glob("solutions/*/*/solution.json"), *ROOT.glob("examples/*/*/solution.json")]):
        try:
            load_solution(path)
        except UserError as exc:
            print(f"FAIL {exc}")
            failures += 1
        checked += 1
    print(f"checked {checked} files under schemas/, tasks/, baselines/, problems/, solutions/, examples/: "
          f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
