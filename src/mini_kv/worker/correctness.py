"""Correctness of one case: candidate vs reference, the reference vs float64, inputs untouched, illegal inputs refused.

Each case calls the candidate twice, with the defences of `mini_kv.worker.integrity` around both:

1. before the reference has run on these inputs (nothing of the reference's to read), after the
   freed blocks of the inputs' sizes were filled with NaN;
2. after the reference, on a second input set (new values at new addresses), with the reference's
   outputs and the first output kept alive (no freed buffer of theirs can be handed back).

A failure is then examined once more to tell an honest wrong answer from a cheat (an output that
completes after the call, a result that depends on call order, a replayed result).
"""

from __future__ import annotations

import time
import traceback

import torch

from mini_kv.status import Status
from mini_kv.worker.compare import compare, inputs_unchanged, matches, tensor_errors
from mini_kv.worker.inputs import case_seed, clone_args, describe_args, make_case_inputs, upcast_args
from mini_kv.worker.integrity import Guard, Violation, check_output, check_own_kernels, degenerate, same_bytes
from mini_kv.worker.remote import census_next, kernels_record, poison_before, refresh

SETTLE_S = 0.1  # how long a wrong output is left alone before it is read again (work after return)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _nbytes(args) -> list[int]:
    return [a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)]


class _Raised(Exception):
    def __init__(self, exc: BaseException, tb: str):
        super().__init__(str(exc))
        self.exc, self.tb = exc, tb


def run_case(
    op,
    reference,
    factory,
    task_id: str,
    case: dict,
    tolerance: dict | None,
    device: str,
    salt: str,
    guard: Guard | None = None,
    on_inputs=None,
    own_kernels: bool = False,
) -> dict:
    """One case's record. `on_inputs`, if given, is called once the card's input factory has made the
    inputs: what fails before that is the card's fault (INVALID_CASE), never the candidate's."""
    seed = case_seed(task_id, case["id"], salt)
    record = {
        "id": case["id"],
        "kind": case["kind"],
        "dtype": case["dtype"],
        "params": case["params"],
        "seed": seed,
    }
    try:
        args = make_case_inputs(factory, case["params"], case["dtype"], device, seed)
    except Exception as exc:  # noqa: BLE001 - bad params (n: -5, n: "abc", too large): the card's fault
        return {
            **record,
            "status": Status.INVALID_CASE,
            "reason": f"the card's input factory failed for params {case['params']}: {type(exc).__name__}: "
            f"{str(exc)[:300]}",
        }
    if on_inputs is not None:
        on_inputs()
    if args is None:
        return {**record, "status": Status.SKIPPED, "reason": f"not applicable on device {device!r}"}
    record["inputs"] = describe_args(args)
    try:
        if case["kind"] == "illegal":
            res = _run_illegal(op, args, device)
            if guard is not None:
                guard.check("after an illegal-input call")
            return {**record, **res}
        return {
            **record,
            **_checked_case(
                op, reference, factory, case, tolerance, device, salt, seed, args, guard, own_kernels
            ),
        }
    except Violation as v:
        return {**record, "status": v.status, "integrity": v.code, "reason": str(v)}
    except _Raised as r:
        return {
            **record,
            "status": Status.RUNTIME_ERROR,
            "reason": f"{type(r.exc).__name__}: {r.exc}",
            "traceback": r.tb,
        }


def _call(op, args, guard: Guard | None, device: str, when: str):
    try:
        if guard is None:
            out = op(*args)
            _sync(device)
            return out
        return guard.call(op, args, device, when)
    except Violation:
        raise
    except Exception as exc:  # noqa: BLE001 - the candidate raising is a result
        raise _Raised(exc, getattr(exc, "remote_traceback", "") or traceback.format_exc()[-4000:]) from None


def _checked_case(
    op, reference, factory, case, tolerance, device, salt, seed, args, guard, own_kernels
) -> dict:
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    pristine = clone_args(args)
    ref_args = clone_args(args)
    poison_before(op, _nbytes(args), device)
    census_next(op)  # whose ops and kernels this call runs (integrity.kernel_census)
    out = _call(op, args, guard, device, "the call before the reference")
    kernels = kernels_record(op)
    if own_kernels and kernels is not None:
        check_own_kernels(kernels)  # --require-own-kernels: LIBRARY_DELEGATION
    if not inputs_unchanged(pristine, args):
        raise Violation("INPUT_MUTATED", "the op modified its inputs (a functional op must not)")
    check_output(out, args)
    ref = reference(*ref_args)
    res = compare(out, ref, atol, rtol)
    result = {k: v for k, v in res.items() if k != "ok"}
    result["reference_error"] = _reference_error(reference, pristine, ref)
    if kernels is not None:
        result["kernels"] = kernels
    if not res["ok"]:
        if "mismatches" in res:  # values, not type or shape: was it a cheat that got caught out?
            _explain_first_failure(op, reference, pristine, ref, out, atol, rtol, guard, device)
        return {**result, "status": Status.INCORRECT}
    why = degenerate(out, ref, atol)
    if why:
        raise Violation("DEGENERATE_OUTPUT", why)
    kept = out.detach().clone()
    try:
        _second_call(op, reference, factory, case, device, salt, seed, out, ref, atol, rtol, guard)
    except _SecondSetWrong as w:
        return {
            **result,
            **{k: v for k, v in w.res.items() if k != "ok"},
            "status": Status.INCORRECT,
            "reason": f"on a second input set: {w.res.get('reason')}",
        }
    if not same_bytes(out, kept):
        raise Violation(
            "DEFERRED_WORK",
            "the first call's output changed after it returned (written by a later "
            "call or by work left running)",
        )
    return {**result, "status": Status.PASSED, "calls": 2}


