"""fp32 matmul written into the preallocated output.

The global TF32 switches are left alone: flipping them would change the
reference's numerics in the same process, not just ours.
"""

import torch


@torch.no_grad()
def run(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    torch.mm(A, B, out=C)
