"""`mini-kv batch MANIFEST.yaml` and `mini-kv worker ADDRESS`, and what verify, bench and batch share: a
batch's one display (cli_common.BatchDisplay), its reports and its one exit code (docs/distributed.md)."""

from __future__ import annotations

import argparse
import ast
import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

from mini_kv.cli_common import (
    VERBOSE_HELP,
    BatchDisplay,
    add_reference_argument,
    console,
    err_console,
)
from mini_kv.cluster.batch import BENCH, VERIFY, ItemResult
from mini_kv.errors import UserError

_KEYWORD_TOKEN = re.compile(r"\s*(\(|\)|and\b|or\b|not\b|[^\s()]+)")


def keyword_matches(expr: str, name: str) -> bool:
    """pytest's -k: words are substrings of `name` (case-insensitive), joined by and, or, not and
    parentheses. Anything else is a UserError."""
    tokens = _KEYWORD_TOKEN.findall(expr)
    if "".join(tokens).replace(" ", "") != expr.replace(" ", "") or not tokens:
        raise UserError(f"-k {expr!r}: expected words joined by and, or, not and parentheses")
    code = " ".join(
        t if t in ("(", ")", "and", "or", "not") else repr(t.lower() in name.lower()) for t in tokens
    )
    allowed = (ast.Expression, ast.BoolOp, ast.UnaryOp, ast.Not, ast.And, ast.Or, ast.Constant)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `True (False)` warns before it fails
            tree = ast.parse(code, mode="eval")
    except SyntaxError:
        tree = None
    if tree is None or not all(isinstance(n, allowed) for n in ast.walk(tree)):
        raise UserError(f"-k {expr!r}: not a valid expression of words, and, or, not and parentheses")
    return bool(eval(compile(tree, "-k", "eval"), {"__builtins__": {}}))  # noqa: S307 - booleans only


def _last_status(item) -> str | None:
    """The status of the item's newest stored attempt, or None when it has none."""
    from mini_kv.cluster.batch import item_key
    from mini_kv.model import safe_name
    from mini_kv.store.index import read_index

    _, task, cand = item_key(item)
    if item.kind == BENCH:  # the store knows a SOL problem and solution by their directory-safe names
        task, cand = safe_name(task), safe_name(cand)
    try:
        rows, _ = read_index(Path(item.store), "task_id = ? AND candidate = ?", (task, cand))
    except UserError:  # no index yet: nothing ran before
        return None
    return rows[-1].status if rows else None


def select_items(items: list, args) -> list:
    """-k EXPR over the items' names (a card's `task/candidate`, a solution's problem, file and name), then
    --lf: only the items whose newest attempt did not pass (or that never ran). Selecting nothing is an
    error."""
    from mini_kv.cluster.batch import item_key

    keyword, last_failed = getattr(args, "keyword", None), getattr(args, "last_failed", False)
    if keyword:
        items = [it for it in items if keyword_matches(keyword, " ".join((it.label, *item_key(it)[1:])))]
    if last_failed:
        items = [it for it in items if _last_status(it) != "PASSED"]
    if not items:
        raise UserError(
            "the selection is empty"
            + (f": -k {keyword!r} matches no candidate or solution" if keyword else "")
            + ("; --lf: every selected item passed last time" if last_failed else "")
        )
    return items


def add_selection_arguments(p) -> None:
    p.add_argument(
        "-k", dest="keyword", metavar="EXPR",
        help="only candidates/solutions whose names match EXPR (pytest's -k: words, and, or, not)",
    )  # fmt: skip
    p.add_argument(
        "-x", "--exitfirst", action="store_true", help="stop at the first candidate or solution that fails"
    )
    p.add_argument("--lf", "--last-failed", dest="last_failed", action="store_true",
                   help="only the candidates/solutions whose last stored attempt did not pass")  # fmt: skip


