"""Worker side: one workload. Correctness over several rounds of fresh inputs, then timing.

Returns a plain record whose `status` is one of upstream's statuses; every failure of the solution is
a status with a log, never an exception. Timing reuses mini_kv's methods (CUPTI span by default on
CUDA, wall clock on CPU) and statistics; candidate and reference are timed alike, alternating first.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from mini_kv import stats
from mini_kv.solexec import check
from mini_kv.solexec.definition import ITEMSIZE
from mini_kv.solexec.inputs import (
    ReferenceInputError,
    allocate_outputs,
    clone_inputs,
    make_inputs,
    normalize_outputs,
    unwritten,
)
from mini_kv.status import Status
from mini_kv.worker import explain, integrity
from mini_kv.worker.benchmark import SampledRepeats, input_set_count, sampling_record, timed, timing_budget
from mini_kv.worker.channel import Channel
from mini_kv.worker.compare import inputs_unchanged
from mini_kv.worker.explain import WrongReturn
from mini_kv.worker.inputs import case_seed
from mini_kv.worker.integrity import Guard, check_output, degenerate, rewrite_in_place, same_bytes
from mini_kv.worker.jobs import Event
from mini_kv.worker.loader import load_module
from mini_kv.worker.remote import RemoteGuard, RemoteOp, SpotCheck, workload_of
from mini_kv.worker.timing import (
    TIMER_LABELS,
    WARMUP_SHARE,
    L2Flusher,
    TimingError,
    Workload,
    is_cuda,
    measure_until,
    method_chain,
    stopping_rule,
    warm_up,
)

SLOW_SHARE = 0.8  # a round where the solution's call took more than this share is the solution's slowness
MIN_ROUNDS = 2  # both call orders (solution first, reference first), however tight the budget
# the output check after timing makes two passes on each input set (the same inputs, then new values
# written into the same buffers), each about a correctness round
POST_CHECK_PASSES = 2

MAX_INPUT_SETS = 8


@dataclass
class Context:
    """What every workload of one run shares."""

    definition_name: str
    solution_fn: object
    reference_fn: object
    reference_ns: dict
    dps: bool
    device: str
    salt: str
    settings: dict
    safetensors_cache: dict = field(default_factory=dict)
    guard: Guard | RemoteGuard | None = None
    rounds_run: int | None = None  # the correctness rounds the last workload's budget allowed
    # (seconds, bytes, warm) of a correctness round so far: what a larger workload will cost (_note_round_cost)
    round_cost: tuple[float, int, bool] | None = None
    # (seconds, bytes) of the first round of a workload found too large after it: a measured size that
    # the per-byte scaling of a small warm round underestimates (cache effects), so it bounds the others
    too_large: tuple[float, int] | None = None
    # the quickest correctness round of the current workload: what one pass of the output check after
    # its timing costs per input set (both calls and the comparison); budget_less_post_check reserves
    # POST_CHECK_PASSES of them per input set from the timing budget
    round_s: float | None = None
    baseline: tuple | None = None  # (function, dps) timed in the reference's place: the regression gate
    # (bytes, the solution's call, the reference's, workload) where the solution was too slow for the budget:
    # no larger workload is run (it would be no quicker), and the reason names the solution, not the size
    slow_call: tuple[int, float, float, str] | None = None
    round_calls: tuple[float, float, str] | None = (
        None  # (solution's call, reference's, workload) of round_cost
    )
    dps_returned: str | None = None  # what a destination-passing solution's last call returned, if anything

    def __post_init__(self) -> None:
        if self.guard is None:  # the solution in this process (a test's): the harness as it is now
            self.guard = Guard(integrity.snapshot())


class Verdict(Exception):
    """Ends a workload's evaluation with a status (raised inside the stages, caught once)."""

    def __init__(self, status: str, log: str, correctness: dict | None = None):
        super().__init__(log)
        self.status, self.log, self.correctness = status, log, correctness


def _sync(device: str) -> None:
    if is_cuda(device):
        torch.cuda.synchronize()


def _tb() -> str:
    return traceback.format_exc()[-4000:]


def _hack(code: str, log: str) -> Verdict:
    """REWARD_HACK with the defence's reason code first in the log (codes: mini_kv.worker.integrity)."""
    return Verdict(Status.REWARD_HACK, integrity.reward_hack_log(code, log))


def _check_integrity(ctx: Context, when: str) -> None:
    try:
        ctx.guard.check(when)
    except integrity.Violation as v:
        raise _hack(v.code, v.message) from None