def _explain_first_failure(op, reference, pristine, ref, out, atol, rtol, guard, device) -> None:
    """The first call was wrong. A cheat shows itself here; an honest wrong answer returns. (Verdicts
    only: the first call's statistics are the ones reported.)"""
    time.sleep(SETTLE_S)
    _sync(device)
    refresh(op)
    if matches(out, ref, atol, rtol):
        raise Violation(
            "THREAD_ESCAPE",
            "the output was wrong when the call returned and right a moment later: "
            "work continued after the call",
        )
    again = clone_args(pristine)
    out2 = _call(op, again, guard, device, "a second call on the same inputs")
    if matches(out, ref, atol, rtol):
        raise Violation(
            "DEFERRED_WORK", "the output was wrong when the call returned and was completed by the next call"
        )
    if matches(out2, ref, atol, rtol):
        raise Violation(
            "CALL_ORDER_DEPENDENT",
            "wrong when called before the reference, right on the same "
            "inputs called after it (reads the reference's result or depends on call order)",
        )


def _second_call(op, reference, factory, case, device, salt, seed, out, ref, atol, rtol, guard) -> None:
    """After the reference, on new values at new addresses; every earlier output kept alive."""
    args2 = make_case_inputs(
        factory, case["params"], case["dtype"], device, case_seed("second-call", str(seed), salt)
    )
    pristine2 = clone_args(args2)
    ref2 = reference(*clone_args(args2))
    poison_before(op, [out.numel() * out.element_size()], device)
    out2 = _call(op, args2, guard, device, "the call after the reference")
    if not inputs_unchanged(pristine2, args2):
        raise Violation("INPUT_MUTATED", "the op modified its inputs on the second call")
    check_output(out2, args2, reference_outputs=(ref, ref2), earlier_outputs=(out,))
    # the statistics only when wrong: a right second call's are not kept
    res2 = compare(out2, ref2, atol, rtol, errors=False)
    if res2["ok"]:
        why = degenerate(out2, ref2, atol)
        if why:
            raise Violation("DEGENERATE_OUTPUT", f"second call: {why}")
        return
    if same_bytes(out2, out) and not same_bytes(ref2, ref):
        raise Violation(
            "REPLAYED_RESULT",
            f"on new inputs the op returned the first call's values again ({res2.get('reason')})",
        )
    out3 = _call(op, clone_args(pristine2), guard, device, "a third call")
    if matches(out3, ref2, atol, rtol):
        raise Violation(
            "CALL_ORDER_DEPENDENT",
            "right on the first call, wrong on the second, right again on the "
            f"same inputs: the result depends on how many calls came before ({res2.get('reason')})",
        )
    # consistently wrong on the second input set only: an honest bug the first set did not hit
    raise _SecondSetWrong(res2)


class _SecondSetWrong(Exception):
    def __init__(self, res: dict):
        super().__init__(res.get("reason"))
        self.res = res


def _run_illegal(op, args, device: str) -> dict:
    """An illegal input must raise a clean Python exception from the op; returning anything is a contract failure."""
    try:
        op(*args)
        _sync(device)
    except Exception as exc:  # noqa: BLE001
        return {"status": Status.PASSED, "raised": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {"status": Status.INCORRECT, "reason": "the op accepted illegal input instead of raising an error"}


def _reference_error(reference, args, ref: torch.Tensor) -> dict | None:
    """The reference itself against float64, so the card's tolerance is known to be achievable."""
    if not isinstance(ref, torch.Tensor) or ref.dtype == torch.float64 or not ref.is_floating_point():
        return None
    ref64 = reference(*upcast_args(args))
    errs = tensor_errors(ref, ref64, 0.0, 0.0)  # in FP64 (chunk by chunk on the CPU)
    return {"max_abs_err": errs["max_abs_err"], "max_rel_err": errs["max_rel_err"]}
