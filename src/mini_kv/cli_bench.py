"""`bench`: evaluate a SOL-ExecBench solution. `register(sub)` adds it to mini-kv; `main()` is the
`hpc-bench` and `sol-execbench` console scripts, which take the same arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mini_kv.cli_batch import add_junit_argument, add_resume_argument, add_selection_arguments
from mini_kv.cli_common import (
    VERBOSE_HELP,
    add_reference_argument,
    artifacts_dir,
    console,
    console_entry,
    options_from,
    run_command,
)
from mini_kv.errors import ExitCode, UserError
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
    p.add_argument("--keep-staging", action="store_true", help="keep the staged sources and worker log")
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
    add_run_arguments(p, sol=True)


def add_run_arguments(p, sol: bool) -> None:
    """The options verify and bench (`sol`) both take. A task card carries its own timing settings, so
    verify's default is None (settings.py: the card's, else the default); bench's is the default.
    docs/integrity.md says what --sandbox and the integrity options defend against."""
    from mini_kv import cli_checks as checks

    def default(value):
        return value if sol else None

    card = "" if sol else "the card's, else "

    def setting(flag: str, parse, value: float, what: str) -> None:
        """An option whose default is a setting of settings.py."""
        p.add_argument(flag, type=parse, default=default(value), help=f"{what} (default: {card}{value:g})")

    # a SOL workload's budget also covers its correctness rounds (settings.sol_budget_factor)
    factor = DEFAULTS.sol_budget_factor if sol else 1.0
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    p.add_argument("--device", type=checks.device, help="cpu, cuda or cuda:N (default: cuda when available)")
    setting("--compile-timeout", checks.positive_float, DEFAULTS.compile_s, "seconds for the build")
    if sol:
        what = "seconds per workload, correctness rounds and timing together"
        setting("--timeout", checks.positive_float, DEFAULTS.sol_timeout_s, what)
    else:
        setting("--timeout", checks.positive_float, DEFAULTS.case_s, "seconds per case")
    p.add_argument(
        "--samples",
        type=checks.positive_int,
        help=f"a fixed count of timed calls per repeat (default: {card}adaptive, until the median's 95%% CI "
        "is within --target-rel-ci; docs/benchmarking.md)",
    )
    p.add_argument(
        "--budget",
        type=checks.positive_float,
        help="seconds per "
        + ("workload for correctness rounds and timing together" if sol else "bench case, warm-up and timing")
        + f" (default: {DEFAULTS.cuda.budget_s * factor:g} on CUDA, "
        f"{DEFAULTS.cpu.budget_s * factor:g} on CPU; at most half of --timeout)",
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
        default=DEFAULTS.give_up_after,
        metavar="K",
        help=f"after K TIMEOUTs in a row, record the remaining cases NOT_RUN (default {DEFAULTS.give_up_after}; "
        "0: never)",
    )
    p.add_argument(
        "--method",
        default=default("auto"),
        choices=["auto", "cupti", "graph", "events", "wallclock"],
        help=f"timing method (default: {card}auto: cupti on CUDA, falling back to graph, events; wallclock on CPU)",
    )
    p.add_argument(
        "--l2",
        choices=["hot", "cold"],
        help="L2 cache state for timing, cold: flush + fresh inputs (default: "
        + ("cold on CUDA, as upstream)" if sol else f"the card's, else {DEFAULTS.l2})"),
    )
    setting(
        "--max-cv", checks.fraction, DEFAULTS.max_cv, "stability gate: max robust CV of the P50s, a fraction"
    )
    what = "stability gate: max robust CV of the candidate's P95s, a fraction"
    setting("--max-p95-cv", checks.fraction, DEFAULTS.max_p95_cv, what)
    p.add_argument("--seed-salt", help="reuse a recorded seed salt (default: a fresh secret per run)")
    p.add_argument("--artifacts", help="artifact store for the attempt (default: <project>/artifacts)")
    p.add_argument(
        "--memory-limit",
        dest="memory_limit_gb",
        type=checks.positive_float,
        metavar="GB",
        help="memory cap of a worker: its jail's memory cgroup where the machine has one (GPU runs too), and each worker process's address space on CPU, its data segment on a GPU (default: half the machine's memory)",
    )
    p.add_argument(
        "--sandbox",
        choices=("auto", "required", "off"),
        help="the jail around candidate code and its build: auto (default: every layer this machine "
        "allows, a warning names what is missing), required (exit 2 unless every layer is active), off "
        "(recorded); also $MINI_KV_SANDBOX and [tool.mini-kv] sandbox in the project's pyproject.toml; "
        "see docs/security.md",
    )
    p.add_argument(
        "--require-own-kernels",
        action="store_true",
        default=DEFAULTS.require_own_kernels,
        help="refuse a candidate whose calls ran only library kernels (aten ops on CPU, cuBLAS/aten/cuDNN "
        "kernels on CUDA) and none of its own: LIBRARY_DELEGATION, a REWARD_HACK (docs/integrity.md)",
    )
    add_reference_argument(p)
    if not sol:
        return
    p.add_argument(
        "--extra-workloads",
        type=checks.nonnegative_int,
        default=DEFAULTS.extra_workloads,
        metavar="N",
        help="also run N unseen workloads drawn from the definition's var axes (within the shipped "
        "workloads' range), so a solution specialised to the shipped shapes meets others; recorded in "
        f"the attempt (default {DEFAULTS.extra_workloads})",
    )
    p.add_argument(
        "--extra-workloads-seed",
        type=checks.nonnegative_int,
        default=DEFAULTS.extra_workloads_seed,
        metavar="SEED",
        help=f"the seed --extra-workloads draws with (default {DEFAULTS.extra_workloads_seed}; recorded)",
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
        opts = options_from(BenchOptions, args, solution=solution, sandbox=mode)
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
