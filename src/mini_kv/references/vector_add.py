"""vector_add: out = a + b, same shape, dtype and device."""

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

ILLEGAL = ("shape_mismatch", "dtype_mismatch", "device_mismatch")


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def make_inputs(params: dict, dtype: torch.dtype, device: str, generator: torch.Generator):
    variant = params.get("variant")
    check_variant(variant, VALUE_VARIANTS + LAYOUT_VARIANTS + ILLEGAL)
    shape = tuple(params["shape"]) if "shape" in params else (int(params["n"]),)
    value_variant = variant if variant in VALUE_VARIANTS else None
    a = values(shape, dtype, device, generator, value_variant)
    b = values(shape, dtype, device, generator, value_variant)
    if variant in LAYOUT_VARIANTS:
        a, b = layout(a, variant), layout(b, variant)
    elif variant == "shape_mismatch":
        b = values((shape[0] + 1,), dtype, device, generator)
    elif variant in ("dtype_mismatch", "device_mismatch"):
        b = mismatched(b, variant, dtype, device)
        if b is None:
            return None  # not applicable on this machine
    return (a, b)