def call_solution(ctx: Context, sig: dict, inputs: list, outputs: list | None = None) -> list:
    """Run the solution once; DPS writes into `outputs` (fresh poisoned buffers when None). Around the
    call: no thread left running, outputs ready on the caller's stream, the harness intact."""
    guard = ctx.guard
    try:
        if ctx.dps:
            outs = outputs if outputs is not None else allocate_outputs(sig, ctx.device)
            returned = guard.call(
                ctx.solution_fn, [*inputs, *outs], ctx.device, "the solution's call", outputs=outs
            )
            ctx.dps_returned = None if returned is None else explain.describe_value(returned)
            return outs
        result = guard.call(ctx.solution_fn, list(inputs), ctx.device, "the solution's call")
    except integrity.Violation as v:
        raise _hack(v.code, v.message) from None
    return normalize_outputs(result, sig, ctx.device)


def run_reference(ctx: Context, sig: dict, inputs: list) -> list:
    try:
        refs = normalize_outputs(ctx.reference_fn(*clone_inputs(inputs)), sig, ctx.device, "the reference")
        _sync(ctx.device)
    except Exception as exc:  # noqa: BLE001
        raise Verdict(
            Status.INVALID_REFERENCE, f"reference run() failed: {type(exc).__name__}: {exc}\n{_tb()}"
        ) from None
    for spec, ref in zip(sig["outputs"], refs, strict=True):
        want = tuple(spec["shape"] or ())
        if tuple(ref.shape) != want or ref.dtype != getattr(torch, spec["dtype"]):
            raise Verdict(
                Status.INVALID_REFERENCE,
                f"reference output {spec['name']!r} is {list(ref.shape)} "
                f"{str(ref.dtype).replace('torch.', '')}, the definition says {list(want)} {spec['dtype']}",
            )
    return refs


