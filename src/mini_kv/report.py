"""Human-readable output of a verify run: per-case table, benchmark table, summary line."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape

from mini_kv.compile.diagnostics import COMPILER_ERROR, first_compiler_error
from mini_kv.judge.regression import RegressionVerdict, timed
from mini_kv.model import JailRecord, WorkerResults
from mini_kv.stats import Slower
from mini_kv.status import BuildStatus, Status, Verdict
from mini_kv.tables import Column, fitted_tables, num, verbose_details

if TYPE_CHECKING:
    from mini_kv.compile.compiler import CompileRecord
    from mini_kv.pipeline import VerifyResult

_FINE = (Status.PASSED, Status.SKIPPED)  # a case that needs no detail


@dataclass(frozen=True)
class Tally:
    """What a run did with its cases (workloads, batch items): the one rule every summary line counts by.
    SKIPPED: not applicable here, with a reason (too large for the device, another device's case);
    NOT_RUN: given up on after an earlier failure; every other status but PASSED is a failure."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0

    @classmethod
    def of(cls, statuses) -> Tally:
        c = Counter(str(s) for s in statuses)
        return cls(
            c.pop(Status.PASSED, 0),
            sum(n for s, n in c.items() if s not in (Status.SKIPPED, Status.NOT_RUN)),
            c.get(Status.SKIPPED, 0),
            c.get(Status.NOT_RUN, 0),
        )

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped + self.not_run

    @property
    def ran(self) -> int:
        return self.passed + self.failed

    def line(self, noun: str) -> str:
        """`11 passed, 0 failed, 3 skipped, 0 not run of 14 workloads`; an empty run says so."""
        counts = (
            f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped, {self.not_run} not run "
            f"of {self.total} {noun}"
        )
        return counts if self.ran else f"NOTHING RAN ({counts})"


def static_check_line(attempt: str) -> str | None:
    """The static pre-check's line (judge.static_check) where it named something or could not run, from
    the attempt's static_check.json; None where it found nothing, or the attempt has none (or none
    readable: the store's checks say why)."""
    from mini_kv.errors import ConfigError
    from mini_kv.judge.static_check import read_static_check

    try:
        static = read_static_check(attempt)
    except (OSError, ValueError, ConfigError):
        return None
    return static.line() if static is not None else None


def signature_line(attempt: str) -> str:
    """`signature: key id ...`, or `signature: none (...)`: whether the leaderboard's --require-signed
    will rank the attempt (store.signing). A line of its own: scripts read the path after `attempt: `."""
    from pathlib import Path

    from mini_kv.store import signing

    try:
        key_id = signing.claimed_key_id(json.loads((Path(attempt) / "attempt.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return "signature: unknown (attempt.json unreadable)"
    if key_id:
        return f"signature: HMAC-SHA256, key id {key_id}"
    return (
        f"signature: none (neither {signing.KEY_ENV} nor {signing.KEY_FILE_ENV} was set: unsigned, "
        "leaderboard --require-signed will not rank it)"
    )


def print_attempt(attempt: str, console: Console) -> None:
    """Where the run was stored (`attempt: PATH`, a line scripts read), the static pre-check's line where
    it has one, and the signature line: the same lines after `verify` and after `bench`."""
    console.print(f"attempt: {attempt}", markup=False, soft_wrap=True)
    for text in (static_check_line(attempt), signature_line(attempt)):
        if text:
            console.print(text, markup=False, soft_wrap=True)


def timing_word(bench: dict | None) -> str:
    """Whether the run's timing (a benchmark headline) can be trusted, in the summary line's words: its
    stability, and the cases timed on a throttled GPU (mini_kv.clocks)."""
    bench = bench or {}
    stable = bench.get("stable")
    if not bench.get("ran") or stable is None:
        return "timing: none"
    word = "timing stable" if stable else "timing UNSTABLE (a robust CV above the limit: not ranked)"
    found = bench.get("throttled") or {}
    if found:
        reasons = sorted({r for rs in found.values() for r in rs})
        word += (
            f", GPU throttled ({', '.join(reasons)}) while timing {len(found)} case(s): {', '.join(found)}"
        )
    return word


def describe_input(i: dict) -> str:
    """`float16[33,65] non-contiguous` for a tensor, the value itself for a scalar argument."""
    if "shape" not in i:
        return repr(i.get("value"))
    text = f"{i.get('dtype')}[{','.join(str(d) for d in i['shape'])}]"
    if i.get("device") and i["device"] != "cpu":
        text += f" on {i['device']}"
    return text + ("" if i.get("contiguous", True) else " non-contiguous")


def case_detail(r: dict) -> str:
    """What went wrong in one case (or, for an illegal case that passed, what the op raised)."""
    detail = r.get("reason") or r.get("raised") or ""
    if r.get("first_mismatch"):
        fm = r["first_mismatch"]
        detail += f" first at {fm['index']}: got {fm['got']:.6g}, expected {fm['expected']:.6g}"
    if r["status"] != Status.PASSED and r.get("inputs"):
        detail = f"inputs ({', '.join(describe_input(i) for i in r['inputs'])}); " + detail
    return detail.strip()


def case_table(cases: list[dict], width: int = 200):
    """The correctness table; case ids and numbers are never cut (see mini_kv.tables). Details go on
    their own lines below it (case_details)."""
    cols = [Column(c) for c in ("case", "kind", "status")]
    cols += [Column(c, "right") for c in ("max abs err", "max rel err", "ref err (vs fp64)")]
    rows = []
    for r in cases:
        ref = r.get("reference_error") or {}
        style = {Status.PASSED: "green", Status.SKIPPED: "yellow"}.get(r["status"], "red")
        rows.append(
            [
                escape(r["id"]),
                r["kind"],
                f"[{style}]{escape(r['status'])}[/]",
                num(r.get("max_abs_err")),
                num(r.get("max_rel_err")),
                num(ref.get("max_abs_err")),
            ]
        )
    return Group(*fitted_tables("correctness", cols, rows, width))


def case_details(cases: list[dict], verbose: bool = False) -> list[str]:
    """`case: detail` for every failed case (every case with a detail, with -v)."""
    return [
        f"  {r['id']}: {case_detail(r)}"
        for r in cases
        if case_detail(r) and (verbose or r["status"] not in _FINE)
    ]


def bench_table(cases: list[dict], width: int = 200):
    heads = (
        "case | method | L2 | cand P50 | cand P95 | CV | ref P50 | speedup | GB/s | TFLOP/s | % peak | stable"
    )
    cols = [
        Column(c, "left" if c in ("case", "method", "L2", "stable") else "right") for c in heads.split(" | ")
    ]
    rows = []
    for r in cases:
        if not timed(r):
            rows.append([escape(r["id"]), *["-"] * 10, f"[red]{escape(str(r.get('status')))}[/]"])
            continue
        cs, rs = r["candidate"]["summary"], r["reference"]["summary"]
        c, ref = {**cs["overall"], "p50_robust_cv": cs["p50_robust_cv"]}, rs["overall"]
        roof = r.get("roofline") or {}
        share = roof.get("peak_share")
        rows.append(
            [
                escape(r["id"]),
                r["method"] + ("*" if r.get("fallbacks") else ""),
                r["l2"],
                num(c["p50"], ".2f"),
                num(c["p95"], ".2f"),
                f"{c['p50_robust_cv'] * 100:.1f}%",
                num(ref["p50"], ".2f"),
                num(r["speedup"], ".3f"),
                num(roof.get("gbps"), ".1f"),
                num(roof.get("tflops"), ".2f"),
                "-" if share is None else f"{share * 100:.0f}%",
                "yes" if r["stability"]["stable"] else "[red]no[/]",
            ]
        )
    return Group(*fitted_tables("benchmark (times in µs)", cols, rows, width))


def jail_note(record: JailRecord | None) -> str | None:
    """For a run's summary line: the jail's missing layers, or None when every layer was active."""
    if record is None:
        return None
    if not record.enabled:
        return f"jail off: {record.reason or 'no record'}"
    return f"jail missing {', '.join(record.missing)}" if record.missing else None


def summary_line(summary: dict, problems: list[str] | tuple = (), cases: list[dict] = ()) -> str:
    """`35 passed, 0 failed, 0 skipped, 0 not run of 35 cases (core 12/12, extra 9/9, ...), opcheck 1/1,
    speedup 1.020x, timing stable`; what went wrong first when something did."""
    corr = summary.get("correctness") or {}
    parts = list(problems)
    groups = []
    for group in ("core", "extra", "edge/illegal"):
        c = corr.get("counts", {}).get(group)
        if c:
            groups.append(
                f"{group} {c['passed']}/{c['total']}" + (f" ({c['skipped']} skipped)" if c["skipped"] else "")
            )
    tally = Tally.of(c.get("status") for c in cases)
    parts.append(tally.line("cases") + (f" ({', '.join(groups)})" if groups else ""))
    if corr.get("invalid_cases"):
        parts.append(f"invalid case params (the card's fault): {', '.join(corr['invalid_cases'])}")
    contract = corr.get("contract", {})
    for name in ("opcheck", "gradcheck"):
        if name in contract:
            parts.append(f"{name} {'1/1' if contract[name] == Status.PASSED else '0/1'}")
    bench = summary.get("benchmark") or {}
    if bench.get("ran"):
        gm = bench.get("geomean_speedup")
        parts.append(f"speedup {gm:.3f}x" if gm else "speedup -")
    parts.append(timing_word(bench))
    if summary.get("regression"):
        parts.append(f"regression {summary['regression']['verdict']}")
    return ", ".join(parts)


def _problems(result: VerifyResult) -> list[str]:
    """Short reasons for the summary line of a run that did not pass."""
    s, comp, res = result.summary, result.compile, result.results
    out = []
    if comp.status == BuildStatus.TIMEOUT:
        out.append(f"the build did not finish in {comp.duration_s:.0f} s")
    elif comp.status != BuildStatus.OK:
        first = first_compiler_error(compile_log(comp))
        out.append(f"build failed at {first[0]}" if first else "build failed (see the log above)")
    load = res.load
    if load is not None and not load.get("ok"):
        out.append("the op did not load" + (f" ({load['hint'].split(':')[0]})" if load.get("hint") else ""))
    corr = s.get("correctness") or {}
    if corr.get("missing_kernels"):
        out.append(f"missing kernels {', '.join(corr['missing_kernels'])}")
    if corr.get("integrity_failures"):
        out.append(f"integrity {', '.join(sorted(set(corr['integrity_failures'])))}")
    out.extend((s.get("benchmark") or {}).get("impossible") or [])
    failed = [r["id"] for r in res.cases if r["status"] not in _FINE]
    if failed:
        out.append(
            f"failed {', '.join(failed[:3])}" + (f" (+{len(failed) - 3} more)" if len(failed) > 3 else "")
        )
    return out


def compile_log(comp: CompileRecord) -> str:
    """The build's output: the CUDA compile check's failures, then the builder's stdout and stderr."""
    text = ""
    check = comp.cuda_check or {}
    for c in check.get("checks", []):
        if c.get("returncode"):
            text += c.get("output", "")
    for name in ("stdout.log", "stderr.log"):
        path = (comp.logs or {}).get(name)
        if path:
            try:
                with open(path, errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
    return text


def _without_python_traceback(lines: list[str]) -> list[str]:
    """The builder's own Python traceback (torch.utils.cpp_extension raising) says nothing about the code."""
    out, skipping = [], False
    for ln in lines:
        if ln.startswith("Traceback (most recent call last)"):
            skipping = True
        elif skipping and not ln.startswith((" ", "\t")):
            skipping = False  # the exception line ends the traceback; keep it only if it is not the builder's
            if ln.startswith(("RuntimeError: Error building extension", "subprocess.CalledProcessError")):
                continue
        if not skipping:
            out.append(ln)
    return out


def compile_error_excerpt(comp: CompileRecord, lines: int = 25, verbose: bool = False) -> str:
    """The first compiler error with its file:line and context; with `verbose` every error line of the
    log as well. Never the builder's Python traceback, which only says that the compiler failed."""
    text = compile_log(comp)
    first = first_compiler_error(text)
    body = _without_python_traceback(text.splitlines())
    picked = [ln for ln in body if "error" in ln.lower() or "FAILED: " in ln]  # ninja's failed step
    if first and not verbose:
        more = len([ln for ln in picked if COMPILER_ERROR.match(ln.strip())]) - 1
        return "\n".join(first[1]) + (f"\n({more} more error(s); -v shows them)" if more > 0 else "")
    shown = (picked or body)[-lines:] if not verbose else (picked or body)
    return "\n".join(([*first[1], ""] if first else []) + shown)


def _print_compile(comp: CompileRecord, console: Console, verbose: bool) -> None:
    hit = comp.cache_hit
    console.print(
        f"compile: {comp.status} ({'cache hit' if hit else 'built' if hit is False else 'prebuilt'}, "
        f"{comp.duration_s:.2f} s)" + (f"  note: {comp.cuda_note}" if comp.cuda_note else ""),
        markup=False,
        soft_wrap=True,
    )
    if comp.status != BuildStatus.OK:
        console.print(f"[red]compile {comp.status}[/]:")
        console.print(compile_error_excerpt(comp, verbose=verbose), markup=False)
        if comp.logs and not verbose:
            console.print(f"build log: {', '.join(comp.logs.values())}", markup=False, soft_wrap=True)


def kernels_line(uuid: str, census: dict) -> str:
    """`kernels <uuid>: own: a, b; library: aten::mul, ...`: whose compute the workload's first call ran."""
    library = census.get("library") or []
    own = sorted(
        [k for k in census.get("kernels", {}) if k not in library]
        + [o for o in census.get("ops", {}) if not o.startswith("aten::")]
    )
    return f"kernels {uuid}: own: {', '.join(own) or 'none'}; library: {', '.join(library) or 'none'}"


def _print_checks(res: WorkerResults, summary: dict, console: Console, verbose: bool) -> None:
    """The load, the cases, the contract checks and the kernels the op did not register."""
    load = res.load
    if load is not None and not load.get("ok"):
        console.print(f"[red]load failed:[/] {escape(str(load.get('reason')))}")
    if load is not None and load.get("hint"):
        console.print(f"[red]hint:[/] {escape(load['hint'])}")
    if res.cases:
        console.print(case_table(res.cases, width=console.width))
        for line in case_details(res.cases, verbose):
            console.print(line, markup=False, soft_wrap=True)
        if verbose:  # whose compute each case's first call ran (integrity.kernel_census)
            for case in res.cases:
                if case.get("kernels"):
                    console.print(kernels_line(case["id"], case["kernels"]), markup=False, soft_wrap=True)
    for name, rec in res.contract.items():
        console.print(
            f"{name}: {rec.get('status')}" + (f" ({rec.get('reason')})" if rec.get("reason") else ""),
            markup=False,
        )
    if summary.get("correctness") and summary["correctness"].get("missing_kernels"):
        console.print(f"[red]missing kernels:[/] {', '.join(summary['correctness']['missing_kernels'])}")


def _print_bench(bench: list[dict], console: Console) -> None:
    """The benchmark table, then why a case was unstable, fell back to another method or failed."""
    console.print(bench_table(bench, width=console.width))
    for r in bench:
        if timed(r) and not r["stability"]["stable"]:
            console.print(f"  {r['id']} unstable: {'; '.join(r['stability']['reasons'])}", markup=False)
        for fb in r.get("fallbacks") or []:
            console.print(
                f"  {r['id']} method {r['method']}*: {fb['method']} not used: {fb['reason']}", markup=False
            )
        if r.get("status") and r.get("reason"):
            console.print(f"  {r['id']} {r['status']}: {r['reason']}", markup=False)


def print_verify(
    result: VerifyResult, console: Console | None = None, verbose: bool = False, name: str | None = None
) -> None:
    """verify's report of one candidate; its summary line names it as `name` (default: its id)."""
    console = console or Console()
    s, res = result.summary, result.results
    if verbose:
        for line in verbose_details(result.settings, None, result.phases, None):
            console.print(line, soft_wrap=True)
    _print_compile(result.compile, console, verbose)
    _print_checks(res, s, console, verbose)
    if res.bench:
        _print_bench(res.bench, console)
    for inc in res.incidents:
        console.print(f"[yellow]incident:[/] {escape(str(inc))}")
    for note in s.get("baseline_notes") or []:
        console.print(f"[yellow]note:[/] {escape(str(note))}", soft_wrap=True)
    if result.regression:
        print_regression(result.regression, console)
    problems = _problems(result) if s["status"] != Status.PASSED else []
    gaps = jail_note(res.sandbox)  # every summary line names the jail's missing layers
    problems = [*problems, gaps] if gaps else problems
    # soft-wrapped: one line whatever the width, for people and for the tools that grep it
    console.print(
        f"[bold]{s['status']}[/] {escape(name or result.candidate)}: "
        + escape(summary_line(s, problems, res.cases)),
        soft_wrap=True,
    )
    print_attempt(result.attempt, console)
    if result.index_warning:
        console.print(
            f"[yellow]index not updated:[/] {escape(result.index_warning)} (run `mini-kv rebuild-index`)"
        )


def _batch(b: Slower | None) -> str:
    if not b:
        return "-"
    return f"p={b.p_value:.2g}, {'significant' if b.significant else 'not significant'}"


def print_regression(reg: RegressionVerdict, console: Console) -> None:
    """The verdict against the baseline, one row per case, with both batches when a slowdown was seen."""
    style = {Verdict.PASS: "green", Verdict.WARN: "yellow", Verdict.INCOMPARABLE: "yellow"}.get(
        reg.verdict, "red"
    )
    ref = reg.baseline_file or {}
    how = (
        " (found by convention: the card names no `baseline:`)" if ref.get("found_by") == "convention" else ""
    )
    console.print(f"regression vs {ref.get('path', 'baseline')}{how}: [{style}]{reg.verdict}[/]")
    if reg.verdict == Verdict.UNCONFIRMED:
        console.print(
            "  UNCONFIRMED (exit 8): the stored timings suggest a slowdown that same-run comparisons with "
            "the baseline's own code could not decide: too noisy to decide. Not a failure and not a pass: "
            "rerun on a quieter machine (or with more --repeats)",
            markup=False,
            soft_wrap=True,
        )
    cases = [c for c in reg.cases if c.p50_ratio is not None]
    if cases:
        heads = (
            "case | verdict | stored P50 | cand P50 | P50 Δ | P95 Δ | vs stored | same run: base / cand P50"
            " | same-run Δ"
        ).split(" | ")
        numeric = {"stored P50", "cand P50", "P50 Δ", "P95 Δ", "same-run Δ"}
        cols = [Column(c, "right" if c in numeric else "left") for c in heads]
        rows = []
        for c in cases:
            conf = c.confirmation
            p50s = (conf.baseline.summary.overall.p50, conf.summary.overall.p50) if conf else ()
            rows.append(
                [
                    escape(c.id),
                    c.verdict,
                    num(c.baseline.p50, ".2f"),
                    num(c.candidate.p50, ".2f"),
                    f"{(c.p50_ratio - 1) * 100:+.1f}%",
                    f"{(c.p95_ratio - 1) * 100:+.1f}%",
                    _batch(c.first_batch),
                    "{:.2f} / {:.2f}".format(*p50s) if conf else "-",
                    f"{(conf.test.ratio - 1) * 100:+.1f}%, " + _batch(conf.test) if conf else "-",
                ]
            )
        console.print(Group(*fitted_tables("regression (times in µs)", cols, rows, console.width)))
        if any(c.first_batch for c in cases):
            console.print(
                "  vs stored: the candidate against the baseline's stored timings, only a screen; same "
                "run: the baseline's own code rebuilt and timed with the candidate, interleaved. Only the "
                "same run can FAIL, and only when a second same run agrees.",
                markup=False,
            )
    for reason in reg.reasons:
        console.print(f"  {reason}", markup=False)
