"""Compare a candidate's output with the reference's: identity of type, shape, dtype, device, then values."""

from __future__ import annotations

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


def tensor_errors(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> dict:
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
            index = torch.unravel_index(torch.tensor(i + j), out.shape) if out.dim() else []
            first = {"index": [int(x) for x in index], "got": float(a[j]), "expected": float(b[j])}
        n_bad += k
        has_nan = has_nan or bool(a.isnan().any())
        has_inf = has_inf or bool(a.isinf().any())
    none = 0.0 if out.numel() == 0 else float("inf")  # no element: no error; no finite error: inf
    return {
        "max_abs_err": max(abs_max, default=none),
        "max_rel_err": max(rel_max, default=none),
        "mismatches": n_bad,
        "first_mismatch": first,
        "numel": out.numel(),
        "has_nan": has_nan,
        "has_inf": has_inf,
    }


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


def matches(out, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """compare(...)["ok"] without the error statistics: for a re-check whose details nobody reads."""
    return _identity_problem(out, ref) is None and values_match(out, ref, atol, rtol)


def compare(out, ref: torch.Tensor, atol: float, rtol: float, errors: bool = True) -> dict:
    """A result dict with `ok` and, on failure, `reason`; with the error statistics unless `errors` is
    False and the values match (a check that needs only the verdict: the post-timing check)."""
    problem = _identity_problem(out, ref)
    if problem:
        return {"ok": False, "reason": problem}
    if not errors and values_match(out, ref, atol, rtol):
        return {"ok": True}
    errs = tensor_errors(out, ref, atol, rtol)
    ok = errs["mismatches"] == 0
    res = {"ok": ok, **errs}
    if not ok:
        res["reason"] = f"{errs['mismatches']} of {errs['numel']} elements outside atol={atol}, rtol={rtol}"
    return res


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
