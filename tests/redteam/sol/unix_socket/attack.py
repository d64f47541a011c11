"""Red-team attack unix_socket: connect to a unix socket file of the host (a local daemon: Docker, MPS, dbus).
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import socket

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-unix_socket"


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
    def go():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect("@@SOCKET@@")
        s.sendall(b"escaped")
        return True

    def abstract():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect("\0@@ABSTRACT@@")
        s.sendall(b"escaped")
        return True

    return _tries(go, abstract)


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
