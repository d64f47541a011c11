"""RMSNorm in cuTile (cuda.tile), destination-passing style.

One tile block per row. The row is walked in (1, TILE_N) tiles twice: first
to accumulate the sum of squares in fp32, then to scale by rsqrt(mean + eps)
and the weight and store. Tiles past the end of the row are zero-padded on
load (zeros add nothing to the sum) and bounds-checked on store, so the hidden
size need not be a multiple of TILE_N.
"""

import cuda.tile as ct
import torch

EPS = 1e-5
_MAX_TILE_N = 4096

ConstInt = ct.Constant[int]
ConstFloat = ct.Constant[float]


@ct.kernel
def _rmsnorm_kernel(X, W, Y, inv_n: float, eps: ConstFloat, TILE_N: ConstInt):
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(X, axis=1, shape=(1, TILE_N))
    zero = ct.PaddingMode.ZERO

    acc = ct.full((1, TILE_N), 0, dtype=ct.float32)
    for t in range(num_col_tiles):
        x = ct.load(X, index=(row, t), shape=(1, TILE_N), padding_mode=zero).astype(ct.float32)
        acc = acc + x * x
    mean_sq = ct.sum(acc, axis=1, keepdims=True) * inv_n
    rstd = ct.rsqrt(mean_sq + eps)

    for t in range(num_col_tiles):
        x = ct.load(X, index=(row, t), shape=(1, TILE_N), padding_mode=zero).astype(ct.float32)
        w = ct.load(W, index=(t,), shape=(TILE_N,), padding_mode=zero).astype(ct.float32)
        y = (x * rstd) * ct.reshape(w, (1, TILE_N))
        ct.store(Y, index=(row, t), tile=y.astype(Y.dtype))


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@torch.no_grad()
def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    x = hidden_states.contiguous()
    w = weight.contiguous()
    n_rows, n_cols = x.shape
    if n_rows == 0 or n_cols == 0:
        return
    y = output if output.is_contiguous() else torch.empty_like(x)
    tile_n = min(_next_power_of_2(n_cols), _MAX_TILE_N)
    ct.launch(
        torch.cuda.current_stream(),
        (n_rows, 1, 1),
        _rmsnorm_kernel,
        (x, w, y, 1.0 / n_cols, EPS, tile_n),
    )
    if y is not output:
        output.copy_(y)