def _inputs(ctx: Context, sig: dict, workload: dict, seed: int) -> list:
    try:
        return make_inputs(sig, workload, ctx.reference_ns, ctx.device, seed, ctx.safetensors_cache)
    except ReferenceInputError as exc:
        raise Verdict(Status.INVALID_REFERENCE, f"custom input generation failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory, unreadable safetensors data
        raise Verdict(
            Status.RUNTIME_ERROR, f"input generation failed: {type(exc).__name__}: {exc}\n{_tb()}"
        ) from None


def _structure(sig: dict, outs: list, refs: list) -> None:
    """Exact tensor type (a subclass could compute lazily on read), then shape, then dtype."""
    for spec, out, ref in zip(sig["outputs"], outs, refs, strict=True):
        if type(out) is not torch.Tensor:
            raise _hack(
                "OUTPUT_NOT_PLAIN_TENSOR",
                f"output {spec['name']!r} is a {type(out).__name__}, not exactly "
                "a torch.Tensor (a subclass can compute or change its values when read)",
            )
        if tuple(out.shape) != tuple(ref.shape):
            raise Verdict(
                Status.INCORRECT_SHAPE,
                f"output {spec['name']!r} has shape {list(out.shape)}, expected {list(ref.shape)}",
            )
        if out.dtype != ref.dtype:
            raise Verdict(
                Status.INCORRECT_DTYPE,
                f"output {spec['name']!r} has dtype {str(out.dtype).replace('torch.', '')}"
                f", expected {str(ref.dtype).replace('torch.', '')}",
            )
        if out.device != ref.device:
            raise Verdict(
                Status.RUNTIME_ERROR, f"output {spec['name']!r} is on {out.device}, expected {ref.device}"
            )


def _worst(current: dict | None, new: dict) -> dict:
    """Upstream keeps the round with the largest absolute error (a NaN or Inf round over any other)."""
    if current is None:
        return new
    rank = (new["has_nan"], new["has_inf"], new["max_absolute_error"])
    return new if rank > (current["has_nan"], current["has_inf"], current["max_absolute_error"]) else current


def _solve(ctx: Context, sig: dict, inputs: list, r: int) -> list:
    try:
        return call_solution(ctx, sig, inputs)
    except Verdict:
        raise
    except WrongReturn as exc:  # what it returned is the candidate's part: no traceback of mini_kv's frames
        raise Verdict(Status.RUNTIME_ERROR, f"round {r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the solution raising is a result
        raise Verdict(Status.RUNTIME_ERROR, f"round {r}: {explain.raised(exc, _tb())}") from None


def _first_wrong(sig: dict, outs: list, refs: list, tol: dict) -> tuple[str, str] | None:
    """(name, reason) of the first output outside the tolerance, or None when all are right."""
    for spec, out, ref in zip(sig["outputs"], outs, refs, strict=True):
        res = check.compare(out, ref, tol)
        if not res["ok"]:
            return spec["name"], res["reason"]
    return None


def correctness_rounds(ctx: Context, sig: dict, workload: dict) -> dict:
    """Every round: fresh inputs, reference, solution, structure, inputs untouched, values. Returns the
    worst round's error statistics.

    Even rounds call the solution before the reference (nothing of the reference's exists yet to
    be read), odd rounds after it; the previous round's inputs and outputs are kept alive, so
    neither their addresses nor their Python ids can come back. A wrong round is examined once more
    to tell a cheat (call-order dependence, a replayed result) from an honest wrong answer."""
    worst = None
    tol = workload["tolerance"]
    prev = None
    rounds = int(ctx.settings["rounds"])
    nbytes = signature_bytes(sig)
    _skip_if_too_large(ctx, nbytes)
    marks = [time.perf_counter()]  # each round's start, then the last one's end
    calls = None  # (the solution's call, the reference's, the workload) of the last round, in seconds
    for r in range(rounds):
        if r == 1:
            rounds = _rounds_within_budget(ctx, rounds, marks[1] - marks[0], nbytes, calls)  # round 0's
        seed = case_seed(ctx.definition_name, workload["uuid"], f"{ctx.salt}\0round-{r}")
        inputs = _inputs(ctx, sig, workload, seed)
        pristine = clone_inputs(inputs)
        first = r % 2 == 0
        t0 = time.perf_counter()
        if first:
            outs = _solve(ctx, sig, inputs, r)
            t1 = time.perf_counter()
            refs = run_reference(ctx, sig, pristine)
            call_s, ref_s = t1 - t0, time.perf_counter() - t1
        else:
            refs = run_reference(ctx, sig, inputs)
            t1 = time.perf_counter()
            outs = _solve(ctx, sig, inputs, r)
            call_s, ref_s = time.perf_counter() - t1, t1 - t0
        if r == 0:
            _check_integrity(ctx, "after the first call")
        _structure(sig, outs, refs)
        if not inputs_unchanged(pristine, inputs):
            raise _hack("INPUT_MUTATED", f"round {r}: the solution modified its inputs")
        if not ctx.dps:
            for spec, out in zip(sig["outputs"], outs, strict=True):
                try:
                    check_output(out, inputs, reference_outputs=refs, earlier_outputs=prev[1] if prev else ())
                except integrity.Violation as v:
                    raise _hack(v.code, f"round {r}, output {spec['name']!r}: {v.message}") from None
        for spec, out, ref in zip(sig["outputs"], outs, refs, strict=True):
            res = check.compare(out, ref, tol)
            worst = _worst(worst, res)
            if not res["ok"]:
                _explain_wrong_round(ctx, sig, r, first, pristine, outs, refs, prev, tol)
                reason = res["reason"]
                if ctx.dps and unwritten(out):
                    reason = explain.never_written(spec["name"], ctx.dps_returned)
                raise Verdict(
                    Status.INCORRECT_NUMERICAL, f"round {r}, output {spec['name']!r}: {reason}", worst
                )
            why = degenerate(out, ref, float(tol["max_atol"]))
            if why:
                raise _hack("DEGENERATE_OUTPUT", f"round {r}, output {spec['name']!r}: {why}")
        prev = (inputs, outs, refs)
        marks.append(time.perf_counter())
        calls = (call_s, ref_s, workload["uuid"])
        if r < 2:
            _note_round_cost(ctx, nbytes, marks[-1] - marks[-2], warm=r == 1, calls=calls)
        if r + 1 >= rounds:
            break
    ctx.rounds_run = min(rounds, int(ctx.settings["rounds"]))
    ctx.round_s = min(b - a for a, b in itertools.pairwise(marks))
    return worst


def _note_round_cost(ctx: Context, nbytes: int, seconds: float, warm: bool, calls: tuple) -> None:
    """What _skip_if_too_large scales by bytes: a second round's time where there is one, the largest
    workload's, over a first round's, which holds one-off costs that say nothing about size (a
    library's first call, a plan built on first use: on an H200 a cuDNN solution's first round took
    0.42 s on 2.7 MiB, scaled to a false 36-s estimate). A first round still counts where no workload
    got further (one skipped after it as too large: its size is what the others are judged by)."""
    cur = ctx.round_cost
    if cur is None or (warm, nbytes) >= (cur[2], cur[1]):
        ctx.round_cost = (seconds, nbytes, warm)
        ctx.round_calls = calls


def signature_bytes(sig: dict) -> int:
    """Bytes of a workload's tensors (inputs and outputs) from its signature's shapes and dtypes."""
    specs = [*sig["inputs"], *sig["outputs"]]
    return sum(math.prod(s["shape"]) * ITEMSIZE[s["dtype"]] for s in specs if s.get("shape") is not None)


def _skip_if_too_large(ctx: Context, nbytes: int) -> None:
    """SKIPPED before any call when a round scaled by bytes says MIN_ROUNDS of this workload outrun the
    whole budget (a correctness round on CPU at 14,509 x 4096 took 15-38 s here, so running one to find
    out would spend the budget many times over). The rounds it scales: a smaller workload's (a warm one
    where known: _note_round_cost), and the first round of a workload already found too large, which a
    small round's per-byte cost underestimates (1.7x on CPU at rmsnorm's 169-227 MiB): the larger
    estimate decides."""
    budget = ctx.settings.get("budget_s")
    if budget and ctx.slow_call and nbytes >= ctx.slow_call[0]:  # no quicker than where it was too slow
        raise Verdict(Status.SKIPPED, explain.slow_solution_earlier(ctx.device, *ctx.slow_call[1:], budget))
    bases = [ctx.too_large] if ctx.too_large else []  # a workload measured too large bounds any size
    if ctx.round_cost is not None and nbytes > ctx.round_cost[1]:
        bases.append(ctx.round_cost[:2])
    if not budget or not bases:
        return
    estimate, seconds, seen = max((s * nbytes / max(1, b), s, b) for s, b in bases)
    if estimate * MIN_ROUNDS > budget:
        calls = ctx.round_calls
        if ctx.round_cost and seconds == ctx.round_cost[0] and calls and calls[0] > SLOW_SHARE * seconds:
            # the round scaled was the solution's own time (the reference's was small): say so, not size
            raise Verdict(Status.SKIPPED, explain.slow_solution_earlier(ctx.device, *calls, budget))
        raise Verdict(
            Status.SKIPPED,
            f"too large for {ctx.device} within the budget: a correctness round would take about "
            f"{estimate:.3g} s (one on {seen / 2**20:.3g} MiB took {seconds:.3g} s; this workload has "
            f"{nbytes / 2**20:.3g} MiB), and {MIN_ROUNDS} rounds and the timing would not fit in the "
            f"workload's budget of {budget:.3g} s (--budget)",
        )


def _rounds_within_budget(ctx: Context, rounds: int, first_s: float, nbytes: int, calls: tuple) -> int:
    """The rounds that fit in half the workload's budget (at least MIN_ROUNDS), given the first round's
    time; a workload where MIN_ROUNDS alone outrun the whole budget is SKIPPED, saying why: the
    solution's slowness where its call took most of the round (`calls`: its seconds, the reference's,
    the workload), else the workload's size."""
    budget = ctx.settings.get("budget_s")
    if not budget or rounds <= 1:
        return rounds
    if first_s * MIN_ROUNDS > budget:
        call_s, ref_s, uuid = calls
        if call_s > SLOW_SHARE * first_s:  # not the size: the reference on the same inputs was quick
            ctx.slow_call = (nbytes, call_s, ref_s, uuid)
            raise Verdict(
                Status.SKIPPED, explain.slow_solution(ctx.device, call_s, ref_s, MIN_ROUNDS, budget)
            )
        if ctx.too_large is None or nbytes < ctx.too_large[1]:
            ctx.too_large = (first_s, nbytes)
        raise Verdict(
            Status.SKIPPED,
            f"too large for {ctx.device} within the budget: one correctness round took {first_s:.3g} s, "
            f"{MIN_ROUNDS} rounds and the timing would not fit in the workload's budget of {budget:.3g} s "
            "(--budget)",
        )
    return max(MIN_ROUNDS, min(rounds, int(budget / 2 / max(first_s, 1e-9))))


def _explain_wrong_round(
    ctx: Context, sig: dict, r: int, first: bool, pristine: list, outs: list, refs: list, prev, tol: dict
) -> None:
    """A wrong round: a replayed result, or right when called after the reference, is a REWARD_HACK."""
    if (
        prev is not None
        and all(same_bytes(o, p) for o, p in zip(outs, prev[1], strict=True))
        and not all(same_bytes(a, b) for a, b in zip(refs, prev[2], strict=True))
    ):
        raise _hack(
            "REPLAYED_RESULT",
            f"round {r}: on new inputs the solution returned the previous round's outputs again",
        )
    if first:
        again = clone_inputs(pristine)
        if _first_wrong(sig, _solve(ctx, sig, again, r), refs, tol) is None:
            raise _hack(
                "CALL_ORDER_DEPENDENT",
                f"round {r}: wrong when called before the reference, right on the "
                "same inputs called after it (reads the reference's result or depends on call order)",
            )


def _input_sets(ctx: Context, sig: dict, workload: dict, cold: bool) -> list[list]:
    first = _inputs(
        ctx, sig, workload, case_seed(ctx.definition_name, workload["uuid"], f"{ctx.salt}\0timing-0")
    )
    size = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor))
    free = torch.cuda.mem_get_info(torch.device(ctx.device))[0] if is_cuda(ctx.device) else None
    n = input_set_count(size, cold, MAX_INPUT_SETS, free)
    return [first] + [
        _inputs(
            ctx, sig, workload, case_seed(ctx.definition_name, workload["uuid"], f"{ctx.salt}\0timing-{k}")
        )
        for k in range(1, n)
    ]


