"""Benchmark stage: time candidate and reference on the bench cases, alternating who goes first.

Candidate and reference are always timed with the same method, L2 mode and input-set layout,
so their ratio compares like with like. In cold-L2 mode each timed call gets an input set at
fresh addresses with fresh values (rotating sets), and L2 is flushed before every sample.
"""

from __future__ import annotations

import time

import torch

from mini_kv import roofline, stats
from mini_kv.settings import DEFAULTS
from mini_kv.status import Status
from mini_kv.worker import integrity
from mini_kv.worker.compare import compare
from mini_kv.worker.inputs import case_seed, clone_args, make_case_inputs, tensor_nbytes
from mini_kv.worker.remote import SpotCheck, workload_of
from mini_kv.worker.timing import (
    TIMER_LABELS,
    WARMUP_SHARE,
    L2Flusher,
    NoDeviceWorkError,
    TimingError,
    TimingGuardError,
    is_cuda,
    is_fixed_count,
    measure,
    measure_until,
    method_chain,
    repeat_target,
    sample_floor,
    stopping_rule,
    warm_up,
)

PROBE_SAMPLES = 3
# Cold L2: at most this many input sets, and at most this many bytes of them (candidate and
# reference sets together), but always at least two so consecutive calls never share buffers.
MAX_INPUT_SETS = 20
COLD_SET_BUDGET_BYTES = 8 * 2**30
COLD_SET_FREE_SHARE = 0.25


def input_set_count(
    set_bytes: int, cold: bool, max_sets: int = MAX_INPUT_SETS, free_bytes: int | None = None
) -> int:
    """How many input sets to rotate through: 1 when hot; in cold mode as many as memory allows, >= 2."""
    if not cold:
        return 1
    budget = COLD_SET_BUDGET_BYTES
    if free_bytes is not None:
        budget = min(budget, int(free_bytes * COLD_SET_FREE_SHARE))
    fits = budget // max(1, 2 * set_bytes)  # candidate and reference each hold their own copy
    return int(max(2, min(max_sets, fits)))


def set_seed(task_id: str, case_id: str, salt: str, k: int) -> int:
    """Set 0 uses the case's seed; set k > 0 a seed derived from it and the (secret) salt."""
    return case_seed(task_id, case_id, salt if k == 0 else f"{salt}\0input-set-{k}")


def choose_method(
    chain: list[str], workloads: list, device: str, flush: L2Flusher, launches: int
) -> tuple[str, list[dict]]:
    """The first method in `chain` that times every workload; the ones skipped and why. The host wall
    clock alone cannot fail to time anything: no probe calls (they cost seconds for a large CPU case)."""
    if chain == ["wallclock"]:
        return chain[0], []
    fallbacks = []
    for i, method in enumerate(chain):
        try:
            for calls in workloads:
                measure(calls, method, PROBE_SAMPLES, device, flush, launches)
        except TimingError as exc:
            if i == len(chain) - 1:
                raise
            fallbacks.append({"method": method, "reason": str(exc)})
            continue
        return method, fallbacks
    raise AssertionError("empty method chain")


def timed(fn):
    """Timing with the guards that turn an escape from the timer into a reason code."""
    try:
        return fn()
    except TimingGuardError as exc:
        raise integrity.Violation("THREAD_ESCAPE", f"while timing: {exc}") from None
    except NoDeviceWorkError as exc:
        code = "NO_DEVICE_WORK" if "no CUDA kernel:" in str(exc) else "REPLAYED_RESULT"
        raise integrity.Violation(code, f"while timing: {exc}") from None


def post_timing_check(
    op,
    reference,
    factory,
    case: dict,
    cand_sets: list,
    ref_sets: list,
    tolerance: dict,
    device: str,
    salt: str,
) -> dict:
    """After all timed calls: every input set must still give the right output, and so must new
    values written into the same buffers (same addresses, shapes, ids and version counters), which
    a result cache keyed on any of those gets wrong."""
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    for k, (cs, rs) in enumerate(zip(cand_sets, ref_sets, strict=True)):
        out = op(*cs)
        integrity.check_output(out, cs)
        res = compare(out, reference(*clone_args(rs)), atol, rtol, errors=False)
        if not res["ok"]:
            return {
                "ok": False,
                "integrity": "STALE_OUTPUT_AFTER_TIMING",
                "reason": f"input set {k}: {res.get('reason')} (right before timing, wrong after)",
            }
    for k, cs in enumerate(cand_sets):
        fresh = make_case_inputs(
            factory,
            case["params"],
            case["dtype"],
            device,
            case_seed("post-timing", f"{case['id']}\0{k}", salt),
        )
        integrity.rewrite_in_place(cs, fresh)
        res = compare(op(*cs), reference(*clone_args(fresh)), atol, rtol, errors=False)
        if not res["ok"]:
            return {
                "ok": False,
                "integrity": "STALE_OUTPUT_AFTER_TIMING",
                "reason": f"input set {k}, new values in the same buffers: {res.get('reason')} (a result "
                "cache keyed on the address, shape, id or version counter of the inputs)",
            }
    return {"ok": True, "reason": None}


