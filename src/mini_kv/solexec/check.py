"""The correctness rule, with upstream's semantics.

Element-wise on the values rounded to float32 (upstream's comparison type), with the arithmetic in
float64 so that no error overflows: |out - ref| of two float32 values is at most 6.8e38, and divided by
the smallest denominator (1.2e-38) at most 5.8e76, finite in float64. So an output of garbage bits, of
1e38 everywhere or of a few 1e37s gets a verdict and finite errors, never an Infinity a strict JSON
trace cannot hold. An element fails when |out - ref| > max_atol + max_rtol*|ref| or either
side is not finite. The workload passes when the matched share is at least required_matched_ratio,
the largest absolute error is within max_error_cap (when set), neither side holds a NaN or an
infinity (except -inf on both sides where allow_negative_inf), and the output is not all zeros while
the reference is not. The relative error divides by max(|ref|, max_atol), so near-zero references
do not blow it up; both errors are taken where both sides are finite (a NaN made them NaN, which a
strict JSON trace cannot hold).

A wrong element counts once, whatever its size: three elements of 1e30 and three of 1e37 get the same
verdict (PASSED when the rest matches at least `required_matched_ratio`, as upstream decides), unless
the workload bounds the error with `max_error_cap`, which then fails both. Only a non-finite value
fails on its own (NaN or Inf is never a number the tolerance can accept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


# Elements per pass on the host: each pass makes a few float64 temporaries of its size (a whole
# 48M-element output in one pass: over 2 GB of them); in passes of 4M they stay small. On a GPU the
# whole tensor is one pass (each pass costs a few synchronisations there).
HOST_CHUNK = 1 << 22


@dataclass
class _Tally:
    """What compare sums over its passes."""

    bad: int = 0
    nonfinite: int = 0
    out_nonfinite: bool = False
    max_abs: float = 0.0
    max_rel: float = 0.0
    has_nan: bool = False
    has_inf: bool = False
    out_any: bool = False
    ref_any: bool = False

    def add(self, x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float, allow_neg_inf: bool) -> None:
        """One pass: `x` (output) and `y` (reference), float32 values held in float64, same shape."""
        ay = y.abs()
        diff = torch.sub(x, y).abs_()
        max_abs, max_ref = float(diff.max()), float(ay.max())
        # all finite (NaN and Inf carry through max; |x - y| finite with y finite means x finite):
        # the common case, without the masks the general one needs
        if math.isfinite(max_abs) and math.isfinite(max_ref):
            self._finite(x, ay, diff, max_abs, max_ref, atol, rtol)
        else:
            self._general(x, y, ay, diff, atol, rtol, allow_neg_inf)

    def _finite(self, x, ay, diff, max_abs: float, max_ref: float, atol: float, rtol: float) -> None:
        self.bad += int(torch.count_nonzero(diff > ay * rtol + atol))
        self.max_abs = max(self.max_abs, max_abs)
        self.out_any |= bool(torch.count_nonzero(x))
        self.ref_any |= max_ref > 0
        rel = diff.div_(ay.clamp_min_(_floor(atol)))  # in place: ay and diff are spent
        self.max_rel = max(self.max_rel, float(rel.max()))

    def _general(self, x, y, ay, diff, atol: float, rtol: float, allow_neg_inf: bool) -> None:
        neg_inf_ok = (
            (x == float("-inf")) & (y == float("-inf"))
            if allow_neg_inf
            else torch.zeros_like(x, dtype=torch.bool)
        )
        x_bad = ~torch.isfinite(x) & ~neg_inf_ok
        nonfinite = (x_bad | ~torch.isfinite(y)) & ~neg_inf_ok
        skip = neg_inf_ok | nonfinite  # no error value where a side is not finite (strict JSON)
        zero = torch.zeros_like(x)
        diff = torch.where(skip, zero, diff)
        self.bad += int(torch.count_nonzero(((diff > atol + rtol * ay) | nonfinite) & ~neg_inf_ok))
        self.nonfinite += int(torch.count_nonzero(nonfinite))
        self.out_nonfinite |= bool(x_bad.any())
        rel = torch.where(skip, zero, diff / ay.clamp_min(_floor(atol)))
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.has_nan |= bool(x.isnan().any())
        self.has_inf |= bool((x.isinf() & ~neg_inf_ok).any())
        self.out_any |= bool(x.any())
        self.ref_any |= bool(y.any())


def _floor(atol: float) -> float:
    """The relative error's least denominator: max_atol, or the smallest normal float32 without one."""
    return atol if atol > 0 else torch.finfo(torch.float32).tiny


def _as_compared(t: torch.Tensor) -> torch.Tensor:
    """The values upstream compares (rounded to float32: a float64 1e300 is Inf there), held in float64
    so the errors between them cannot overflow."""
    return t.to(torch.float32).to(torch.float64)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> dict:
    """Errors of `out` against `ref` (same shape and dtype, checked before) and whether they pass."""
    if out.numel() == 0:
        return _stats(True, 0.0, 0.0, False, False, 1.0, None)
    if out.dtype == torch.float4_e2m1fn_x2:
        return _packed_fp4(out, ref, tol)
    atol, rtol = float(tol["max_atol"]), float(tol["max_rtol"])
    xs, ys = out.detach().reshape(-1), ref.detach().reshape(-1)
    step = HOST_CHUNK if xs.device.type == "cpu" else xs.numel()
    t = _Tally()
    for i in range(0, xs.numel(), step):
        x = _as_compared(xs[i : i + step])
        t.add(
            x,
            _as_compared(ys[i : i + step].to(device=x.device)),
            atol,
            rtol,
            tol["allow_negative_inf"],
        )
    n = xs.numel()
    matched = 1.0 - t.bad / n
    reason = None
    if t.nonfinite:
        side = "output" if t.out_nonfinite else "reference"
        reason = f"the {side} holds NaN or Inf at {t.nonfinite} element(s)"
    elif matched < tol["required_matched_ratio"]:
        reason = (
            f"{t.bad} of {n} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
            f"(matched {matched:.4%} < required {tol['required_matched_ratio']:.2%})"
        )
    elif tol["max_error_cap"] is not None and t.max_abs > tol["max_error_cap"]:
        reason = f"max absolute error {t.max_abs:.3g} above max_error_cap {tol['max_error_cap']:g}"
    elif not t.out_any and t.ref_any:
        reason = "the output is all zeros while the reference is not"
    return _stats(reason is None, t.max_abs, t.max_rel, t.has_nan, t.has_inf, matched, reason)
