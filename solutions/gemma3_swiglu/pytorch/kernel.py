"""Gemma3 gate/up projection with GELU-tanh gating.

The up projection is written straight into the destination, so the only
temporary is the gate projection. F.gelu(approximate="tanh") computes in fp32
and rounds once to bf16, which is what the reference does by hand in four
separate fp32 passes.
"""

import torch
import torch.nn.functional as F


@torch.no_grad()
def run(
    x: torch.Tensor,
    gate_proj: torch.Tensor,
    up_proj: torch.Tensor,
    output: torch.Tensor,
) -> None:
    gate = torch.matmul(x, gate_proj.t())
    torch.matmul(x, up_proj.t(), out=output)
    output.mul_(F.gelu(gate, approximate="tanh"))