def timing_budget(budget_s: float | None, started: float, warm: dict, settings: dict) -> dict:
    """What a case's measurements may spend: the budget left since `started` (before the warm-up) and the
    warm-up's seconds per call of each side (what one sample costs), and the samples a measurement takes
    whatever is left (timing.sample_floor)."""
    cost = dict(zip(("candidate", "reference"), warm["seconds_per_call"], strict=True))
    return {
        "left_s": (budget_s or float("inf")) - (time.perf_counter() - started),
        "cost": cost,
        "floor_samples": sample_floor(settings, budget_s, cost["reference"]),
    }


class SampledRepeats:
    """The repeats of a candidate/reference measurement within a timing budget (timing_budget): each
    measurement's share of it, no new repeat once it is spent (the first always runs, for both sides),
    and each side's samples and how its sampling stopped, as the two front doors record them."""

    def __init__(self, settings: dict, budget: dict):
        self.count = int(settings["repeats"])
        self.share = max(0.0, budget["left_s"]) / (2 * self.count)
        self.deadline = time.perf_counter() + budget["left_s"]
        self.cost = budget["cost"]
        self.floor = int(budget.get("floor_samples") or 1)
        self.samples: dict[str, list] = {"candidate": [], "reference": []}
        self.sampling = {w: {"taken": [], "stopped": [], "rel_ci": []} for w in self.samples}

    def __iter__(self):
        for r in range(self.count):
            if r > 0 and time.perf_counter() >= self.deadline:
                return
            yield r

    def add(self, who: str, m) -> None:
        """One measurement (timing.Measurement) of `who`."""
        self.samples[who].append(m.samples)
        for key in ("taken", "stopped", "rel_ci"):
            self.sampling[who][key].append(m.notes["sampling"][key])


def _repeats(
    calls: dict, method: str, settings: dict, device: str, flush, launches: int, guard, budget: dict
) -> tuple:
    """(samples, kernel times, order, sampling) of every repeat, alternating who goes first. Each
    measurement samples by the stopping rule within its share of the case's budget (SampledRepeats)."""
    # after the probes: lazily started runtime threads (profiler, driver) exist by now
    threads = integrity.os_threads()

    kernel_us: dict[str, list] = {"candidate": [], "reference": []}
    order_log = []
    plan = SampledRepeats(settings, budget)
    for r in plan:
        order = ("candidate", "reference") if r % 2 == 0 else ("reference", "candidate")
        order_log.append(list(order))
        for who in order:
            rule = stopping_rule(settings, plan.share, plan.count)
            m = timed(
                lambda who=who, rule=rule: measure_until(
                    calls[who],
                    method,
                    rule,
                    device,
                    flush,
                    launches,
                    per_sample_s=plan.cost.get(who),
                    floor=plan.floor,
                    measure_fn=measure,  # this module's name: the seam tests script timings through
                )
            )
            # under CUPTI the profiler's own threads come and go; measure() still counts Python threads
            left = integrity.foreign_threads(integrity.os_threads() - threads) if method != "cupti" else set()
            if left:
                raise integrity.Violation(
                    "THREAD_ESCAPE", f"{len(left)} new thread(s) running after timing the {who}"
                )
            if guard is not None:
                guard.check(f"after timing the {who}")
            plan.add(who, m)
            if m.kernel_us is not None:
                kernel_us[who].append(m.kernel_us)
    kernel = {
        who: {"kernel_us_p50": stats.summarize([x for rep in reps for x in rep]).p50} if reps else {}
        for who, reps in kernel_us.items()
    }
    return plan.samples, kernel, order_log, plan.sampling


