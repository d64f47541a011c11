"""Red-team attack write_python_env: write into the Python environment (site-packages, mini_kv's own sources, bytecode).
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-write_python_env"


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
    import mini_kv

    targets = [os.path.dirname(mini_kv.__file__), os.path.dirname(torch.__file__)]
    return _tries(*[lambda t=t: _write(os.path.join(t, MARK)) for t in targets])


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
