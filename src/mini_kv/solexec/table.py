"""The bench report: upstream's table (# | Status | Latency (ms) | Ref (ms) | Speedup | Max Abs Err | Max Rel Err),
"N/M workloads passed", then the logs of the workloads that failed for a reason other than their numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape

from mini_kv.report import Tally, jail_note, kernels_line, print_attempt, print_regression, timing_word
from mini_kv.solexec import traces
from mini_kv.status import Status
from mini_kv.tables import Column, fitted_tables, verbose_details

if TYPE_CHECKING:
    from mini_kv.solexec.run import BenchResult

STATUS_STYLE = {Status.PASSED: "green", Status.INCORRECT_NUMERICAL: "yellow"}


def _errors(corr: traces.Correctness | None) -> tuple[str, str]:
    if corr is None:
        return "", ""
    if corr.has_nan:
        return "NaN", "NaN"
    if corr.has_inf:
        return "Inf", "Inf"
    return f"{corr.max_absolute_error:.2e}", f"{corr.max_relative_error:.2e}"


def traces_table(trace_list: tuple[traces.Trace, ...], width: int = 200):
    """Upstream's columns; statuses and numbers never cut (split over two tables in a narrow console)."""
    cols = [
        Column("#", style="dim"),
        Column("Status"),
        *(Column(c, "right") for c in ("Latency (ms)", "Ref (ms)", "Speedup", "Max Abs Err", "Max Rel Err")),
    ]
    rows = []
    for i, tr in enumerate(trace_list):
        ev = tr.evaluation
        perf = ev.performance
        lat, ref, speed = (
            ("", "", "")
            if perf is None
            else (f"{perf.latency_ms:.3f}", f"{perf.reference_latency_ms:.3f}", f"{perf.speedup_factor:.2f}x")
        )
        style = STATUS_STYLE.get(ev.status, "red")
        rows.append([str(i), f"[{style}]{ev.status}[/]", lat, ref, speed, *_errors(ev.correctness)])
    tables = fitted_tables("Evaluation Results", cols, rows, width, show_lines=True)
    return tables[0] if len(tables) == 1 else Group(*tables)


def print_report(result: BenchResult, console: Console, verbose: bool = False) -> None:
    trace_list = result.traces
    console.print(f"[bold]Problem:[/]  {escape(result.definition)}")
    console.print(f"[bold]Solution:[/] {escape(result.solution)}")
    console.print(f"[bold]Workloads:[/] {len(trace_list)}  (device {result.device})")
    if verbose:
        _print_details(result, console)
    console.print(traces_table(trace_list, width=console.width))
    if verbose:
        for uuid, census in result.kernels.items():
            console.print(escape(kernels_line(uuid, census)), soft_wrap=True)
    console.print("\n" + escape(bench_summary_line(result)), soft_wrap=True)
    for skip in result.skipped:
        console.print(f"[yellow]skipped[/] {escape(skip.id)}: {escape(skip.reason or '')}")
    if result.unavailable:
        console.print(f"[red]unavailable here:[/] {escape(result.unavailable)}")
    failed = [
        (i, t.evaluation)
        for i, t in enumerate(trace_list)
        if t.evaluation.status not in (Status.PASSED,) and t.evaluation.log
    ]
    if failed and not result.unavailable:
        _print_logs(failed, console, verbose)
    if result.regression:
        print_regression(result.regression, console)
    print_attempt(result.attempt, console)
    if result.index_warning:
        console.print(f"[yellow]index not updated:[/] {escape(result.index_warning)}")


def _print_logs(failed: list[tuple[int, traces.Evaluation]], console: Console, verbose: bool) -> None:
    """The failed workloads' logs (the first three unless `verbose`); a log already shown (the same
    failure on every workload, as a reference that cannot run here) is said once and referred back to."""
    shown = failed if verbose else failed[:3]
    console.print(f"\n[bold red]Logs ({len(failed)}):[/]")
    first_with: dict[str, int] = {}
    for i, ev in shown:
        console.print(f"\n[bold]Workload {i}[/] ([red]{ev.status}[/]):")
        log = ev.log.rstrip()
        if log in first_with:
            console.print(f"the same log as workload {first_with[log]}")
            continue
        first_with[log] = i
        console.print(escape(log if verbose else log[-2000:]))
    if len(shown) < len(failed):
        console.print(f"\n({len(failed) - len(shown)} more; -v shows every log, -o writes them all)")


def bench_summary_line(result: BenchResult) -> str:
    """`11 passed, 0 failed, 3 skipped, 0 not run of 14 workloads, timing stable`: every workload, the
    ones without a trace (SKIPPED) included; NOTHING RAN when no workload did."""
    statuses = [status for status, n in result.counts.items() for _ in range(n)]
    bench = result.benchmark or {}
    gaps = jail_note(result.sandbox)  # every summary line names the jail's missing layers
    return f"{Tally.of(statuses).line('workloads')}, {timing_word(bench)}" + (f", {gaps}" if gaps else "")


def _print_details(result: BenchResult, console: Console) -> None:
    for line in verbose_details(result.settings, result.compile, result.phases, result.duration_s):
        console.print(line, soft_wrap=True)
    if result.staging:
        console.print(f"[dim]staging dir kept: {escape(result.staging)}[/]")
