"""Dispatcher contract: torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch) and gradcheck."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch

from mini_kv.status import Status
from mini_kv.worker.inputs import case_seed, make_case_inputs

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
OMIT = {"omit_none": True}


@dataclass(frozen=True)
class Contract:
    """correctness.json's record of a contract check: its status; opcheck's per-case sub-test results,
    gradcheck's case; why it failed (an integrity code where a violation did)."""

    status: str
    integrity: str | None = field(default=None, metadata=OMIT)
    case: str | None = field(default=None, metadata=OMIT)
    cases: list | None = field(default=None, metadata=OMIT)
    reason: str | None = field(default=None, metadata=OMIT)
    traceback: str | None = field(default=None, metadata=OMIT)


def opcheck(op, factory, task_id: str, cases: list[dict], device: str, salt: str) -> Contract:
    """Run opcheck on the first few core cases; every sub-test result is recorded."""
    sample = [c for c in cases if c["kind"] == "core"][:2] or [c for c in cases if c["kind"] != "illegal"][:1]
    results = []
    ok = True
    for case in sample:
        args = make_case_inputs(
            factory, case["params"], case["dtype"], device, case_seed(task_id, case["id"], salt)
        )
        try:
            res = torch.library.opcheck(op.default, args, test_utils=OPCHECK_TESTS)
            status = {k: v for k, v in res.items()}
            passed = all(v == "SUCCESS" for v in status.values())
        except Exception as exc:  # noqa: BLE001 - a failed sub-test raises; record it
            status = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
            passed = False
        ok = ok and passed
        results.append({"case": case["id"], "passed": passed, "tests": status})
    return Contract(Status.PASSED if ok else Status.FAILED, cases=results)


def gradcheck(op, factory, task_id: str, cases: list[dict], device: str, salt: str) -> Contract:
    """float64 gradcheck of the registered backward on a small core case."""
    case = next((c for c in cases if c["kind"] == "core"), None)
    if case is None:
        return Contract(Status.SKIPPED, reason="no core case")
    args = make_case_inputs(factory, case["params"], "float64", device, case_seed(task_id, case["id"], salt))
    args = tuple(
        a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )
    try:
        ok = torch.autograd.gradcheck(lambda *xs: op(*xs), args, eps=1e-6, atol=1e-5, nondet_tol=0.0)
        return Contract(Status.PASSED if ok else Status.FAILED, case=case["id"])
    except Exception as exc:  # noqa: BLE001
        why, tb = f"{type(exc).__name__}: {str(exc)[:2000]}", traceback.format_exc()[-2000:]
        return Contract(Status.FAILED, case=case["id"], reason=why, traceback=tb)