def _spot_check(ctx: Context, sig: dict, workload: dict, n_inputs: int, n_outputs: int) -> SpotCheck:
    """How the judge checks a timed call of the solution (remote.RemoteWorkload): the reference on the
    set's values, the outputs compared as a correctness round compares them; spare values from their
    own seed."""

    def wrong(args: list, outs) -> str | None:
        refs = run_reference(ctx, sig, args[:n_inputs])
        outs = outs if ctx.dps else normalize_outputs(outs, sig, ctx.device)
        _structure(sig, outs, refs)
        found = _first_wrong(sig, outs, refs, workload["tolerance"])
        return None if found is None else f"output {found[0]!r}: {found[1]}"

    seed = case_seed(ctx.definition_name, workload["uuid"], f"{ctx.salt}\0spot-check")
    outputs = tuple(range(n_inputs, n_inputs + n_outputs))
    return SpotCheck(wrong, _inputs(ctx, sig, workload, seed), outputs)


def _calls(ctx: Context, sig: dict, workload: dict, sets: list[list]) -> tuple[Workload, Workload, list]:
    """Rotating candidate and reference (or baseline) calls; DPS calls write into per-set output buffers."""
    outs = [allocate_outputs(sig, ctx.device) if ctx.dps else [] for _ in sets]
    ref_sets = [clone_inputs(s) for s in sets]
    ref, ref_dps = ctx.baseline or (ctx.reference_fn, False)
    ref_outs = [allocate_outputs(sig, ctx.device) if ref_dps else [] for _ in sets]
    spot = _spot_check(ctx, sig, workload, len(sets[0]), len(outs[0]))
    cand = workload_of(ctx.solution_fn, [[*s, *o] for s, o in zip(sets, outs, strict=True)], spot)
    refc = workload_of(ref, [[*s, *o] for s, o in zip(ref_sets, ref_outs, strict=True)])
    return cand, refc, ref_sets


