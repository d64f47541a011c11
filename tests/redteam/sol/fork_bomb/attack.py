"""Red-team attack fork_bomb: fork more processes than the jail allows (a pids cgroup or RLIMIT_NPROC).
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-fork_bomb"


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
    kids = []
    try:
        for _ in range(int("@@FORKS@@")):
            pid = os.fork()
            if pid == 0:
                import time

                time.sleep(30)
                os._exit(0)
            kids.append(pid)
    except OSError:
        pass
    for pid in kids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return len(kids) >= int("@@FORKS@@")


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
