"""Red-team attack device_nodes: open host devices: raw disks, /dev/mem, /dev/kmsg, a tty, the host's /dev/shm.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-device_nodes"


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
    for p in (
        "/dev/sda",
        "/dev/vda",
        "/dev/mem",
        "/dev/kmsg",
        "/dev/tty0",
        "/dev/loop0",
        "/dev/kvm",
        "/dev/fuse",
    ):
        hit = _tries(lambda p=p: os.close(os.open(p, os.O_RDONLY)) or True) or hit
    _tries(lambda: _write("/dev/shm/" + MARK))  # the jail's own /dev/shm: the test checks the host's
    return hit


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
