"""Benchmark stage: time candidate and reference on the bench cases, alternating who goes first."""

from __future__ import annotations

import torch

from mini_kv import roofline
from mini_kv.judge import stats
from mini_kv.worker.compare import compare
from mini_kv.worker.inputs import case_seed, clone_args, make_case_inputs, tensor_nbytes
from mini_kv.worker.timing import L2Flusher, default_method, measure


def resolve_method(requested: str, device: str) -> str:
    if requested == "auto":
        return default_method(device)
    if torch.device(device).type != "cuda" and requested != "wallclock":
        raise ValueError(f"timing method {requested!r} needs a CUDA device; on {device} use wallclock or auto")
    return requested


def bench_case(op, reference, factory, task_id: str, case: dict, settings: dict, tolerance: dict,
               device: str, salt: str, peak_bw: float | None, exprs: dict) -> dict:
    method = resolve_method(settings["method"], device)
    seed = case_seed(task_id, case["id"], salt)
    args = make_case_inputs(factory, case["params"], case["dtype"], device, seed)
    ref_args = clone_args(args)
    flush = L2Flusher(device, settings["l2"] == "cold")

    def cand():
        return op(*args)

    def ref():
        return reference(*ref_args)

    out = cand()
    numel = out.numel() if isinstance(out, torch.Tensor) else 0
    for _ in range(settings["warmup"]):
        cand()
        ref()
    samples = {"candidate": [], "reference": []}
    order_log = []
    for r in range(settings["repeats"]):
        order = ("candidate", "reference") if r % 2 == 0 else ("reference", "candidate")
        order_log.append(list(order))
        for who in order:
            fn = cand if who == "candidate" else ref
            samples[who].append(measure(fn, method, settings["samples"], device, flush,
                                        settings.get("graph_launches", 20)))
    # the outputs must still be right after all the timed calls
    post = compare(op(*args), reference(*clone_args(args)), tolerance["atol"], tolerance["rtol"])

    cand_s = stats.summarize_repeats(samples["candidate"])
    ref_s = stats.summarize_repeats(samples["reference"])
    itemsize = torch.empty((), dtype=args[0].dtype).element_size()
    names = roofline.case_names(case["params"], itemsize, numel)
    default_bytes = tensor_nbytes(args) + (out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0)
    bytes_moved = roofline.evaluate(exprs["bytes"], names) if exprs.get("bytes") else float(default_bytes)
    flops = roofline.evaluate(exprs["flops"], names) if exprs.get("flops") else None
    seconds = cand_s["overall"]["p50"] * 1e-6
    return {
        "id": case["id"], "dtype": case["dtype"], "params": case["params"], "seed": seed,
        "method": method, "l2": settings["l2"] if torch.device(device).type == "cuda" else "n/a",
        "timer": "host wall clock" if method == "wallclock" else "CUDA events",
        "unit": "us", "order": order_log,
        "candidate": {"samples": samples["candidate"], "summary": cand_s},
        "reference": {"samples": samples["reference"], "summary": ref_s},
        "speedup": stats.speedup(ref_s["overall"]["p50"], cand_s["overall"]["p50"]),
        "stability": stats.stability(cand_s, ref_s, settings["max_cv"], settings["max_p95_cv"]),
        "post_check": {"ok": post["ok"], "reason": post.get("reason")},
        "bytes": bytes_moved, "flops": flops,
        "roofline": roofline.achieved(bytes_moved, flops, seconds, peak_bw),
    }
