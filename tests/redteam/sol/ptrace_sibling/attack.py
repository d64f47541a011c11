"""Red-team attack ptrace_sibling: ptrace a sibling process (and its own parent) to read its memory.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-ptrace_sibling"


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
    pid = os.fork()
    if pid == 0:
        import time

        time.sleep(5)
        os._exit(0)
    hit = LIBC.ptrace(16, pid, None, None) == 0  # PTRACE_ATTACH
    hit = LIBC.ptrace(16, os.getppid(), None, None) == 0 or hit
    try:
        with open(f"/proc/{pid}/mem", "rb") as f:
            f.read(1)
        hit = True
    except OSError:
        pass
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return hit


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