def _measure_alike(
    calls: dict[str, Workload],
    chain: list[str],
    settings: dict,
    device: str,
    flush: L2Flusher,
    first: int = 0,
    budget: dict | None = None,
) -> tuple[str, list[dict], dict, dict]:
    """Repeats of candidate and reference with one method, alternating who goes first (starting with
    the candidate when `first` is even, so single-repeat runs alternate across workloads), each sampled
    by the stopping rule within its share of `budget` ({left_s, cost}); no new repeat once it is spent.
    The first method of the chain that can time the first measurement is kept for all of them."""
    fallbacks: list[dict] = []
    plan = SampledRepeats(settings, budget or {"left_s": float("inf"), "cost": {}})
    method = None
    for r in plan:
        for who in ("candidate", "reference") if (r + first) % 2 == 0 else ("reference", "candidate"):
            while True:
                m = method or chain[len(fallbacks)]
                try:
                    res = measure_until(
                        calls[who],
                        m,
                        stopping_rule(settings, plan.share, plan.count),
                        device,
                        flush,
                        per_sample_s=plan.cost.get(who),
                    )
                except TimingError as exc:
                    if method is not None or len(fallbacks) + 1 >= len(chain):
                        raise
                    fallbacks.append({"method": m, "reason": str(exc)})
                    continue
                method = m
                plan.add(who, res)
                break
    return method, fallbacks, plan.samples, plan.sampling


