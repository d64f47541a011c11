"""`bench`: evaluate a SOL-ExecBench solution. `register(sub)` adds it to mini-kv; `main()` is the
`hpc-bench` and `sol-execbench` console scripts, which take the same arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mini_kv.cli_batch import add_junit_argument, add_resume_argument, add_selection_arguments
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
)
from mini_kv.errors import ExitCode
from mini_kv.settings import DEFAULTS


def add_arguments(p) -> None:
    from mini_kv import cli_checks as checks

    p.add_argument("problem_dir", nargs="?", help="directory holding definition.json and workload.jsonl")
    p.add_argument(
        "--solution",
        required=True,
        nargs="+",
        help="solution.json (sources inline or beside it); several: one batch, one summary",
    )
    p.add_argument("--definition", help="definition.json (default: PROBLEM_DIR/definition.json)")
    p.add_argument("--workload", help="workload.jsonl (default: PROBLEM_DIR/workload.jsonl)")
    p.add_argument(
        "-o",
        "--output",
        help="write the traces here as JSONL (upstream's trace layout), each solution's as it finishes",
    )
    add_resume_argument(p, "-o")
    add_junit_argument(p)
    add_selection_arguments(p)
    p.add_argument("--json", action="store_true", help="print the traces as JSONL instead of the table")
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    p.add_argument("--keep-staging", action="store_true", help="keep the staged sources and worker log")
    p.add_argument(
        "--compile-timeout",
        type=checks.positive_float,
        default=DEFAULTS.compile_s,
        help=f"seconds for a C++ build (default {DEFAULTS.compile_s:g})",
    )
    p.add_argument(
        "--timeout",
        type=checks.positive_float,
        default=DEFAULTS.sol_timeout_s,
        help=f"seconds per workload, correctness rounds and timing together (default {DEFAULTS.sol_timeout_s:g})",
    )
    p.add_argument("--device", type=checks.device, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument(
        "--rounds",
        type=checks.positive_int,
        default=DEFAULTS.sol_rounds,
        help=f"correctness rounds with fresh inputs (default {DEFAULTS.sol_rounds})",
    )
    p.add_argument(
        "--warmup",
        type=checks.nonnegative_int,
        default=DEFAULTS.sol_warmup,
        help=f"untimed calls before timing (default {DEFAULTS.sol_warmup})",
    )
    p.add_argument(
        "--repeats",
        type=checks.positive_int,
        default=DEFAULTS.sol_repeats,
        help="timed repeats, candidate and reference alternating "
        f"first (default {DEFAULTS.sol_repeats}; with one, the first side alternates across workloads)",
    )
    p.add_argument(
        "--samples",
        type=checks.positive_int,
        help="a fixed count of timed calls per repeat (default: adaptive, until the median's 95%% CI is "
        "within --target-rel-ci; docs/benchmarking.md)",
    )
    add_sampling_arguments(
        p, "seconds per workload for correctness rounds and timing together", with_correctness=True
    )
    p.add_argument(
        "--method",
        default="auto",
        choices=["auto", "cupti", "graph", "events", "wallclock"],
        help="timing method (auto: cupti on CUDA, falling back to graph, events; wallclock on CPU)",
    )
    p.add_argument("--l2", choices=["hot", "cold"], help="L2 state (default: cold on CUDA, as upstream)")
    p.add_argument(
        "--max-cv",
        type=checks.fraction,
        default=DEFAULTS.max_cv,
        help=f"stability gate: max robust CV of the P50s (fraction, default {DEFAULTS.max_cv}; a baseline must be stable)",
    )
    p.add_argument(
        "--max-p95-cv",
        type=checks.fraction,
        default=DEFAULTS.max_p95_cv,
        help=f"stability gate on the P95s (default {DEFAULTS.max_p95_cv})",
    )
    p.add_argument("--seed-salt", help="reuse a recorded seed salt (default: a fresh secret per run)")
    p.add_argument("--artifacts", help="artifact store for the attempt (default: <project>/artifacts)")
    p.add_argument(
        "--memory-limit", type=checks.positive_float, metavar="GB", help="address-space cap of a CPU worker"
    )
    add_sandbox_argument(p)
    add_integrity_arguments(p, sol=True)
    add_reference_argument(p)


def add_sampling_arguments(p, budget_what: str, with_correctness: bool = False) -> None:
    """The adaptive-sampling and give-up options both front doors share (verify and bench);
    `with_correctness`: the budget covers SOL's correctness rounds too (settings.sol_budget_factor)."""
    factor = DEFAULTS.sol_budget_factor if with_correctness else 1.0
    budget_defaults = (
        f"{DEFAULTS.cuda.budget_s * factor:g} on CUDA, {DEFAULTS.cpu.budget_s * factor:g} on CPU"
    )
    from mini_kv import cli_checks as checks
    from mini_kv.runner import DEFAULT_GIVE_UP_AFTER

    p.add_argument(
        "--budget",
        type=checks.positive_float,
        help=f"{budget_what} (default: {budget_defaults}; at most half of --timeout)",
    )
    p.add_argument(
        "--target-rel-ci",
        type=checks.fraction,
        help="adaptive sampling stops when the median's 95%% CI half-width is within this fraction "
        f"of it (default {DEFAULTS.cuda.target_rel_ci} on CUDA, {DEFAULTS.cpu.target_rel_ci} on CPU)",
    )
    p.add_argument(
        "--give-up-after",
        type=checks.nonnegative_int,
        default=DEFAULT_GIVE_UP_AFTER,
        metavar="K",
        help=f"after K TIMEOUTs in a row, record the remaining cases NOT_RUN (default {DEFAULT_GIVE_UP_AFTER}; "
        "0: never)",
    )


