"""Which device a run uses and how much memory a CPU worker may take: shared by `verify` and `bench`."""

from __future__ import annotations

import os

from mini_kv.errors import UserError


def pick_device(requested: str | None) -> str:
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {requested}: this torch ({torch.__version__}) sees no CUDA device")
        index = int(requested.partition(":")[2] or 0)
        if requested.startswith("cuda") and index >= torch.cuda.device_count():
            raise UserError(f"--device {requested}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        return "cuda:0" if requested == "cuda" else requested
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def cpu_memory_limit() -> int:
    """Address-space cap for a CPU worker: half the machine, so a runaway op fails alone."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30
