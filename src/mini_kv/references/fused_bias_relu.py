"""fused_bias_relu: out = relu(x + bias), x [rows, cols], bias [cols] broadcast over the rows."""

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

ILLEGAL = ("bias_wrong_length", "shape_mismatch", "dtype_mismatch", "device_mismatch")


def reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + bias)


def make_inputs(params: dict, dtype: torch.dtype, device: str, generator: torch.Generator):
    variant = params.get("variant")
    check_variant(variant, VALUE_VARIANTS + LAYOUT_VARIANTS + ILLEGAL)
    rows, cols = int(params["rows"]), int(params["cols"])
    value_variant = variant if variant in VALUE_VARIANTS else None
    x = values((rows, cols), dtype, device, generator, value_variant)
    bias = values((cols,), dtype, device, generator, value_variant)
    if variant in LAYOUT_VARIANTS:
        x, bias = layout(x, variant), layout(bias, variant)  # a 1-D bias is only sliced, never transposed
    elif variant == "bias_wrong_length":
        bias = values((cols + 1,), dtype, device, generator)
    elif variant == "shape_mismatch":
        x = values((rows * cols,), dtype, device, generator)  # x must be 2-D
    elif variant in ("dtype_mismatch", "device_mismatch"):
        bias = mismatched(bias, variant, dtype, device)
        if bias is None:
            return None  # not applicable on this machine
    return (x, bias)
