"""Correctness of one case: candidate vs reference, the reference vs float64, inputs untouched, illegal inputs refused."""

from __future__ import annotations

import traceback

import torch

from mini_kv.worker.compare import compare, inputs_unchanged, tensor_errors
from mini_kv.worker.inputs import case_seed, clone_args, describe_args, make_case_inputs, upcast_args


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_case(op, reference, factory, task_id: str, case: dict, tolerance: dict | None, device: str,
             salt: str) -> dict:
    seed = case_seed(task_id, case["id"], salt)
    record = {"id": case["id"], "kind": case["kind"], "dtype": case["dtype"], "params": case["params"],
              "seed": seed}
    args = make_case_inputs(factory, case["params"], case["dtype"], device, seed)
    if args is None:
        return {**record, "status": "SKIPPED", "reason": f"not applicable on device {device!r}"}
    record["inputs"] = describe_args(args)
    if case["kind"] == "illegal":
        return {**record, **_run_illegal(op, args, device)}
    pristine = clone_args(args)
    ref_args = clone_args(args)
    try:
        out = op(*args)
        _sync(device)
    except Exception as exc:  # noqa: BLE001 - the candidate raising is a result
        return {**record, "status": "RUNTIME_ERROR", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:]}
    ref = reference(*ref_args)
    res = compare(out, ref, tolerance["atol"], tolerance["rtol"])
    if not inputs_unchanged(pristine, args):
        res = {**res, "ok": False, "reason": "the op modified its inputs (a functional op must not)"}
    record.update({k: v for k, v in res.items() if k != "ok"})
    record["status"] = "PASS" if res["ok"] else "FAIL"
    record["reference_error"] = _reference_error(reference, pristine, ref)
    return record


def _run_illegal(op, args, device: str) -> dict:
    """An illegal input must raise a clean Python exception from the op; returning anything is a contract failure."""
    try:
        op(*args)
        _sync(device)
    except Exception as exc:  # noqa: BLE001
        return {"status": "PASS", "raised": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {"status": "FAIL", "reason": "the op accepted illegal input instead of raising an error"}


def _reference_error(reference, args, ref: torch.Tensor) -> dict | None:
    """The reference itself against float64, so the card's tolerance is known to be achievable."""
    if ref.dtype == torch.float64 or not ref.is_floating_point():
        return None
    ref64 = reference(*upcast_args(args))
    errs = tensor_errors(ref.to(torch.float64), ref64, 0.0, 0.0)
    return {"max_abs_err": errs["max_abs_err"], "max_rel_err": errs["max_rel_err"]}
