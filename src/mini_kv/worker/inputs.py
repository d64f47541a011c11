"""A case's inputs, for both formats: a seed per case, a task card's factory call, a SOL workload's
inputs (random, scalar, safetensors, custom) and destination-passing output buffers, independent clones.

Random SOL values come from a generator seeded per (workload, round) from the run's secret salt, so
every round sees fresh values at fresh addresses and a solution cannot rebuild them from a known
seed. Distributions follow upstream: normal floats (fp8 clamped to [-2, 2]), integers in small
ranges, fair booleans. float4_e2m1fn_x2 tensors are random bytes: every 4-bit code is a value.
"""

from __future__ import annotations

import importlib

import torch

from mini_kv.load import safetensors_file
from mini_kv.model import case_seed  # noqa: F401  (the integrity guard watches it here)
from mini_kv.worker import explain
from mini_kv.worker.explain import WrongReturn


def import_path(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_case_inputs(factory, params: dict, dtype: str, device: str, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return factory(dict(params), torch_dtype(dtype), device, gen)


def clone_args(args) -> list:
    """Independent copies; a tensor keeps its strides so layouts survive (clone of a dense view)."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def upcast_args(args) -> list:
    return list(
        a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )


def describe_args(args) -> list:
    """A case's inputs as its record shows them: a tensor's shape, dtype, device and layout, or a value."""
    return [
        dict(shape=list(a.shape), dtype=str(a.dtype)[6:], device=str(a.device), contiguous=a.is_contiguous())
        if isinstance(a, torch.Tensor)
        else {"value": a if isinstance(a, (int, float, bool, str)) else repr(a)}
        for a in args
    ]


def tensor_nbytes(args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


# ------------------------------------------------------------------ a SOL workload's inputs

INT_RANGES = {
    "int8": (-128, 128),
    "int16": (-1024, 1024),
    "int32": (-1024, 1024),
    "int64": (-1024, 1024),
    "uint8": (0, 256),
}


class ReferenceInputError(RuntimeError):
    """The definition's custom input generator broke its own contract (the problem's fault, not the solution's)."""


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def random_tensor(shape: tuple[int, ...], dtype: str, device: str, gen: torch.Generator) -> torch.Tensor:
    kw = {"device": device, "generator": gen}
    if dtype in ("float64", "float32", "float16", "bfloat16"):
        return torch.randn(shape, dtype=torch_dtype(dtype), **kw)
    if dtype in ("float8_e4m3fn", "float8_e5m2"):
        return torch.randn(shape, dtype=torch.float32, **kw).clamp_(-2.0, 2.0).to(torch_dtype(dtype))
    if dtype == "float4_e2m1fn_x2":
        return torch.randint(0, 256, shape, dtype=torch.uint8, **kw).view(torch.float4_e2m1fn_x2)
    if dtype == "bool":
        return torch.randint(0, 2, shape, dtype=torch.uint8, **kw).bool()
    low, high = INT_RANGES[dtype]
    return torch.randint(low, high, shape, dtype=torch_dtype(dtype), **kw)


def random_scalar(dtype: str, device: str, gen: torch.Generator):
    value = random_tensor((), dtype, device, gen)
    return value.float().item() if dtype.startswith("float") else value.item()


def _custom_inputs(definition: dict, workload: dict, reference_ns: dict, device: str, seed: int) -> dict:
    fn = reference_ns[definition["custom_inputs_entrypoint"]]
    scalars = {n: d["value"] for n, d in workload["inputs"].items() if d["type"] == "scalar"}
    torch.manual_seed(seed)  # generators written against the global RNG get fresh, secret values too
    try:
        made = fn({**workload["resolved_axes"], **scalars}, torch.device(device))
    except Exception as exc:  # noqa: BLE001
        raise ReferenceInputError(
            f"{definition['custom_inputs_entrypoint']}() raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(made, dict):
        raise ReferenceInputError(
            f"{definition['custom_inputs_entrypoint']}() returned {type(made).__name__}, "
            "expected a dict of input name -> value"
        )
    names = [i["name"] for i in definition["inputs"]]
    if sorted(made) != sorted(names):
        raise ReferenceInputError(
            f"{definition['custom_inputs_entrypoint']}() returned inputs {sorted(made)}, "
            f"the definition has {names}"
        )
    return made


def _check_custom(spec: dict, value, shape) -> None:
    if shape is None:
        if not isinstance(value, (int, float, bool)):
            raise ReferenceInputError(
                f"custom input {spec['name']!r} should be a Python scalar, got {type(value).__name__}"
            )
        return
    if (
        not isinstance(value, torch.Tensor)
        or tuple(value.shape) != shape
        or value.dtype != torch_dtype(spec["dtype"])
    ):
        got = (
            f"{list(value.shape)} {str(value.dtype).replace('torch.', '')}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ReferenceInputError(
            f"custom input {spec['name']!r} is {got}, the definition wants {list(shape)} {spec['dtype']}"
        )


def make_inputs(
    definition: dict, workload: dict, reference_ns: dict, device: str, seed: int, safetensors_cache: dict
) -> list:
    """The positional inputs, in definition order."""
    gen = torch.Generator(device=device).manual_seed(seed)
    custom = None
    if any(d["type"] == "custom" for d in workload["inputs"].values()):
        custom = _custom_inputs(definition, workload, reference_ns, device, seed)
    out = []
    for spec in definition["inputs"]:
        shape = None if spec["shape"] is None else tuple(spec["shape"])
        desc = workload["inputs"][spec["name"]]
        kind = desc["type"]
        if kind == "custom":
            _check_custom(spec, custom[spec["name"]], shape)
            out.append(custom[spec["name"]])
        elif kind == "scalar":
            out.append(desc["value"])
        elif kind == "safetensors":
            key = (workload["safetensors"][spec["name"]], desc["tensor_key"])
            if key not in safetensors_cache:
                safetensors_cache[key] = safetensors_file.load_tensor(*key)
            out.append(safetensors_cache[key].to(device, copy=True))
        elif shape is None:
            out.append(random_scalar(spec["dtype"], device, gen))
        else:
            out.append(random_tensor(shape, spec["dtype"], device, gen))
    return out


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with values no correct kernel leaves behind, so an unwritten element fails."""
    if t.dtype == torch.float4_e2m1fn_x2:
        t.view(torch.uint8).fill_(0x77)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def allocate_outputs(definition: dict, device: str) -> list[torch.Tensor]:
    """Destination-passing style: one poisoned buffer per output (a 0-d tensor for a scalar output)."""
    return [
        poison(torch.empty(tuple(spec["shape"] or ()), dtype=torch_dtype(spec["dtype"]), device=device))
        for spec in definition["outputs"]
    ]


def normalize_outputs(result, definition: dict, device: str, who: str = "the solution") -> list:
    """A non-DPS result as one value per output: a tensor, a tuple/list, or a dict by name; Python
    scalars become 0-d tensors of the declared dtype. Types are kept, so a tensor subclass is seen.
    Anything else raises WrongReturn, saying what came back and what was expected (explain)."""
    outs = definition["outputs"]
    names = [o["name"] for o in outs]
    if isinstance(result, dict):
        if any(n not in result for n in names):
            raise WrongReturn(explain.wrong_return(result, names, who))
        values = [result[n] for n in names]
    elif isinstance(result, (tuple, list)):
        if len(result) != len(outs):
            raise WrongReturn(explain.wrong_return(result, names, who))
        values = list(result)
    else:
        if len(outs) != 1 or result is None:
            raise WrongReturn(explain.wrong_return(result, names, who))
        values = [result]
    out = []
    for spec, v in zip(outs, values, strict=True):
        if isinstance(v, (bool, int, float)):
            v = torch.tensor(v, dtype=torch_dtype(spec["dtype"]), device=device)
        elif not isinstance(v, torch.Tensor):
            raise WrongReturn(explain.output_not_tensor(spec["name"], v, names, who))
        out.append(v)
    return out


def unwritten(t: torch.Tensor) -> bool:
    """Whether an output buffer still holds poison()'s fill in every element (never written)."""
    if t.numel() == 0 or t.dtype == torch.float4_e2m1fn_x2:
        return False
    if t.is_floating_point():
        return bool(t.isnan().all())
    return bool(torch.equal(t, poison(torch.empty_like(t))))
