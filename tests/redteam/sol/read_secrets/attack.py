"""Red-team attack read_secrets: read credentials: ~/.netrc, ~/.pgpass, ~/.vault-token, ~/.config tokens, /etc/shadow.
A real SOL solution of tests/sol_solutions/problem (scale_mul). The test fills in the @@...@@ paths.
The answer is right only while the attack failed, so the verdict itself says whether it worked."""

import ctypes
import os

import torch

LIBC = ctypes.CDLL(None, use_errno=True)
MARK = "redteam-escaped-read_secrets"


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
    found = []
    for p in (
        "@@HOME@@/.netrc",
        "@@HOME@@/.pgpass",
        "@@HOME@@/.vault-token",
        "@@HOME@@/.config/hub",
        "/etc/shadow",
        "/root/.netrc",
        os.path.expanduser("~/.netrc"),
    ):
        try:
            with open(p) as f:
                found.append(f.read())
        except OSError:
            pass
    print("\n".join(found))  # would land in the archived worker log
    return any("mkvsecret" in s for s in found)


ESCAPED = _tries(attack)


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