def cmd_bench(args) -> int:
    from mini_kv import jail
    from mini_kv.cli_batch import print_batch, run_items, write_junit
    from mini_kv.cluster.batch import BENCH, Item, worst
    from mini_kv.cluster.cluster import Placement, placement_from
    from mini_kv.solexec import traces
    from mini_kv.solexec.run import BenchOptions

    where = placement_from(args) if hasattr(args, "cluster") else Placement()  # hpc-bench: here
    items = []
    mode = jail.mode_from(args.sandbox, jail.project_setting(Path.cwd()))
    jail.resolve(mode)  # --sandbox required on a machine without every layer: exit 2 now
    for solution in args.solution:
        opts = options_from(
            BenchOptions,
            args,
            solution=solution,
            memory_limit_gb=args.memory_limit,
            sandbox=mode,
        )
        label = f"{args.problem_dir or 'bench'}:{solution}"
        items.append(Item(BENCH, label, args.problem_dir, None, opts, str(_check_outputs(args, opts))))
    results = run_items(items, where, args.output, getattr(args, "resume", False), args)
    lines = "".join(traces.dumps(t) + "\n" for r in results if r.detail is not None for t in r.detail.traces)
    if not results:  # every solution was done by an earlier run of the same command
        console.print(
            f"nothing left to run: every solution is in {args.output}", markup=False, soft_wrap=True
        )
        return 0
    if not args.json:
        code = print_batch(results, args)
        if args.output:
            count = Path(args.output).read_text(encoding="utf-8").count("\n")
            console.print(f"traces: {args.output} ({count})", markup=False, soft_wrap=True)
        return code
    write_junit(results, args)
    sys.stdout.write(lines)  # --json: the traces as JSONL, as upstream; an item without any is an error
    for r in results:
        if r.detail is None:
            print(f"{r.status} {r.label}: {r.reason}", file=sys.stderr)
    return worst(r.exit_code for r in results)


def _check_outputs(args, opts) -> Path:
    """The attempt store (returned) and the -o file's directory must be writable before anything is built
    or run."""
    from mini_kv.cli_checks import check_store_writable, store_write_problem
    from mini_kv.errors import UserError
    from mini_kv.solexec.run import bench_project_root

    store = artifacts_dir(args, bench_project_root(opts))
    check_store_writable(store)
    if args.output:
        out = Path(args.output)
        problem = "it is a directory" if out.is_dir() else store_write_problem(out.parent)
        if problem:
            raise UserError(f"-o {out}: cannot write the traces there: {problem}; nothing was run")
    return store


def register(sub) -> None:
    """Add `bench` to `sub` (the argparse subparsers of cli.build_parser)."""
    from mini_kv.cluster import cluster

    p = sub.add_parser("bench", help="evaluate a SOL-ExecBench solution: correctness rounds, timing, traces")
    add_arguments(p)
    cluster.add_arguments(p)
    p.set_defaults(func=cmd_bench)


def main(argv: list[str] | None = None) -> int:
    """`hpc-bench PROBLEM_DIR --solution S.json ...`: `mini-kv bench` under another name."""
    parser = argparse.ArgumentParser(prog="hpc-bench", description="Evaluate a SOL-ExecBench solution.")
    add_arguments(parser)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse's usage errors
        return int(exc.code) if isinstance(exc.code, int) else int(ExitCode.CONFIG)
    return run_command(cmd_bench, args)


def entry() -> None:
    """`hpc-bench` and `sol-execbench`."""
    console_entry(main)


if __name__ == "__main__":
    entry()
