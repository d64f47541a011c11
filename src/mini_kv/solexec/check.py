"""The correctness rule, with upstream's semantics.

Element-wise in float32: an element fails when |out - ref| > max_atol + max_rtol*|ref| or either
side is not finite. The workload passes when the matched share is at least required_matched_ratio,
the largest absolute error is within max_error_cap (when set), neither side holds a NaN or an
infinity (except -inf on both sides where allow_negative_inf), and the output is not all zeros while
the reference is not. The relative error divides by max(|ref|, max_atol), so near-zero references
do not blow it up.
"""

from __future__ import annotations

import torch


def _stats(
    ok: bool, max_abs: float, max_rel: float, has_nan: bool, has_inf: bool, matched: float, reason: str | None
) -> dict:
    return {
        "ok": ok,
        "max_absolute_error": max_abs,
        "max_relative_error": max_rel,
        "has_nan": has_nan,
        "has_inf": has_inf,
        "matched_ratio": matched,
        "reason": reason,
    }


def _packed_fp4(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> dict:
    """float4 pairs have no float32 conversion here: compare the packed bytes exactly."""
    same = out.view(torch.uint8) == ref.view(torch.uint8)
    matched = float(same.float().mean()) if same.numel() else 1.0
    ok = matched >= tol["required_matched_ratio"]
    # no value errors to report (the bytes are compared, not decoded): the matched share says it all
    return _stats(
        ok,
        0.0,
        0.0,
        False,
        False,
        matched,
        None if ok else f"{1 - matched:.2%} of packed float4 bytes differ",
    )


def compare(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> dict:
    """Errors of `out` against `ref` (same shape and dtype, checked before) and whether they pass."""
    if out.numel() == 0:
        return _stats(True, 0.0, 0.0, False, False, 1.0, None)
    if out.dtype == torch.float4_e2m1fn_x2:
        return _packed_fp4(out, ref, tol)
    x = out.detach().to(torch.float32)
    y = ref.detach().to(device=x.device, dtype=torch.float32)
    atol, rtol = float(tol["max_atol"]), float(tol["max_rtol"])
    neg_inf_ok = (
        (x == float("-inf")) & (y == float("-inf"))
        if tol["allow_negative_inf"]
        else torch.zeros_like(x, dtype=torch.bool)
    )
    nonfinite = (~torch.isfinite(x) | ~torch.isfinite(y)) & ~neg_inf_ok
    diff = torch.where(neg_inf_ok | nonfinite, torch.zeros_like(x), (x - y).abs())
    bad = ((diff > atol + rtol * y.abs()) | nonfinite) & ~neg_inf_ok
    matched = 1.0 - float(bad.sum()) / bad.numel()
    rel = diff / y.abs().clamp_min(atol if atol > 0 else torch.finfo(torch.float32).tiny)
    max_abs, max_rel = float(diff.max()), float(rel.max())
    has_nan = bool(x.isnan().any())
    has_inf = bool((x.isinf() & ~neg_inf_ok).any())
    reason = None
    if bool(nonfinite.any()):
        side = "output" if bool((~torch.isfinite(x) & ~neg_inf_ok).any()) else "reference"
        reason = f"the {side} holds NaN or Inf at {int(nonfinite.sum())} element(s)"
    elif matched < tol["required_matched_ratio"]:
        reason = (
            f"{int(bad.sum())} of {bad.numel()} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
            f"(matched {matched:.4%} < required {tol['required_matched_ratio']:.2%})"
        )
    elif tol["max_error_cap"] is not None and max_abs > tol["max_error_cap"]:
        reason = f"max absolute error {max_abs:.3g} above max_error_cap {tol['max_error_cap']:g}"
    elif not bool(x.any()) and bool(y.any()):
        reason = "the output is all zeros while the reference is not"
    return _stats(reason is None, max_abs, max_rel, has_nan, has_inf, matched, reason)