def sampling_record(settings: dict, budget_s: float | None, warm: dict, sides: dict, calls_per: int) -> dict:
    """benchmark.json's `sampling` of a case: the rule, the warm-up, how many samples and timed calls
    each side took and why its measurements stopped (mini_kv.status.StopReason, one per repeat)."""
    stopped = sorted({why for side in sides.values() for why in side["stopped"]})
    return {
        "mode": "fixed" if is_fixed_count(settings) else "adaptive",
        "samples": settings.get("samples", "auto"),
        **{k: settings.get(k) for k in ("target_rel_ci", "min_samples", "max_samples")},
        "repeat_rel_ci": None
        if is_fixed_count(settings)
        else repeat_target(settings, int(settings.get("repeats", 1))),
        "budget_s": budget_s,
        "warmup_calls": warm["calls"],
        "warmup_s": warm["seconds"],
        "repeats_run": len(next(iter(sides.values()))["taken"]),
        "timed_calls": {who: sum(side["taken"]) * calls_per for who, side in sides.items()},
        "stopped": stopped,
    }


def too_large(cost: list, budget_s: float, device: str) -> str | None:
    """Why a case is skipped: one call of each side already takes more than the whole timing budget, so
    not even one sample of each fits (None when it fits). Said in the record, never silently."""
    if any(c is None for c in cost) or sum(cost) <= budget_s:
        return None
    return (
        f"too large for {device} within the timing budget: one call of each side took "
        f"{sum(cost):.3g} s, the case's budget is {budget_s:.3g} s (--budget, or benchmark.budget_s)"
    )


def _case_sets(op, factory, task_id: str, case: dict, device: str, salt: str, cold: bool, launches: int):
    """(input sets, output numel, bytes of one set): set 0 from the case's seed, called once to size it."""
    args = make_case_inputs(
        factory, case["params"], case["dtype"], device, set_seed(task_id, case["id"], salt, 0)
    )
    out = op(*args)
    out_bytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
    numel = out.numel() if isinstance(out, torch.Tensor) else 0
    set_bytes = tensor_nbytes(args) + out_bytes
    free = torch.cuda.mem_get_info(torch.device(device))[0] if is_cuda(device) else None
    n_sets = input_set_count(set_bytes, cold, max(2, launches), free)
    del out
    sets = [args] + [
        make_case_inputs(
            factory, case["params"], case["dtype"], device, set_seed(task_id, case["id"], salt, k)
        )
        for k in range(1, n_sets)
    ]
    return sets, numel, set_bytes


# Setting a case up (its inputs, one call) is repeated about twice more by the post-timing check (the
# same calls, then fresh inputs written into the same buffers, each compared with the reference).
SETUP_REPEATS = 3


def _warm(sides: list, settings: dict, device: str, setup_s: float) -> tuple[dict, float | None, str | None]:
    """(the warm-up's record, the case's budget, why the case is skipped or None). A case whose set-up,
    repeated by the post-timing check, alone outruns the budget is skipped before any warm-up: on CPU a
    GPU-sized bench case (33M elements) took 50 s here, almost all of it outside the timed calls."""
    budget_s = float(settings.get("budget_s") or 0) or None
    if budget_s and SETUP_REPEATS * setup_s > budget_s:
        why = (
            f"too large for {device} within the budget: setting the case up (its inputs and one call) took "
            f"{setup_s:.3g} s, and the post-timing check repeats that about twice, over the case's budget "
            f"of {budget_s:.3g} s (--budget, or benchmark.budget_s)"
        )
        return {"calls": 0, "seconds_per_call": [None] * len(sides), "seconds": 0.0}, budget_s, why
    warm = warm_up(sides, int(settings["warmup"]), WARMUP_SHARE * (budget_s or float("inf")), device)
    return warm, budget_s, too_large(warm["seconds_per_call"], budget_s, device) if budget_s else None


def _spot_check(reference, factory, case: dict, tolerance: dict, device: str, salt: str) -> SpotCheck:
    """How the judge checks a timed call of the candidate (remote.RemoteWorkload): the reference on a
    copy of the set's values, compared within the card's tolerance; spare values from their own seed."""

    def wrong(args: list, out) -> str | None:
        res = compare(out, reference(*clone_args(args)), tolerance["atol"], tolerance["rtol"], errors=False)
        return None if res["ok"] else res.get("reason")

    spare = make_case_inputs(
        factory, case["params"], case["dtype"], device, case_seed("spot-check", case["id"], salt)
    )
    return SpotCheck(wrong, spare)