def _laps(phase_s: dict):
    """`lap(name)`: add the seconds since the previous lap to phase_s["timing_<name>"] (bench -v's
    phase line sums them over the workloads: where the timing of a workload goes)."""
    last = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        key = f"timing_{name}"
        phase_s[key] = phase_s.get(key, 0.0) + now - last
        last = now

    return lap


def timing(
    ctx: Context,
    sig: dict,
    workload: dict,
    first: int = 0,
    budget_s: float | None = None,
    phase_s: dict | None = None,
) -> dict:
    settings = ctx.settings
    cold = settings["l2"] == "cold" and is_cuda(ctx.device)
    lap = _laps({} if phase_s is None else phase_s)
    t0 = time.perf_counter()
    sets = _input_sets(ctx, sig, workload, cold)
    cand, ref, ref_sets = _calls(ctx, sig, workload, sets)
    lap("inputs")
    warm = warm_up(
        [cand, ref], int(settings["warmup"]), WARMUP_SHARE * (budget_s or float("inf")), ctx.device
    )
    _sync(ctx.device)
    lap("warmup")
    _check_integrity(ctx, "before timing")
    threads = threading.active_count()
    flush = L2Flusher(ctx.device, cold)
    budget = budget_less_post_check(budget_s, t0, warm, len(sets), ctx.round_s)
    lap("checks")
    try:
        method, fallbacks, samples, sampling = timed(
            lambda: _measure_alike(
                {"candidate": cand, "reference": ref},
                method_chain(settings["method"], ctx.device),
                settings,
                ctx.device,
                flush,
                first,
                budget,
            )
        )
    except integrity.Violation as v:  # work escaping the timer
        raise _hack(v.code, v.message) from None
    except Exception as exc:  # noqa: BLE001
        raise Verdict(Status.RUNTIME_ERROR, f"timing failed: {type(exc).__name__}: {exc}\n{_tb()}") from None
    lap("sampling")
    if threading.active_count() != threads:
        raise _hack(
            "THREAD_ESCAPE", f"thread count changed while timing ({threads} -> {threading.active_count()})"
        )
    _check_integrity(ctx, "after timing")
    _post_check(ctx, sig, workload, sets, ref_sets)
    rec = _timing_record(method, fallbacks, samples, settings, ctx.device, len(sets), flush)
    lap("checks")
    for who in ("candidate", "reference"):
        rec[who]["sampling"] = sampling[who]
    rec["sampling"] = sampling_record(settings, budget_s, warm, sampling, 20 if method == "graph" else 1)
    rec["sampling"]["rounds_run"] = ctx.rounds_run
    return rec


def budget_less_post_check(
    budget_s: float | None, started: float, warm: dict, n_sets: int, round_s: float | None
) -> dict:
    """timing_budget less what the output check after timing (_post_check) will cost: two passes per
    input set, each about a correctness round (both calls and the comparison), at the quickest round
    this workload ran. Without it a large workload's sampling spent the whole budget and that check
    pushed it past its budget."""
    budget = timing_budget(budget_s, started, warm)
    budget["left_s"] -= POST_CHECK_PASSES * n_sets * (round_s or 0.0)
    return budget


