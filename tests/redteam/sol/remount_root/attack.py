"""Red-team attack remount_root: remount / read-write (MS_REMOUNT|MS_BIND), then write into the project.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-remount_root"


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
    for target in (b"/", b"@@PROJECT@@"):
        LIBC.mount(None, target, None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND, read-write
    return _tries(
        lambda: _write("@@PROJECT@@/" + MARK),
        lambda: _write("/" + MARK) and os.path.exists("@@PROJECT@@/" + MARK),
    )


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
