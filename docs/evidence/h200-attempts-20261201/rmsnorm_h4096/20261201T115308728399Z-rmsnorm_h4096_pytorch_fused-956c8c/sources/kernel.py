"""RMSNorm (hidden 4096, eps 1e-5) through torch's own rms_norm.

On CUDA, recent torch dispatches F.rms_norm to one fused kernel that reads the
row once and accumulates in fp32; on CPU it falls back to the composite, which
also upcasts to fp32. Either way there is no fp32 copy of the whole input, which
is where the reference spends most of its time.
"""

import torch
import torch.nn.functional as F

EPS = 1e-5


@torch.no_grad()
def run(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    hidden = hidden_states.shape[-1]
    return F.rms_norm(hidden_states, (hidden,), weight, eps=EPS)
