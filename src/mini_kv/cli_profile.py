"""Profile commands: profile, compare-profiles. `register(sub)` adds them to the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.cli_common import artifacts_dir, console, err_console, options_from, selected_candidates
from mini_kv.codec import to_json
from mini_kv.errors import ExitCode, UserError
from mini_kv.settings import DEFAULTS
from mini_kv.status import ProfileStatus
from mini_kv.tables import num

if TYPE_CHECKING:
    from mini_kv.profile.ab import ABTiming
    from mini_kv.profile.compare import Comparison


def _fmt_summary(s: dict) -> str:
    from mini_kv.profile.compare import fmt

    stalls = ", ".join(f"{t['reason']} {t['value']:.2f}" for t in s["top_stalls"][:3])
    return (
        f"grid {fmt(s['grid_size'], 'int')} x block {fmt(s['block_size'], 'int')}, waves/SM "
        f"{fmt(s['waves_per_sm'], 'float')}, achieved occupancy {fmt(s['achieved_occupancy_pct'], 'pct')}%, "
        f"DRAM {fmt(s['dram_throughput_pct'], 'pct')}% ({fmt(s['dram_bandwidth_Bps'], 'GBps')} GB/s), "
        f"top stalls: {stalls}; ncu replay duration {fmt(s['duration_ns'], 'us')} µs (not a latency)"
    )


def cmd_profile(args) -> int:
    from mini_kv.cli_checks import check_store_writable
    from mini_kv.load.task_card import load_task_card
    from mini_kv.profile.capture import ProfileOptions, profile_candidate

    if bool(args.task) == bool(args.solution):
        raise UserError(
            "profile: give --task (a task card's candidate) or --solution (a SOL-ExecBench solution.json "
            "or bench attempt), not both or neither"
        )
    opts = options_from(ProfileOptions, args)
    if args.solution:
        from mini_kv.profile import sol

        if args.candidate or args.prebuilt:
            raise UserError("--candidate and --prebuilt are for --task; --solution names what is profiled")
        from mini_kv.solexec.run import BenchOptions, load_problem

        prob = load_problem(args.problem or str(Path(args.solution).parent), BenchOptions(args.solution))
        sol.plan(prob, opts)  # a bad --case, --kernel or --warmup: before anything is built or written
        check_store_writable(artifacts_dir(args))
        with console.status(f"profiling {prob.id}/{prob.default_candidate}") as status:
            res = sol.profile_solution(prob, opts, progress=status.update)
    else:
        card = load_task_card(args.task)
        cands = selected_candidates(card, [args.candidate] if args.candidate else [])
        if len(cands) != 1:
            raise UserError(
                f"--candidate {args.candidate!r} matches {len(cands)} candidates; profile one at a time"
            )
        check_store_writable(artifacts_dir(args, Path(card.project_root)))  # the profile is archived there
        with console.status(f"profiling {card.id}/{cands[0].id}") as status:
            res = profile_candidate(card, cands[0], opts, progress=status.update)
    if args.json:
        print(json.dumps(to_json(res)))
    elif res.status == ProfileStatus.OK:
        console.print(
            f"profile {res.path}\n  OK {res.candidate} on {res.case}: " + _fmt_summary(res.summary),
            soft_wrap=True,
        )
    else:
        r = res.reason
        err_console.print(f"profile {res.path}\n  [red]FAILED[/] {r.code}: {r.message}", soft_wrap=True)
        tail = r.details.get("log_tail")
        if tail:
            err_console.print(tail[-1500:], markup=False, soft_wrap=True)
    return res.exit_code


def _print_comparison(result: Comparison, timing: ABTiming, console) -> None:
    from rich.table import Table

    from mini_kv.profile.compare import fmt

    a, b = result.A, result.B
    console.print(
        f"A: {a.candidate} ({a.profile_id})\nB: {b.candidate} ({b.profile_id})\n"
        f"task {a.task}, case {a.case}: same environment, same inputs",
        soft_wrap=True,
    )

    def show(title: str, heads: tuple, rows) -> None:
        t = Table(*heads, title=title)
        for r in rows:
            t.add_row(*r)
        console.print(t)

    ratio = lambda x: "" if x is None else f"{x:.3g}x"  # noqa: E731
    show(
        "Nsight Compute: what explains the difference",
        ("metric", "A", "B", "B/A"),
        ((r.label, fmt(r.A, r.kind), fmt(r.B, r.kind), ratio(r.ratio)) for r in result.rows),
    )
    show(
        "top warp stall reasons (warps stalled per issue-active cycle)",
        ("stall reason", "A", "B"),
        ((r.reason, num(r.A, ".2f"), num(r.B, ".2f")) for r in result.stalls),
    )
    if not timing.ran:
        console.print(f"A/B timing: not run: {timing.reason}", soft_wrap=True)
        return
    p50, p95, ratio = timing.p50_us, timing.p95_us, timing.b_over_a
    console.print(
        f"A/B timing (one jailed subject, judged outside it; order alternating over {timing.repeats} repeats x "
        f"{timing.samples_per_repeat} samples; {timing.method}: {timing.timer}):\n"
        f"  A {a.candidate}: P50 {p50['A']:.2f} µs, P95 {p95['A']:.2f} µs\n"
        f"  B {b.candidate}: P50 {p50['B']:.2f} µs, P95 {p95['B']:.2f} µs\n"
        f"  B/A latency {ratio:.3f}x (speedup of B over A {1 / ratio:.2f}x)",
        soft_wrap=True,
    )


def cmd_compare_profiles(args) -> int:
    from mini_kv.profile.ab import ABTiming, run_ab
    from mini_kv.profile.compare import compare
    from mini_kv.store.atomic import write_json

    result, a, b = compare(args.a, args.b, artifacts_dir(args))
    sol = "workload" in (a.case.kind, b.case.kind)
    timing = (
        ABTiming(False, "--no-timing")
        if args.no_timing
        else ABTiming(
            False,
            "SOL-ExecBench profiles: their latency is `bench` (against the reference, or a promoted "
            "baseline's own solution in the same run)",
        )
        if sol
        else run_ab(a, b, repeats=args.repeats, samples=args.samples)
    )
    _print_comparison(result, timing, console)
    if args.json:
        write_json(Path(args.json), {"schema_version": 1, **to_json(result), "timing": to_json(timing)})
    return ExitCode.BENCHMARK if timing.error else ExitCode.OK


def register(sub) -> None:
    """Add the profile subcommands to `sub` (the argparse subparsers of cli.build_parser)."""
    from mini_kv import cli_checks as checks

    p = sub.add_parser(
        "profile", help="Nsight Compute profile of one candidate on one case (artifacts/profiles/)"
    )
    p.add_argument("--task", help="task card YAML")
    p.add_argument("--solution", help="or a SOL-ExecBench solution.json")
    p.add_argument("--problem", help="with --solution: the problem directory (default: the solution's own)")
    p.add_argument("--candidate", help="candidate id (default: the card's default)")
    p.add_argument(
        "--case", help="case id or base id (default: the card's first bench case); a workload uuid"
    )
    p.add_argument(
        "--warmup",
        type=checks.nonnegative_int,
        default=DEFAULTS.profile_warmup,
        help=f"candidate launches skipped before the profiled one (default {DEFAULTS.profile_warmup})",
    )
    p.add_argument("--kernel", help="profile only this one of the candidate's __global__ kernels")
    p.add_argument(
        "--seed-salt",
        default=DEFAULTS.profile_salt,
        help="salt of the input seed (default: the fixed "
        "profile salt, so every candidate's profile sees the same inputs)",
    )
    p.add_argument("--prebuilt", help="use this prebuilt library instead of the JIT build")
    p.add_argument("--ncu", help="path of ncu (default: $MINI_KV_NCU, then PATH, then $CUDA_HOME/bin)")
    p.add_argument(
        "--timeout",
        type=checks.positive_float,
        default=DEFAULTS.ncu_timeout_s,
        help=f"seconds for the ncu run (default {DEFAULTS.ncu_timeout_s:g})",
    )
    p.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.set_defaults(func=cmd_profile)

    c = sub.add_parser(
        "compare-profiles", help="refuse incomparable profiles; show metric deltas beside an A/B timing"
    )
    c.add_argument("a", help="profile directory or id under artifacts/profiles/ (A, the baseline)")
    c.add_argument("b", help="profile directory or id (B)")
    c.add_argument("--no-timing", action="store_true", help="skip the A/B timing")
    c.add_argument(
        "--repeats",
        type=checks.positive_int,
        default=DEFAULTS.ab_repeats,
        help="A/B repeats, order alternating",
    )
    c.add_argument(
        "--samples", type=checks.positive_int, default=DEFAULTS.ab_samples, help="A/B samples per repeat"
    )
    c.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    c.add_argument("--json", metavar="FILE", help="also write the comparison and timing as JSON")
    c.set_defaults(func=cmd_compare_profiles)
