"""Compare a candidate's output with the reference's: identity of type, shape, dtype, device, then values."""

from __future__ import annotations

import torch


def tensor_errors(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> dict:
    """Max abs/rel error and mismatches under |out-ref| <= atol + rtol*|ref| (NaN matches only NaN)."""
    if out.numel() == 0:
        return {
            "max_abs_err": 0.0,
            "max_rel_err": 0.0,
            "mismatches": 0,
            "first_mismatch": None,
            "numel": 0,
            "has_nan": False,
            "has_inf": False,
        }
    # FP64 on the output's own device: a host round trip of a large CUDA output costs seconds
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    same = (o == r) | (o.isnan() & r.isnan())  # equal values (an infinity included), NaN against NaN
    diff = (o - r).abs_().masked_fill_(same, 0.0)
    ra = r.abs()
    # an infinite error (a finite value against an infinity, or +inf against -inf) is a mismatch
    # whatever atol + rtol * |inf| would allow; a NaN one fails the comparison
    bad = (~(diff <= ra * rtol + atol) | diff.isinf()) & ~same
    finite = torch.isfinite(diff)
    rel = (diff / ra.clamp_min_(torch.finfo(torch.float64).tiny)).masked_fill_(same, 0.0)
    n_bad = int(bad.sum())
    first = None
    if n_bad:
        flat = int(bad.flatten().nonzero()[0])
        idx = list(torch.unravel_index(torch.tensor(flat), bad.shape)) if bad.dim() else []
        first = {
            "index": [int(i) for i in idx],
            "got": float(o.flatten()[flat]),
            "expected": float(r.flatten()[flat]),
        }
    return {
        "max_abs_err": float(diff[finite].max()) if finite.any() else float("inf"),
        "max_rel_err": float(rel[finite].max()) if finite.any() else float("inf"),
        "mismatches": n_bad,
        "first_mismatch": first,
        "numel": out.numel(),
        "has_nan": bool(o.isnan().any()),
        "has_inf": bool(o.isinf().any()),
    }


# Elements per FP64 pass on the CPU: chunks this size stay in cache, where FP64 copies of a whole large
# output go through memory (a 134M-element fp16 check: about 11 s whole, 1.4-2 s in chunks, 2 cores)
CPU_CHUNK = 1 << 18


def values_match(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """tensor_errors' verdict (no mismatch) in one pass: torch.isclose in FP64 applies the same rule
    (equal values and NaN against NaN match; an infinite error never does)."""
    o = out.detach().reshape(-1)
    r = ref.detach().to(device=o.device).reshape(-1)
    step = CPU_CHUNK if o.device.type == "cpu" else max(1, o.numel())
    for i in range(0, o.numel(), step):
        a, b = o[i : i + step].to(torch.float64), r[i : i + step].to(torch.float64)
        if not bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all()):
            return False
    return True


def compare(out, ref: torch.Tensor, atol: float, rtol: float, errors: bool = True) -> dict:
    """A result dict with `ok` and, on failure, `reason`; with the error statistics unless `errors` is
    False and the values match (a check that needs only the verdict: the post-timing check)."""
    if type(out) is not torch.Tensor:  # exact type: a subclass could compute lazily on read
        return {"ok": False, "reason": f"output is {type(out).__name__}, expected exactly torch.Tensor"}
    checks = []
    if tuple(out.shape) != tuple(ref.shape):
        checks.append(f"shape {list(out.shape)} != expected {list(ref.shape)}")
    if out.dtype != ref.dtype:
        checks.append(f"dtype {out.dtype} != expected {ref.dtype}")
    if out.device != ref.device:
        checks.append(f"device {out.device} != expected {ref.device}")
    if checks:
        return {"ok": False, "reason": "; ".join(checks)}
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