def run_items(items, where, results: str | None = None, resume: bool = False, args=None) -> list[dict]:
    """The items' results, each one appended to `results` (a JSONL file) as it finishes. With `resume`,
    the items that file already holds are skipped. Ctrl-C prints one line and no traceback. `args`
    brings -k, --lf and -x (select_items; stop after the first item that did not pass)."""
    from mini_kv.cluster.batch import Journal, check_distinct_keys, item_key, run_batch

    if args is not None:
        items = select_items(items, args)
    if results:
        check_distinct_keys(items)
    journal = Journal(Path(results), resume) if results else None
    todo = [it for it in items if journal is None or item_key(it) not in journal.done]
    if len(todo) < len(items):
        err_console.print(
            f"resumed from {results}: {len(items) - len(todo)} of {len(items)} item(s) already done, skipped",
            markup=False,
            soft_wrap=True,
        )
    finished = []

    def on_result(item, result) -> None:
        finished.append(result)
        if journal is not None:
            journal.record(item, result)

    stop_first = bool(getattr(args, "exitfirst", False))
    try:
        with BatchDisplay(len(todo)) as show:
            results = run_batch(todo, where, show, on_result, stop_first)
        if len(results) < len(todo):
            err_console.print(
                f"-x: stopped at the first failure; {len(todo) - len(results)} not run", markup=False
            )
        return results
    except KeyboardInterrupt:
        stored = sum(1 for r in finished if r.attempt)
        err_console.print(
            f"interrupted: {stored} stored, {len(todo) - len(finished)} not run"
            + (f" (run the same command with --resume to go on from {results})" if results else ""),
            markup=False,
            soft_wrap=True,
        )
        raise


def junit_xml(results: list[dict]) -> bytes:
    """The results as JUnit XML, so a CI system shows the verdicts natively: one testsuite per item
    (a card's candidate, a problem's solution), one testcase per case or workload (and per contract
    check); PASSED passes, SKIPPED and NOT_RUN are skipped, every other status fails with its reason."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="mini-kv")
    for result in results:
        suite = ET.SubElement(root, "testsuite", name=result.label)
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="status", value=str(result.status))
        ET.SubElement(props, "property", name="attempt", value=str(result.attempt or ""))
        for name, status, reason in _cases_of(result):
            case = ET.SubElement(suite, "testcase", classname=result.label, name=name)
            if status in ("SKIPPED", "NOT_RUN"):
                ET.SubElement(case, "skipped", message=f"{status}: {reason or ''}".strip())
            elif status != "PASSED":
                ET.SubElement(case, "failure", message=str(status), type=str(status)).text = reason or ""
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _cases_of(result: ItemResult) -> list[tuple[str, str, str | None]]:
    """(name, status, reason) of each case of one item's result, whichever front door produced it."""
    detail, item = result.detail, [("(item)", str(result.status), result.reason)]
    if detail is None:  # no result at all (the worker was lost): the item itself fails
        return item
    if result.kind == BENCH:
        return [(t.workload.uuid, str(t.evaluation.status), t.evaluation.log) for t in detail.traces] or [
            ("(item)", str(result.status), (detail.unavailable or "nothing ran"))
        ]
    res = detail.results
    out = [(c["id"], str(c["status"]), c.get("reason")) for c in res.cases]
    for name, check in res.contract.items():
        status = check.get("status") if isinstance(check, dict) else check
        out.append((name, str(status), (check.get("reason") if isinstance(check, dict) else None)))
    return out or item


def write_junit(results: list[dict], args) -> None:
    path = getattr(args, "junit_xml", None)
    if path:
        from mini_kv.store.atomic import write_bytes

        write_bytes(Path(path), junit_xml(results))


def add_junit_argument(p) -> None:
    p.add_argument(
        "--junit-xml",
        metavar="FILE",
        help="also write the verdicts as JUnit XML (a testcase per case or workload)",
    )


def print_batch(results: list[ItemResult], args) -> int:
    """Each item's report (verify's or bench's), the batch's one-line summary; the worst exit code."""
    write_junit(results, args)
    from mini_kv import report
    from mini_kv.cluster.batch import worst
    from mini_kv.solexec.table import print_report

    # verify of several cards: each item's line names its card (their candidates' ids repeat)
    cards = {r.label.split("/", 1)[0] for r in results if r.kind == VERIFY}
    for result in results:
        if args.json:  # one line an item: verify's summary, bench's status and exit code; why there is none
            line = {"candidate": result.candidate, "item": result.label, "attempt": result.attempt}
            summary = (
                {"status": result.status, "reason": result.reason}
                if result.detail is None
                else result.detail.summary
                if result.kind == VERIFY
                else {"status": result.status, "exit_code": int(result.exit_code)}
            )
            print(json.dumps({**line, **summary, "where": result.where}))
        elif result.detail is None:
            console.print(f"{result.status} {result.label}: {result.reason}")
        elif result.kind == VERIFY:
            name = result.label if len(cards) > 1 else None
            report.print_verify(result.detail, console, verbose=args.verbose, name=name)
        else:
            print_report(result.detail, console, verbose=args.verbose)
    if len(results) > 1 and not args.json:
        console.print(batch_summary_line(results), markup=False, soft_wrap=True)
    return worst(r.exit_code for r in results)


