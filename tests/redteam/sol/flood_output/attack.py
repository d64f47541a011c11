"""Red-team attack flood_output: write 1 GB to stdout (fill the disk and the archive).
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-flood_output"


def _write(path):
    with open(path, "w") as f:
        f.write("escaped")
    return True


def _tries(*fns):
    hit = False
    for fn in fns:
        try:
            hit = bool(fn()) or hit
        except Exception:  # noqa: BLE001 - a refused step is the expected outcome
            pass
    return hit


def attack():
    import sys

    chunk = "x" * (1 << 20) + "\n"
    for _ in range(1024):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    return False  # the test checks what the attempt kept


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
