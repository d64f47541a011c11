"""rmsnorm: out = x * rsqrt(mean(x^2, -1) + eps) * weight, x [rows, hidden], weight [hidden].

The reference accumulates in at least FP32 (float64 inputs stay float64) and casts back to x.dtype.
"""

from __future__ import annotations

import torch

from mini_kv.references.common import (
    LAYOUT_VARIANTS,
    VALUE_VARIANTS,
    check_variant,
    layout,
    mismatched,
    values,
)

ILLEGAL = ("weight_wrong_length", "negative_eps", "dtype_mismatch", "device_mismatch")
DEFAULT_EPS = 1e-6


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.to(acc)).to(x.dtype)


def _x_values(shape, dtype, device, generator, variant):
    if variant == "large" and dtype == torch.float16:
        # ~1e3: x*x alone overflows fp16 (max 65504), so an fp16 sum of squares is inf,
        # while the FP32 sum of squares stays far from overflow.
        x = torch.randn(shape, generator=generator, dtype=torch.float32) * 1e3
        return x.to(dtype=dtype, device=device)
    return values(shape, dtype, device, generator, variant)


def make_inputs(params: dict, dtype: torch.dtype, device: str, generator: torch.Generator):
    variant = params.get("variant")
    check_variant(variant, VALUE_VARIANTS + LAYOUT_VARIANTS + ILLEGAL)
    rows, hidden = int(params["rows"]), int(params["hidden"])
    eps = float(params.get("eps", DEFAULT_EPS))
    value_variant = variant if variant in VALUE_VARIANTS else None
    x = _x_values((rows, hidden), dtype, device, generator, value_variant)
    weight = values((hidden,), dtype, device, generator)  # the variant shapes x; the weight stays normal
    if variant in LAYOUT_VARIANTS:
        x, weight = layout(x, variant), layout(weight, variant)  # a 1-D weight is only sliced
    elif variant == "weight_wrong_length":
        weight = values((hidden + 1,), dtype, device, generator)
    elif variant == "negative_eps":
        eps = -abs(eps) if eps != 0 else -DEFAULT_EPS
    elif variant in ("dtype_mismatch", "device_mismatch"):
        weight = mismatched(weight, variant, dtype, device)
        if weight is None:
            return None  # not applicable on this machine
    return (x, weight, eps)
