"""Red-team attack kernel_calls: bpf, keyctl, add_key, perf_event_open, init_module, kexec_load, io_uring_setup.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-kernel_calls"


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
    calls = {
        321: (0, 0, 0),
        250: (0, 0, 0, 0, 0),
        248: (b"user", b"k", b"v", 1, -3),
        298: (0, 0, -1, -1, 0),
        175: (0, 0, b""),
        246: (0, 0, 0, 0),
        425: (1, 0),
    }
    hit = False
    for nr, args in calls.items():
        r = LIBC.syscall(nr, *args)
        hit = hit or (r >= 0)
    return hit


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
