"""RMSNorm in Triton: one program per row, fp32 accumulation.

Rows of up to _MAX_TILE elements stay in registers between the sum of squares
and the scaling, so x is read from memory once. Longer rows are walked in tiles
twice (the second pass mostly hits L2). The hidden size need not be a power of
two: loads and stores past the end of the row are masked.
"""

import torch
import triton
import triton.language as tl

EPS = 1e-5
_MAX_TILE = 16384  # elements one program holds in registers (64 KiB of fp32)
_LOOP_TILE = 4096  # tile width when a row does not fit


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    n_cols,
    eps,
    BLOCK: tl.constexpr,
    NUM_TILES: tl.constexpr,
):
    # int64 row offsets: rows * stride can pass 2**31 for large batches.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride

    if NUM_TILES == 1:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        # The weight is shared by every row: keep it in cache.
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = (x * rstd) * w
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for t in range(NUM_TILES):
            cols = t * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for t in range(NUM_TILES):
            cols = t * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = (x * rstd) * w
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK, NUM_TILES, num_warps) for a row of n_cols elements."""
    if n_cols <= _MAX_TILE:
        block = triton.next_power_of_2(n_cols)
        num_tiles = 1
    else:
        block = _LOOP_TILE
        num_tiles = triton.cdiv(n_cols, block)
    # About 16 elements (two 16-byte bf16 vectors) per thread; 4..16 warps.
    num_warps = min(max(block // 512, 4), 16)
    return block, num_tiles, num_warps


@torch.no_grad()
def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    n_cols = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, n_cols)
    if x.stride(-1) != 1:
        x = x.contiguous()
    w = weight.contiguous()
    n_rows = x.shape[0]
    if n_rows == 0 or n_cols == 0:
        return

    # Write in place when the destination is a plain row-major matrix;
    # otherwise go through a temporary and copy.
    direct = output.dim() == 2 and output.stride(-1) == 1
    y = output if direct else torch.empty((n_rows, n_cols), dtype=output.dtype, device=output.device)

    block, num_tiles, num_warps = _launch_config(n_cols)
    _rmsnorm_kernel[(n_rows,)](
        x,
        w,
        y,
        x.stride(0),
        y.stride(0),
        n_cols,
        EPS,
        BLOCK=block,
        NUM_TILES=num_tiles,
        num_warps=num_warps,
    )
    if not direct:
        output.copy_(y.view(output.shape))
