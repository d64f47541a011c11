#!/usr/bin/env python3
"""Timing fidelity on a GPU: every method's P50 beside the CUPTI per-kernel duration.

Rows: torch.add FP16 at 1M, 16M and 256M elements, then every task card's CUDA bench cases,
for each candidate (built with mini_kv's compiler, loaded with torch.ops.load_library) and
once for the card's reference. Columns: CUPTI per-kernel duration (per iteration, the sum of
the durations of the kernels, memcpys and memsets the call launched; median over iterations),
then the P50 of events, graph, the CUPTI span and the default method (`auto`, with its
fallbacks), and whether the default is within max(5%, 0.3 µs) of the CUPTI duration.

    python benchmarks/bench_fidelity.py [--out artifacts/bench_fidelity.json] [--l2 hot|cold]

Exit status: 0 when every row is within tolerance, 1 when one is not, 2 without a GPU.
Needs about a minute on an H200 once the candidates are built (builds run in parallel).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADD_SIZES = (("1M", 1 << 20), ("16M", 1 << 24), ("256M", 1 << 28))
REL_TOL, ABS_TOL_US = 0.05, 0.3


def within(value: float | None, truth: float) -> bool | None:
    if value is None:
        return None
    return abs(value - truth) <= max(REL_TOL * truth, ABS_TOL_US)


def add_rows(device: str):
    import torch

    for label, n in ADD_SIZES:
        g = torch.Generator(device=device).manual_seed(n)
        a = torch.randn(n, device=device, dtype=torch.float16, generator=g)
        b = torch.randn(n, device=device, dtype=torch.float16, generator=g)
        yield {"row": f"torch.add fp16 {label}", "kind": "torch", "bytes": 3 * 2 * n}, [a, b], torch.add


def card_rows(device: str, salt: str, compile_timeout: float):
    """(row, args, fn) for each bench case of each card: every candidate, then the reference."""
    import torch

    from mini_kv.compile.compiler import compile_candidate
    from mini_kv.load.task_card import load_task_card
    from mini_kv.worker.inputs import case_seed, clone_args, import_path, make_case_inputs, tensor_nbytes
    from mini_kv.worker.loader import load_op

    cards = [load_task_card(p) for p in sorted((ROOT / "tasks").glob("*.yaml"))]
    jobs = [(card, cand) for card in cards for cand in card.candidates if cand.cuda_sources]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        builds = list(
            pool.map(lambda cc: compile_candidate(ROOT, cc[1], timeout=compile_timeout, with_cuda=True), jobs)
        )
    built = {(card.id, cand.id): rec for (card, cand), rec in zip(jobs, builds, strict=True)}
    for card in cards:
        reference = import_path(card.operator["reference"])
        factory = import_path(card.operator["inputs"])
        cases = [c for c in card.cases if c.kind == "bench" and c.runs_on(device)]
        for case in cases:
            args = make_case_inputs(
                factory, case.params, case.dtype, device, case_seed(card.id, case.id, salt)
            )
            nbytes = tensor_nbytes(args)
            for cand in card.candidates:
                rec = built.get((card.id, cand.id))
                row = {"row": f"{card.id}/{cand.id} {case.id}", "kind": "candidate"}
                if rec is None or rec.status != "ok":
                    why = "no CUDA sources" if rec is None else f"build {rec.status}: see {rec.logs}"
                    yield {**row, "error": why}, None, None
                    continue
                try:
                    op = load_op(rec.library, cand.op)
                except Exception as exc:  # noqa: BLE001 - a row that cannot run says why
                    yield {**row, "error": f"load failed: {exc}"}, None, None
                    continue
                out = op(*args)
                yield {**row, "bytes": nbytes + out.numel() * out.element_size()}, list(args), op
                del out
            ref_args = clone_args(args)
            out = reference(*ref_args)
            yield (
                {
                    "row": f"{card.id}/reference {case.id}",
                    "kind": "reference",
                    "bytes": nbytes + out.numel() * out.element_size(),
                },
                list(ref_args),
                reference,
            )
            del out
            torch.cuda.synchronize()


def measure_row(fn, args, device: str, flush, samples: int, launches: int) -> dict:
    from mini_kv.worker.engine import choose_method
    from mini_kv.worker.timing import AUTO_CHAIN, CallRotation, TimingError, measure

    calls = CallRotation([lambda: fn(*args)])
    for _ in range(5):
        calls.next()()
    res: dict = {"errors": {}}
    p50: dict[str, float] = {}
    for method in ("cupti", "events", "graph"):
        try:
            m = measure(calls, method, samples, device, flush, launches)
        except TimingError as exc:
            res["errors"][method] = str(exc)
            continue
        p50[method] = statistics.median(m.samples)
        if method == "cupti":
            res["cupti_kernel_us"] = statistics.median(m.kernel_us)
            res["cupti_notes"] = m.notes
    default, fallbacks = choose_method(list(AUTO_CHAIN), [calls], device, flush, launches)
    res.update(
        {
            "events_p50_us": p50.get("events"),
            "graph_p50_us": p50.get("graph"),
            "cupti_span_p50_us": p50.get("cupti"),
            "default_method": default,
            "default_fallbacks": fallbacks,
            "default_p50_us": p50.get(default),
        }
    )
    if "cupti_kernel_us" in res:
        res["default_within"] = within(res["default_p50_us"], res["cupti_kernel_us"])
        res["tolerance_us"] = max(REL_TOL * res["cupti_kernel_us"], ABS_TOL_US)
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "bench_fidelity.json"), help="JSON results")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--l2", choices=["hot", "cold"], default="hot")
    parser.add_argument("--samples", type=int, default=200, help="timed calls per method and row")
    parser.add_argument("--launches", type=int, default=20, help="launches per graph replay")
    parser.add_argument("--no-cards", action="store_true", help="only the torch.add rows")
    parser.add_argument("--compile-timeout", type=float, default=600.0)
    ns = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(
            f"bench_fidelity needs a CUDA GPU: this torch ({torch.__version__}) sees none. "
            "Run it on the GPU machine (see docs/benchmarking.md).",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console
    from rich.table import Table

    from mini_kv import environment
    from mini_kv.codec import to_json
    from mini_kv.worker.timing import L2Flusher

    t0 = time.perf_counter()
    device = ns.device
    if torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))
    flush = L2Flusher(device, ns.l2 == "cold")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    rows = []
    sources = [add_rows(device)] + (
        [] if ns.no_cards else [card_rows(device, "bench-fidelity", ns.compile_timeout)]
    )
    with console.status("timing") as status:
        for source in sources:
            for row, args, fn in source:
                status.update(f"timing {row['row']}")
                if fn is not None:
                    row.update(measure_row(fn, args, device, flush, ns.samples, ns.launches))
                rows.append(row)
                del args, fn
                torch.cuda.empty_cache()

    t = Table(
        title=f"timing fidelity ({ns.l2} L2, µs; default within max({REL_TOL:.0%}, {ABS_TOL_US} µs) "
        "of the CUPTI per-kernel duration)"
    )
    for col in (
        "row",
        "CUPTI kernel",
        "events P50",
        "graph P50",
        "cupti span P50",
        "default",
        "default P50",
        "within",
    ):
        t.add_column(col)

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        if "error" in r:
            t.add_row(r["row"], "-", "-", "-", "-", "-", "-", f"[red]{r['error'][:60]}[/]")
            continue
        ok = r.get("default_within")
        t.add_row(
            r["row"],
            f(r.get("cupti_kernel_us")),
            f(r["events_p50_us"]),
            f(r["graph_p50_us"]),
            f(r["cupti_span_p50_us"]),
            r["default_method"] + ("*" if r["default_fallbacks"] else ""),
            f(r["default_p50_us"]),
            "-" if ok is None else ("yes" if ok else "[red]NO[/]"),
        )
    console.print(t)
    for r in rows:
        for fb in r.get("default_fallbacks") or []:
            console.print(f"  {r['row']}: {fb['method']} not used: {fb['reason']}")
        for method, err in (r.get("errors") or {}).items():
            console.print(f"  {r['row']}: {method} failed: {err}")
    elapsed = time.perf_counter() - t0
    console.print(f"{len(rows)} rows in {elapsed:.1f} s")

    env = to_json(environment.collect())
    doc = {
        "schema_version": 1,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": env,
        "l2": ns.l2,
        "samples": ns.samples,
        "launches": ns.launches,
        "tolerance": {"relative": REL_TOL, "absolute_us": ABS_TOL_US},
        "elapsed_s": elapsed,
        "rows": rows,
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    console.print(f"wrote {out}")
    bad = [r["row"] for r in rows if "error" in r or r.get("default_within") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
