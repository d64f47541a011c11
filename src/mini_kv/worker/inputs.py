"""Inputs for one case: a seed per case, the factory call, independent clones."""

from __future__ import annotations

import importlib

import torch

from mini_kv.model import case_seed  # noqa: F401  (the integrity guard watches it here)

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def import_path(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_case_inputs(factory, params: dict, dtype: str, device: str, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return factory(dict(params), DTYPES[dtype], device, gen)


def clone_args(args):
    """Independent copies; a tensor keeps its strides so layouts survive (clone of a dense view)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def upcast_args(args):
    return tuple(
        a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )


def describe_args(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(
                {
                    "shape": list(a.shape),
                    "dtype": str(a.dtype).replace("torch.", ""),
                    "device": str(a.device),
                    "contiguous": a.is_contiguous(),
                }
            )
        else:
            out.append({"value": a if isinstance(a, (int, float, bool, str)) else repr(a)})
    return out


def tensor_nbytes(args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
