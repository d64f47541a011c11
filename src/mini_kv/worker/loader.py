"""Dispatcher load: put a built library into this process and find its op."""

from __future__ import annotations

import torch

DISPATCH_KEYS = ("CPU", "CUDA", "Meta", "Autograd")


def load_op(library: str, qualname: str):
    """Load the shared library and return the op's OpOverloadPacket (torch.ops.ns.op)."""
    torch.ops.load_library(library)
    ns, _, name = qualname.partition("::")
    name = name.split(".")[0]
    namespace = getattr(torch.ops, ns)
    try:
        return getattr(namespace, name)
    except (AttributeError, RuntimeError) as exc:
        raise LookupError(f"library {library} does not register {qualname}: {exc}") from None


def registered_kernels(qualname: str) -> dict[str, bool]:
    """Which dispatch keys have a kernel for the op: the contract says CPU, CUDA and Meta."""
    name = qualname if "." in qualname.split("::")[1] else qualname
    out = {}
    for key in DISPATCH_KEYS:
        try:
            out[key] = bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))
        except RuntimeError:
            out[key] = False
    return out