def batch_summary_line(results: list[ItemResult]) -> str:
    """`summary: 2 passed, 1 failed, 0 skipped, 0 not run of 3 items, timing stable in 1 of 2 timed items:
    label STATUS, ...`: by the same rule (report.Tally) as each item's own line."""
    from mini_kv.report import Tally

    # each item's benchmark headline: in verify's summary, in bench's result, none without an attempt
    heads = [
        ((r.detail.summary.get("benchmark") if r.kind == VERIFY else r.detail.benchmark) or {})
        if r.detail is not None
        else {}
        for r in results
    ]
    timed = [t for t in heads if t.get("ran")]
    stable = sum(t.get("stable") is True for t in timed)
    timing = f"timing stable in {stable} of {len(timed)} timed items" if timed else "timing: none"
    if timed and stable < len(timed):
        timing += " (UNSTABLE ones are not ranked)"
    throttled = sum(bool(t.get("throttled")) for t in timed)
    if throttled:
        timing += f", GPU throttled while timing {throttled} item(s) (their summaries say which cases)"
    return f"summary: {Tally.of(r.status for r in results).line('items')}, {timing}: " + ", ".join(
        f"{r.label} {r.status}" + (f" ({r.where['worker']})" if r.where else "") for r in results
    )


def cmd_batch(args) -> int:
    from mini_kv.cli_checks import check_store_writable
    from mini_kv.cluster.cluster import placement_from
    from mini_kv.cluster.manifest import load_manifest

    items = load_manifest(args.manifest, args.artifacts)
    if args.interleave_reference:  # for every item, whatever its entry's options say
        items = [replace(it, opts=replace(it.opts, interleave_reference=True)) for it in items]
    for store in sorted({item.store for item in items}):
        check_store_writable(Path(store))
    results = run_items(items, placement_from(args), args.results, args.resume, args)
    if not results:  # every item was done by an earlier run of the same command
        console.print(f"nothing left to run: every item is in {args.results}", markup=False, soft_wrap=True)
        return 0
    return print_batch(results, args)


def cmd_worker(args) -> int:
    from mini_kv.cluster.cluster import parse_gpus, placement_from, serve

    gpus = parse_gpus(args.gpus)
    where = placement_from(argparse.Namespace(**{**vars(args), "gpus": None, "cluster": None}))
    err_console.print(
        f"mini-kv worker: {len(gpus) or args.workers or 1} worker(s) for {args.address}"
        + (f" on GPU(s) {', '.join(map(str, gpus))}" if gpus else " (CPU)"),
        markup=False,
    )
    serve(args.address, where, gpus, args.workers or 1)
    return 0


def add_resume_argument(p, flag: str) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"skip the items {flag} already holds (after a kill or Ctrl-C) and append the rest; "
        f"without it {flag} starts empty",
    )


def register(sub) -> None:
    """Add `batch` and `worker` to `sub` (the argparse subparsers of cli.build_parser)."""
    from mini_kv.cluster import cluster

    b = sub.add_parser(
        "batch", help="verify and bench everything a manifest lists; one summary, one exit code"
    )
    b.add_argument("manifest", help="batch manifest YAML (schemas/batch.schema.json)")
    b.add_argument("--artifacts", help="artifact store (default: each card's or problem's project's)")
    b.add_argument("--json", action="store_true", help="print one JSON summary line per item")
    b.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    b.add_argument(
        "--results",
        metavar="FILE",
        help="append each item's results here as it finishes (JSONL: a SOL problem's traces in upstream's "
        "format, a task card's candidate as one summary line)",
    )
    add_resume_argument(b, "--results")
    add_junit_argument(b)
    add_selection_arguments(b)
    add_reference_argument(b)
    cluster.add_arguments(b)
    b.set_defaults(func=cmd_batch)

    w = sub.add_parser("worker", help="serve this machine's GPUs (or CPUs) to a Dask scheduler")
    w.add_argument("address", help="the scheduler: tcp://HOST:8786 (tls://... with --tls-*)")
    cluster.add_arguments(w)
    w.set_defaults(func=cmd_worker)
