"""FLUX rotary embedding in three elementwise passes instead of a dozen.

For each feature pair (x1, x2) the reference computes
    out1 = x1 * cos1 - x2 * sin1
    out2 = x1 * sin2 + x2 * cos2
which is out = x * cos + swap(x) * sin_signed, where swap exchanges the two
members of each pair and sin_signed is sin with the even positions negated.
The sign lives in the small (seq_len, head_dim) table, so the big tensor sees
one swap (exact in bf16), one fp32 multiply and one addcmul that rounds once,
straight into the bf16 destination.
"""

import torch


@torch.no_grad()
def run(
    query_or_key: torch.Tensor,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    output: torch.Tensor,
) -> None:
    x = query_or_key
    # (seq_len, head_dim) -> (seq_len, 1, head_dim): broadcasts over batch and heads.
    cos = freqs_cos.float().unsqueeze(1)
    sin_signed = freqs_sin.float()
    sin_signed[:, 0::2].neg_()
    sin_signed = sin_signed.unsqueeze(1)

    x_swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    # bf16 * fp32 promotes to fp32, so every product and sum is in fp32 and the
    # only rounding is the store into the bf16 destination.
    torch.addcmul(x * cos, x_swapped, sin_signed, out=output)
