"""`mini-kv batch MANIFEST.yaml` and `mini-kv worker ADDRESS`, and what verify, bench and batch share: a
batch's one display (cli_common.BatchDisplay), its reports and its one exit code (docs/distributed.md)."""

from __future__ import annotations

import json

from mini_kv.cli_common import BatchDisplay, console


def run_items(items, where) -> list[dict]:
    from mini_kv.dist.batch import run_batch

    with BatchDisplay(len(items)) as show:
        return run_batch(items, where, show)


def print_batch(results: list[dict], args) -> int:
    """Each item's report (verify's or bench's), the batch's one-line summary; the worst exit code."""
    from mini_kv import report
    from mini_kv.dist.batch import status_of, worst
    from mini_kv.solexec.table import print_report

    for result in results:
        if args.json:
            line = {
                "candidate": result.get("candidate"),
                "item": result["label"],
                "attempt": result["attempt"],
            }
            print(json.dumps({**line, **_json_summary(result)}))
        elif result.get("failed"):
            console.print(f"{result['summary']['status']} {result['label']}: {result['summary']['reason']}")
        elif "summary" in result:
            report.print_verify(result, console, verbose=args.verbose)
        else:
            print_report(result, console, verbose=args.verbose)
    if len(results) > 1 and not args.json:
        console.print(
            "summary: "
            + ", ".join(
                f"{r['label']} {status_of(r)}" + (f" ({r['where']['worker']})" if r.get("where") else "")
                for r in results
            ),
            markup=False,
            soft_wrap=True,
        )
    return worst(r["exit_code"] for r in results)


def _json_summary(result: dict) -> dict:
    from mini_kv.dist.batch import status_of

    if "summary" in result:
        return {**result["summary"], "where": result.get("where")}
    return {"status": status_of(result), "exit_code": int(result["exit_code"]), "where": result.get("where")}