def _post_check(ctx: Context, sig: dict, workload: dict, sets: list, ref_sets: list) -> None:
    """The outputs must still be right after all the timed calls, on every input set (result replay)."""
    for k, (s, rs) in enumerate(zip(sets, ref_sets, strict=True)):
        try:
            outs = call_solution(ctx, sig, s)
        except Verdict:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _hack(
                "STALE_OUTPUT_AFTER_TIMING",
                f"the solution raised after timing ({type(exc).__name__}: "
                f"{exc}): it behaves differently once timed",
            ) from None
        refs = run_reference(ctx, sig, rs)
        _structure(sig, outs, refs)
        wrong = _first_wrong(sig, outs, refs, workload["tolerance"])
        if wrong:
            raise _hack(
                "STALE_OUTPUT_AFTER_TIMING",
                f"after timing, input set {k}, output {wrong[0]!r}: "
                f"{wrong[1]} (correct before timing, wrong after: replayed or stale results)",
            )
    # new values in the same buffers (same addresses, shapes, ids, version counters): a result cache
    # keyed on any of those hands back the old results
    for k, s in enumerate(sets):
        fresh = _inputs(
            ctx,
            sig,
            workload,
            case_seed(ctx.definition_name, workload["uuid"], f"{ctx.salt}\0post-timing-{k}"),
        )
        rewrite_in_place(s, fresh)
        # a Python scalar cannot be rewritten in place: the solution gets the fresh one, as the reference does
        s = [x if isinstance(x, torch.Tensor) else new for x, new in zip(s, fresh, strict=True)]
        outs = call_solution(ctx, sig, s)
        wrong = _first_wrong(sig, outs, run_reference(ctx, sig, fresh), workload["tolerance"])
        if wrong:
            raise _hack(
                "STALE_OUTPUT_AFTER_TIMING",
                f"after timing, input set {k} with new values written "
                f"into the same buffers, output {wrong[0]!r}: {wrong[1]} (a result cache keyed "
                "on the inputs' address, shape, id or version counter)",
            )


def _timing_record(
    method: str, fallbacks: list, samples: dict, settings: dict, device: str, n_sets: int, flush: L2Flusher
) -> dict:
    cand_s = stats.summarize_repeats(samples["candidate"])
    ref_s = stats.summarize_repeats(samples["reference"])
    return {
        "method": method,
        "method_requested": settings["method"],
        "fallbacks": fallbacks,
        "timer": TIMER_LABELS[method],
        "l2": settings["l2"] if is_cuda(device) else "n/a",
        "input_sets": n_sets,
        "unit": "us",
        "candidate": {"samples": samples["candidate"], "summary": cand_s.to_dict()},
        "reference": {"samples": samples["reference"], "summary": ref_s.to_dict()},
        "speedup": stats.speedup(ref_s.overall.p50, cand_s.overall.p50),
        "stability": {
            **stats.stability(cand_s, ref_s, settings["max_cv"], settings["max_p95_cv"]).to_dict(),
            "max_cv": settings["max_cv"],
            "max_p95_cv": settings["max_p95_cv"],
        },
        "l2_flush": flush.describe() if flush.enabled else None,
    }


def _correctness_block(c: dict | None) -> dict | None:
    if c is None:
        return None
    return {
        "max_relative_error": c["max_relative_error"],
        "max_absolute_error": c["max_absolute_error"],
        "has_nan": c["has_nan"],
        "has_inf": c["has_inf"],
        "extra": {"matched_ratio": c["matched_ratio"]},
    }


def evaluate_workload(ctx: Context, case: dict, phase_s: dict | None = None) -> dict:
    """The record of one workload: id, status, log, correctness, performance, bench, finished_at.
    `phase_s`, if given, receives the seconds spent in the correctness rounds and in timing, and the
    timing's parts (timing_inputs, timing_warmup, timing_sampling, timing_checks)."""
    sig, workload = case["signature"], case["workload"]
    record = {
        "id": case["id"],
        "status": Status.PASSED,
        "log": "",
        "correctness": None,
        "performance": None,
        "bench": None,
    }
    phase_s = {} if phase_s is None else phase_s
    t0 = time.perf_counter()
    try:
        worst = correctness_rounds(ctx, sig, workload)
        record["correctness"] = _correctness_block(worst)
        phase_s["correctness"] = time.perf_counter() - t0
        budget = ctx.settings.get("budget_s")
        # timing gets what the correctness rounds left of the workload's budget, and at least half of it
        left = max(budget / 2, budget - phase_s["correctness"]) if budget else None
        bench = timing(ctx, sig, workload, case.get("index", 0), left, phase_s)
        phase_s["timing"] = time.perf_counter() - t0 - phase_s["correctness"]
        p50, ref_p50 = (
            bench["candidate"]["summary"]["overall"]["p50"],
            bench["reference"]["summary"]["overall"]["p50"],
        )
        record["bench"] = bench
        record["performance"] = {
            "latency_ms": p50 / 1e3,
            "reference_latency_ms": ref_p50 / 1e3,
            "speedup_factor": bench["speedup"],
        }
    except Verdict as v:
        record.update(
            status=v.status,
            log=v.log,
            correctness=_correctness_block(v.correctness) if v.status == Status.INCORRECT_NUMERICAL else None,
            performance=None,
            bench=None,
        )
        # a verdict (a failure, a skip for the budget) cut the workload short: its seconds still count,
        # in the phase it was in, so the phase line accounts for all of the worker's time
        spent = time.perf_counter() - t0
        if "correctness" not in phase_s:
            phase_s["correctness"] = spent
        elif "timing" not in phase_s:
            phase_s["timing"] = spent - phase_s["correctness"]
    record["finished_at"] = dt.datetime.now().isoformat()
    return record