def bench_case(
    op,
    reference,
    factory,
    task_id: str,
    case: dict,
    settings: dict,
    tolerance: dict,
    device: str,
    salt: str,
    peak_bw: float | None,
    exprs: dict,
    guard: integrity.Guard | None = None,
) -> dict:
    cuda = is_cuda(device)
    l2 = settings.get("l2", "hot")
    cold = l2 == "cold" and cuda
    chain = method_chain(settings["method"], device)
    if l2 == "cold" and not cuda:
        raise ValueError(f"l2 'cold' needs a CUDA device, not {device}")
    launches_hot = int(settings.get("graph_launches", 20))

    seed = set_seed(task_id, case["id"], salt, 0)
    t_setup = time.perf_counter()
    cand_sets, numel, set_bytes = _case_sets(op, factory, task_id, case, device, salt, cold, launches_hot)
    setup_s = time.perf_counter() - t_setup
    args, n_sets = cand_sets[0], len(cand_sets)
    ref_sets = [clone_args(s) for s in cand_sets]
    # one rotation each, kept across warm-up, probes and repeats: no two consecutive calls share buffers
    spot = _spot_check(reference, factory, case, tolerance, device, salt)
    cand_calls = workload_of(op, cand_sets, spot)
    ref_calls = workload_of(reference, ref_sets)
    # cold: one captured launch per input set, so consecutive replayed launches use different buffers
    launches = n_sets if cold else launches_hot
    flush = L2Flusher(device, cold)

    t0 = time.perf_counter()
    warm, budget_s, skip = _warm([cand_calls, ref_calls], settings, device, setup_s)
    if skip:
        return {"id": case["id"], "status": Status.SKIPPED, "reason": skip, "warmup": warm}
    method, fallbacks = timed(lambda: choose_method(chain, [cand_calls, ref_calls], device, flush, launches))
    if guard is not None:
        guard.check("before timing")
    budget = timing_budget(budget_s, t0, warm, settings)
    samples, kernel, order_log, sampling = _repeats(
        {"candidate": cand_calls, "reference": ref_calls},
        method,
        settings,
        device,
        flush,
        launches,
        guard,
        budget,
    )

    post = post_timing_check(op, reference, factory, case, cand_sets, ref_sets, tolerance, device, salt)
    if guard is not None:
        guard.check("after the post-timing check")

    cand_s = stats.summarize_repeats(samples["candidate"])
    ref_s = stats.summarize_repeats(samples["reference"])
    itemsize = torch.empty((), dtype=args[0].dtype).element_size()
    names = roofline.case_names(case["params"], itemsize, numel)
    bytes_moved = roofline.evaluate(exprs["bytes"], names) if exprs.get("bytes") else float(set_bytes)
    flops = roofline.evaluate(exprs["flops"], names) if exprs.get("flops") else None
    max_cv = float(settings.get("max_cv", DEFAULTS.max_cv))
    max_p95_cv = float(settings.get("max_p95_cv", DEFAULTS.max_p95_cv))
    record = {
        "id": case["id"],
        "dtype": case["dtype"],
        "params": case["params"],
        "seed": seed,
        "method": method,
        "method_requested": settings["method"],
        "fallbacks": fallbacks,
        "l2": l2 if cuda else "n/a",
        "timer": TIMER_LABELS[method],
        "calls_per_sample": launches if method == "graph" else 1,
        "input_sets": n_sets,
        "unit": "us",
        "order": order_log,
        "candidate": {
            "samples": samples["candidate"],
            "summary": cand_s.to_dict(),
            "sampling": sampling["candidate"],
            **kernel["candidate"],
        },
        "reference": {
            "samples": samples["reference"],
            "summary": ref_s.to_dict(),
            "sampling": sampling["reference"],
            **kernel["reference"],
        },
        "sampling": sampling_record(settings, budget_s, warm, sampling, launches if method == "graph" else 1),
        "speedup": stats.speedup(ref_s.overall.p50, cand_s.overall.p50),
        "stability": {
            **stats.stability(cand_s, ref_s, max_cv, max_p95_cv).to_dict(),
            "max_cv": max_cv,
            "max_p95_cv": max_p95_cv,
        },
        "post_check": post,
        "bytes": bytes_moved,
        "flops": flops,
        "roofline": roofline.achieved(bytes_moved, flops, cand_s.overall.p50 * 1e-6, peak_bw),
        "peak_bw_Bps": peak_bw,
    }
    if cold:
        record["l2_flush"] = flush.describe()
    return record
