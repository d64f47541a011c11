"""Compare a candidate's output with the reference's: a task card's rule (compare: identity of type,
shape, dtype, device, then every element within atol + rtol*|ref|) and SOL-ExecBench's
(compare_matched: a required share of matching elements, with upstream's semantics):

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

# Elements per FP64 pass on the CPU: chunks this size stay in cache, where FP64 copies of a whole large
# output go through memory (a 134M-element fp16 check: about 11 s whole, 1.4-2 s in chunks, 2 cores)
CPU_CHUNK = 1 << 18


def fp64_chunks(out: torch.Tensor, ref: torch.Tensor):
    """(flat start, out chunk, ref chunk) in FP64 on out's device, in row-major order: CPU_CHUNK
    elements at a time on the CPU, the whole tensor at once on a GPU (one pass, few launches)."""
    if out.shape != ref.shape:  # compare() reports a shape mismatch before any value is read
        raise ValueError(f"cannot compare values of shape {list(out.shape)} with {list(ref.shape)}")
    o, r = out.detach().reshape(-1), ref.detach().to(device=out.device).reshape(-1)
    step = CPU_CHUNK if o.device.type == "cpu" else max(1, o.numel())
    for i in range(0, o.numel(), step):
        yield i, o[i : i + step].to(torch.float64), r[i : i + step].to(torch.float64)


def chunk_errors(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float):
    """(|a-b|, relative error, mismatch mask) of FP64 `a` against `b`, errors 0 where they are equal."""
    same = (a == b) | (a.isnan() & b.isnan())  # equal values (an infinity included), NaN against NaN
    diff = (a - b).abs_().masked_fill_(same, 0.0)
    rb = b.abs()
    # an infinite error (a finite value against an infinity, or +inf against -inf) is a mismatch
    # whatever atol + rtol * |inf| would allow; a NaN one fails the comparison
    bad = (~(diff <= rb * rtol + atol) | diff.isinf()) & ~same
    rel = (diff / rb.clamp_min_(torch.finfo(torch.float64).tiny)).masked_fill_(same, 0.0)
    return diff, rel, bad


@dataclass(frozen=True)
class Errors:
    """Two tensors of one shape by a card's rule: the largest absolute and relative errors, the elements
    outside the tolerance (the first one's index and values), the elements, NaN or Inf in the output."""

    max_abs_err: float
    max_rel_err: float
    mismatches: int
    first_mismatch: dict | None
    numel: int
    has_nan: bool
    has_inf: bool


@dataclass(frozen=True)
class Fp64Error:
    """A reference's own error against itself in float64 (the card's tolerance is known to be achievable)."""

    max_abs_err: float
    max_rel_err: float


@dataclass(frozen=True)
class Compared:
    """An output against the reference's by a card's rule: `ok`, why not, and the error statistics (None
    where type, shape, dtype or device differ, or where the values matched and none were asked for)."""

    ok: bool
    reason: str | None = None
    errors: Errors | None = None


def tensor_errors(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> Errors:
    """Max abs/rel error and mismatches under |out-ref| <= atol + rtol*|ref| (NaN matches only NaN),
    of two tensors of one shape. In FP64 on the output's own device (a host round trip of a large
    CUDA output costs seconds); maxima, counts and flags are exact over chunks."""
    abs_max, rel_max, n_bad, first, has_nan, has_inf = [], [], 0, None, False, False
    for i, a, b in fp64_chunks(out, ref):
        diff, rel, bad = chunk_errors(a, b, atol, rtol)
        finite = diff.isfinite()
        if not finite.all():  # the maxima are of the finite errors (a boolean gather is slow: rare)
            diff, rel = diff[finite], rel[finite]
        if diff.numel():
            abs_max.append(float(diff.max()))
            rel_max.append(float(rel.max()))
        k = int(bad.sum())
        if k and first is None:
            j = int(bad.nonzero()[0])
            first = {"index": unravel(i + j, tuple(out.shape)), "got": float(a[j]), "expected": float(b[j])}
        n_bad += k
        has_nan = has_nan or bool(a.isnan().any())
        has_inf = has_inf or bool(a.isinf().any())
    none = 0.0 if out.numel() == 0 else float("inf")  # no element: no error; no finite error: inf
    return Errors(
        max(abs_max, default=none), max(rel_max, default=none), n_bad, first, out.numel(), has_nan, has_inf
    )


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index of element `flat` of a C-contiguous tensor of `shape` ([] for a scalar). Not
    torch.unravel_index: its first call imports sympy and torch.fx's symbolic shapes, about 0.4 s of
    every judge that meets a mismatch."""
    index = []
    for size in reversed(shape):
        flat, at = divmod(flat, size)
        index.append(at)
    return index[::-1]


def values_match(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """tensor_errors' verdict (no mismatch) in one pass: torch.isclose in FP64 applies the same rule
    (equal values and NaN against NaN match; an infinite error never does)."""
    return all(
        bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())
        for _, a, b in fp64_chunks(out, ref)
    )


def _identity_problem(out, ref: torch.Tensor) -> str | None:
    """Why `out` cannot be compared value by value with `ref` (type, shape, dtype, device), or None."""
    if type(out) is not torch.Tensor:  # exact type: a subclass could compute lazily on read
        return f"output is {type(out).__name__}, expected exactly torch.Tensor"
    checks = []
    if tuple(out.shape) != tuple(ref.shape):
        checks.append(f"shape {list(out.shape)} != expected {list(ref.shape)}")
    if out.dtype != ref.dtype:
        checks.append(f"dtype {out.dtype} != expected {ref.dtype}")
    if out.device != ref.device:
        checks.append(f"device {out.device} != expected {ref.device}")
    return "; ".join(checks) or None


def compare(out, ref: torch.Tensor, atol: float, rtol: float, errors: bool = True) -> Compared:
    """With the error statistics unless `errors` is False and the values match (a check that needs only
    the verdict: the post-timing check)."""
    problem = _identity_problem(out, ref)
    if problem:
        return Compared(False, problem)
    if not errors and values_match(out, ref, atol, rtol):
        return Compared(True)
    e = tensor_errors(out, ref, atol, rtol)
    why = f"{e.mismatches} of {e.numel} elements outside atol={atol}, rtol={rtol}" if e.mismatches else None
    return Compared(not e.mismatches, why, e)


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as flat bytes, on its own device (exact comparisons of any dtype)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def inputs_unchanged(before, after) -> bool:
    """Byte for byte, on the inputs' device: works for every dtype (fp8, packed fp4) and treats NaN
    inputs as unchanged."""
    return all(
        torch.equal(raw_bytes(b), raw_bytes(a))
        for b, a in zip(before, after, strict=True)
        if isinstance(b, torch.Tensor)
    )


# ------------------------------------------------------------------ SOL-ExecBench's rule


@dataclass(frozen=True)
class Matched:
    """One output by SOL-ExecBench's rule: the verdict, the errors, the matched share, why it failed."""

    ok: bool
    max_absolute_error: float
    max_relative_error: float
    has_nan: bool
    has_inf: bool
    matched_ratio: float
    reason: str | None


def _packed_fp4(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> Matched:
    """float4 pairs have no float32 conversion here: compare the packed bytes exactly."""
    same = out.view(torch.uint8) == ref.view(torch.uint8)
    matched = float(same.float().mean()) if same.numel() else 1.0
    ok = matched >= tol["required_matched_ratio"]
    # no value errors to report (the bytes are compared, not decoded): the matched share says it all
    why = None if ok else f"{1 - matched:.2%} of packed float4 bytes differ"
    return Matched(ok, 0.0, 0.0, False, False, matched, why)


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


def compare_matched(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> Matched:
    """Errors of `out` against `ref` (same shape and dtype, checked before) and whether they pass."""
    if out.numel() == 0:
        return Matched(True, 0.0, 0.0, False, False, 1.0, None)
    if out.dtype == torch.float4_e2m1fn_x2:
        return _packed_fp4(out, ref, tol)
    atol, rtol = float(tol["max_atol"]), float(tol["max_rtol"])
    xs, ys = out.detach().reshape(-1), ref.detach().reshape(-1)
    step = HOST_CHUNK if xs.device.type == "cpu" else xs.numel()
    t = _Tally()
    for i in range(0, xs.numel(), step):
        x = _as_compared(xs[i : i + step])
        t.add(x, _as_compared(ys[i : i + step].to(device=x.device)), atol, rtol, tol["allow_negative_inf"])
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
    return Matched(reason is None, t.max_abs, t.max_rel, t.has_nan, t.has_inf, matched, reason)


def plain_tensors(value) -> list[torch.Tensor]:
    """The non-empty plain (exactly torch.Tensor) tensors in `value`, through nested tuples, lists and
    dict values: what a call returned or wrote."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif type(v) is torch.Tensor and v.numel():
            out.append(v)
    return out