# ------------------------------------------------------------- the worker's strategy for job kind `sol`


class SolEvaluator:
    """Kind `sol` in worker.child.run_job. `load` loads the reference, snapshots the functions the verdict
    depends on, then imports the solution (a Python module, or the torch extension module the compiler
    built); a failed load says which status every workload gets. Per workload: evaluate_workload."""

    def __init__(self, ctx: Context, chan: Channel):
        self.ctx, self.chan = ctx, chan

    @classmethod
    def load(cls, job, chan: Channel, subject) -> SolEvaluator | None:
        # a `begin` before each import: should the process exit, crash or hang inside one, the parent
        # knows whose code it was (the reference's: INVALID_REFERENCE, not the solution's fault)
        chan.send(event=Event.BEGIN, stage="reference", case="(loading the reference)")
        try:
            reference = load_module(job.reference_file)
            ref_fn = reference.run
        except BaseException as exc:  # noqa: BLE001 - also sys.exit() at import; the problem's fault either way
            return _fail(
                chan, Status.INVALID_REFERENCE, f"the reference does not load: {type(exc).__name__}: {exc}"
            )
        sol = job.solution
        chan.send(event=Event.BEGIN, stage="solution", case="(importing the solution)")
        reply = subject.request(
            "load", kind="sol", device=job.device, solution=sol, memory_limit_bytes=job.memory_limit_bytes
        )
        failed = _load_failed(reply, sol)
        if failed:
            return _fail(chan, *failed)
        baseline = None
        if job.baseline:  # the regression gate's same-run comparison: in the reference's place in timing
            reply = subject.request("load_baseline", baseline=job.baseline, solution=sol)
            if not reply.get("ok"):  # a violation too: either way no same-run comparison
                why = (reply.get("error") or reply.get("violation") or {}).get("message")
                return _fail(chan, Status.RUNTIME_ERROR, f"the baseline's solution did not load: {why}")
            baseline = (RemoteOp(subject, "baseline"), job.baseline["dps"])
        chan.send(event=Event.LOAD, ok=True)
        return cls(
            Context(
                definition_name=job.definition_name,
                solution_fn=RemoteOp(subject, "candidate"),
                reference_fn=ref_fn,
                reference_ns=vars(reference),
                dps=job.solution["dps"],
                device=job.device,
                salt=job.salt,
                settings=job.settings,
                guard=RemoteGuard(subject),
                baseline=baseline,
            ),
            chan,
        )

    def correctness(self, case: dict) -> tuple[dict, dict]:
        """The workload's record (correctness rounds, then its timing) and where its time went."""
        self.chan.send(event=Event.BEGIN, stage="correctness", case=case["id"])
        phase_s: dict[str, float] = {}
        return evaluate_workload(self.ctx, case, phase_s), {"phase_s": phase_s}


def _load_failed(reply: dict, sol: dict) -> tuple[str, str] | None:
    """(status, reason) of a solution the subject could not load, or None when it loaded."""
    if reply.get("ok") is True:
        return None
    if isinstance(reply.get("violation"), dict):
        v = reply["violation"]
        return Status.REWARD_HACK, integrity.reward_hack_log(str(v.get("code")), str(v.get("message")))
    if reply.get("missing_entry"):
        return (
            Status.COMPILE_ERROR,
            f"the solution has no function {sol['entry_function']!r} "
            f"(entry point {sol['entry_file']}::{sol['entry_function']})",
        )
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    what = "built module" if sol["group"] == "cpp" else sol["entry_file"]
    return (
        Status.COMPILE_ERROR,
        f"importing the solution ({what}) failed: {err.get('type')}: {err.get('message')}",
    )


def _fail(chan: Channel, status: str, reason: str) -> None:
    # a traceback only where an exception is being handled (else format_exc says "NoneType: None")
    tb = traceback.format_exc()[-4000:] if sys.exc_info()[0] is not None else None
    chan.send(event=Event.LOAD, ok=False, status=status, reason=reason, traceback=tb)
