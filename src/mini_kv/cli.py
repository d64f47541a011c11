"""Command line: one function per command; a command's return value is its exit code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mini_kv.cli_batch import add_junit_argument, add_selection_arguments
from mini_kv.cli_common import (
    VERBOSE_HELP,
    add_integrity_arguments,
    add_reference_argument,
    add_sandbox_argument,
    artifacts_dir,
    console,
    console_entry,
    options_from,
    run_command,
    selected_candidates,
)
from mini_kv.errors import ConfigError, ExitCode
from mini_kv.settings import DEFAULTS


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
        kinds: dict[str, int] = {}
        for c in card.cases:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        console.print(
            f"{path}: ok (task {card.id} {card.version}, {len(card.candidates)} candidate(s), "
            f"{len(card.cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
            markup=False,
        )
    return ExitCode.OK


def _check_case_names(card, requested: list[str]) -> None:
    known = {c.base_id for c in card.cases} | {c.id for c in card.cases}
    unknown = [r for r in requested if r not in known]
    if unknown:
        raise ConfigError(
            card.path,
            "cases",
            f"--case {', '.join(unknown)}: no such case; known: "
            + ", ".join(sorted({c.base_id for c in card.cases}))
            + " (or an expanded id such as "
            + f"{card.cases[0].id})",
        )


def _check_cases_run_here(card, requested: list[str], device: str, skip_benchmark: bool) -> None:
    """A --case filter that selects nothing here would pass vacuously: exit CONFIG, naming what runs."""
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

    card = load_task_card(args.task)
    where = placement_from(args)
    device = "cuda:0" if where.gpus else pick_device(args.device)
    if args.case:  # every --case names a case, and together they select one that runs here (else exit CONFIG)
        _check_case_names(card, args.case)
        _check_cases_run_here(card, args.case, device, args.skip_benchmark)
    store = artifacts_dir(args, Path(card.project_root))
    check_store_writable(store)
    opts = options_from(
        VerifyOptions,
        args,
        case_filter=args.case or [],
        memory_limit_gb=args.memory_limit,
        sandbox=jail.mode_from(args.sandbox, jail.project_setting(Path(card.project_root))),
    )
    jail.resolve(opts.sandbox)  # --sandbox required on a machine without every layer: exit 2 now
    items = [
        Item(VERIFY, f"{card.id}/{c.id}", args.task, c.id, opts, str(store))
        for c in selected_candidates(card, args.candidate)
    ]
    from mini_kv.cli_batch import print_batch, run_items

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
    vr.add_argument("--task", required=True, help="task card YAML")
    add_junit_argument(vr)
    add_selection_arguments(vr)
    vr.add_argument(
        "--candidate", action="append", help="candidate id or glob (repeatable); default: the card's default"
    )
    vr.add_argument("--device", type=checks.device, help="cpu, cuda or cuda:N (default: cuda when available)")
    vr.add_argument(
        "--skip-benchmark", action="store_true", help="only compile, correctness, opcheck and gradcheck"
    )
    vr.add_argument(
        "--method",
        choices=["auto", "events", "graph", "cupti", "wallclock"],
        help="timing method (default: the card's; auto = cupti on CUDA, falling back to graph, events)",
    )
    vr.add_argument(
        "--l2", choices=["hot", "cold"], help="L2 cache state for timing (cold: flush + fresh inputs)"
    )
    vr.add_argument(
        "--max-cv",
        type=checks.fraction,
        help=f"stability gate: max robust CV of the P50s (fraction, default {DEFAULTS.max_cv})",
    )
    vr.add_argument(
        "--max-p95-cv",
        type=checks.fraction,
        help=f"stability gate: max robust CV of the candidate's P95s (fraction, default {DEFAULTS.max_p95_cv})",
    )
    vr.add_argument(
        "--samples",
        type=checks.positive_int,
        help="a fixed count of timed calls per repeat (default: the card's; adaptive unless it gives one)",
    )
    from mini_kv.cli_bench import add_sampling_arguments

    add_sampling_arguments(vr, "seconds of warm-up and timing per bench case")
    vr.add_argument("--bench-all", action="store_true", help="also time every core case")
    vr.add_argument("--case", action="append", help="run only this case id (repeatable)")
    vr.add_argument("--compile-timeout", type=checks.positive_float, help="seconds for the build")
    vr.add_argument("--timeout", type=checks.positive_float, help="seconds per case")
    vr.add_argument(
        "--memory-limit",
        type=checks.positive_float,
        metavar="GB",
        help="address-space cap of a CPU worker (default: half the machine's memory)",
    )
    vr.add_argument(
        "--env-tag",
        help="label what mini_kv cannot detect but that changes timings (power cap, "
        "clocks, image); part of the environment key (default: $MINI_KV_ENV_TAG)",
    )
    add_sandbox_argument(vr)
    add_integrity_arguments(vr, sol=False)
    add_reference_argument(vr)
    vr.add_argument(
        "--prebuilt", type=checks.existing_file, help="use this prebuilt library instead of the JIT build"
    )
    vr.add_argument("--seed-salt", help="reuse a recorded seed salt (default: a fresh secret per run)")
    vr.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    vr.add_argument("--json", action="store_true", help="print one JSON summary line per candidate")
    vr.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    cluster.add_arguments(vr)
    vr.set_defaults(func=cmd_verify)
    from mini_kv import cli_attempts, cli_batch, cli_bench, cli_new, cli_store

    cli_new.register(sub)
    cli_store.register(sub)
    cli_attempts.register(sub)
    cli_bench.register(sub)
    cli_batch.register(sub)
    from mini_kv import cli_profile

    cli_profile.register(sub)
    from mini_kv.html_report import cli as report_cli

    report_cli.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


def entry() -> None:
    """`mini-kv` and `python -m mini_kv`."""
    console_entry(main)
