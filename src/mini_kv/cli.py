"""Command line: one function per command; a command's return value is its exit code."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mini_kv.cli_batch import add_junit_argument, add_selection_arguments, print_batch, run_items
from mini_kv.cli_bench import add_run_arguments
from mini_kv.cli_common import (
    artifacts_dir,
    console,
    console_entry,
    options_from,
    run_command,
    selected_candidates,
)
from mini_kv.errors import ConfigError, ExitCode, UserError


def cmd_doctor(args) -> int:
    from mini_kv import doctor
    from mini_kv.load.task_card import find_project_root

    root = find_project_root(Path.cwd())
    rows = doctor.checks(root / ".build")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        from rich.table import Table

        t = Table(title="mini_kv doctor")
        for col in ("check", "found", "ok", "blocks", "fix"):
            t.add_column(col, overflow="fold")  # a narrow terminal wraps a path; it never cuts it
        for r in rows:
            t.add_row(
                r["name"],
                str(r["value"]),
                "[green]yes[/]" if r["ok"] else "[red]no[/]",
                "" if r["ok"] else r["blocks"],
                "" if r["ok"] else r["fix"],
            )
        console.print(t)
    # doctor informs; only a missing piece that blocks everything is an error
    fatal = [r for r in rows if not r["ok"] and r["blocks"] in ("everything", "every build")]
    return ExitCode.CONFIG if fatal else ExitCode.OK


def cmd_validate_task(args) -> int:
    from mini_kv.load.task_card import load_task_card

    for path in args.cards:
        card = load_task_card(path, import_modules=False)  # checking a card runs none of its code
        kinds = Counter(c.kind for c in card.cases)
        console.print(
            f"{path}: ok (task {card.id} {card.version}, {len(card.candidates)} candidate(s), "
            f"{len(card.cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
            markup=False,
        )
    return ExitCode.OK


def _check_case_filter(card, requested: list[str], device: str, skip_benchmark: bool) -> None:
    """Every --case names a case, and together they select one that runs here: a filter that selects
    nothing would pass vacuously. ConfigError (exit CONFIG) naming what is there otherwise."""
    unknown = [r for r in requested if r not in {c.base_id for c in card.cases} | {c.id for c in card.cases}]
    if unknown:
        raise ConfigError(
            card.path,
            "cases",
            f"--case {', '.join(unknown)}: no such case; known: "
            + ", ".join(sorted({c.base_id for c in card.cases}))
            + f" (or an expanded id such as {card.cases[0].id})",
        )
    picked = [c for c in card.cases if c.id in requested or c.base_id in requested]
    if any(c.runs_on(device) and not (skip_benchmark and c.kind == "bench") for c in picked):
        return
    why = (
        "only bench cases, and --skip-benchmark is set"
        if skip_benchmark and all(c.kind == "bench" for c in picked)
        else f"no case that runs on {device}"
    )
    raise ConfigError(
        card.path,
        "cases",
        f"--case {', '.join(requested)} selects {why}; cases that run on "
        f"{device}: " + ", ".join(sorted({c.base_id for c in card.cases if c.runs_on(device)})),
    )


def cmd_verify(args) -> int:
    from mini_kv import jail
    from mini_kv.cli_checks import check_store_writable
    from mini_kv.cluster.batch import VERIFY, Item
    from mini_kv.cluster.cluster import placement_from
    from mini_kv.environment import pick_device
    from mini_kv.load.task_card import load_task_card
    from mini_kv.pipeline import VerifyOptions

    if args.prebuilt and len(args.task) > 1:
        raise UserError(f"--prebuilt {args.prebuilt}: one library is one card's candidate; give one --task")
    where = placement_from(args)
    # the device is picked here only for the --case check: picking one may import torch
    device = ("cuda:0" if where.gpus else pick_device(args.device)) if args.case else None
    items = []
    for task in args.task:  # several cards: one batch, their builds and checks overlapping
        card = load_task_card(task, import_modules=False)  # its modules import beside the worker's start
        if args.case:
            _check_case_filter(card, args.case, device, args.skip_benchmark)
        store = artifacts_dir(args, Path(card.project_root))
        check_store_writable(store)
        opts = options_from(
            VerifyOptions,
            args,
            case_filter=args.case or [],
            sandbox=jail.mode_from(args.sandbox, jail.project_setting(Path(card.project_root))),
        )
        jail.resolve(opts.sandbox)  # --sandbox required on a machine without every layer: exit 2 now
        items += [
            Item(VERIFY, f"{card.id}/{c.id}", task, c.id, opts, str(store))
            for c in selected_candidates(card, args.candidate)
        ]
    return print_batch(run_items(items, where, args=args), args)


def build_parser() -> argparse.ArgumentParser:
    from mini_kv import cli_checks as checks
    from mini_kv.cluster import cluster

    p = argparse.ArgumentParser(prog="mini-kv", description="Verify and benchmark custom GPU operators.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="report the toolchain, GPU and what each missing piece blocks")
    d.add_argument("--json", action="store_true", help="print the checks as a JSON list instead of the table")
    d.set_defaults(func=cmd_doctor)

    v = sub.add_parser("validate-task", help="check task cards without compiling anything")
    v.add_argument(
        "cards",
        nargs="+",
        metavar="CARD",
        help="task card YAML file(s) to check (schema, fields, import paths, candidate paths, case ids)",
    )
    v.set_defaults(func=cmd_validate_task)

    vr = sub.add_parser("verify", help="compile, check and benchmark a candidate; archive an attempt")
    vr.add_argument(
        "--task",
        required=True,
        action="append",
        help="task card YAML (repeatable: the cards' candidates run as one batch)",
    )
    add_junit_argument(vr)
    add_selection_arguments(vr)
    vr.add_argument(
        "--candidate", action="append", help="candidate id or glob (repeatable); default: the card's default"
    )
    vr.add_argument(
        "--skip-benchmark", action="store_true", help="only compile, correctness, opcheck and gradcheck"
    )
    vr.add_argument("--bench-all", action="store_true", help="also time every core case")
    vr.add_argument("--case", action="append", help="run only this case id (repeatable)")
    vr.add_argument(
        "--env-tag",
        help="label what mini_kv cannot detect but that changes timings (power cap, "
        "clocks, image); part of the environment key (default: $MINI_KV_ENV_TAG)",
    )
    vr.add_argument(
        "--prebuilt", type=checks.existing_file, help="use this prebuilt library instead of the JIT build"
    )
    vr.add_argument("--json", action="store_true", help="print one JSON summary line per candidate")
    add_run_arguments(vr, sol=False)
    cluster.add_arguments(vr)
    vr.set_defaults(func=cmd_verify)
    from mini_kv import cli_attempts, cli_batch, cli_bench, cli_new, cli_profile, cli_store
    from mini_kv.html_report import cli as report_cli

    for command in (cli_new, cli_store, cli_attempts, cli_bench, cli_batch, cli_profile, report_cli):
        command.register(sub)  # in the order `mini-kv --help` lists them
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


def entry() -> None:
    """`mini-kv` and `python -m mini_kv`."""
    console_entry(main)
