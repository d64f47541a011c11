"""Does RLIMIT_DATA let CUDA, cuBLAS, pinned memory and Triton run, and does it bind host memory?

Run on a GPU machine as `prlimit --data=$((6<<30)) python benchmarks/rlimit_data_probe.py 10` (a 10 GiB
host allocation under a 6 GiB cap: MemoryError) and with `--data=$((16<<30))` (it fits). This is the
measurement behind mini_kv.proc.cap_memory's choice of RLIMIT_DATA for GPU workers
(docs/measurements/jail.md).
"""

from __future__ import annotations

import resource
import sys


def main(gib: int) -> None:
    import torch

    print("RLIMIT_DATA", resource.getrlimit(resource.RLIMIT_DATA))
    x = torch.randn(1 << 28, device="cuda")
    torch.cuda.synchronize()
    print("cuda alloc 1 GiB ok", float(x[:10].sum()))
    a = torch.randn(4096, 4096, device="cuda")
    print("cublas ok", float((a @ a).sum()))
    torch.empty(1 << 28, pin_memory=True)
    print("pinned 1 GiB ok")
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(ptr, n: tl.constexpr):
            i = tl.arange(0, n)
            tl.store(ptr + i, tl.load(ptr + i) + 1)

        z = torch.zeros(128, device="cuda")
        add_one[(1,)](z, 128)
        torch.cuda.synchronize()
        print("triton ok", float(z.sum()))
    except Exception as exc:  # noqa: BLE001 - a probe: say what failed
        print("triton failed", type(exc).__name__, str(exc)[:300])
    try:
        b = bytearray(gib << 30)
        b[::4096] = b"x" * len(b[::4096])
        print(gib, "GiB host allocated: the cap did NOT bind")
    except MemoryError:
        print(gib, "GiB host: MemoryError (the cap binds)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
