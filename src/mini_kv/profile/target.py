"""The process ncu profiles: a worker child with a job of kind `profile_target` (capture.py).

It builds the case's inputs with the card's factory and the recorded seed (the same code path
as `verify`), loads the compiled candidate, calls it `warmup` times, then `calls` more times
(ncu profiles the first launch after the warm-up), and finally checks the last output against
the reference. Only the candidate runs between the warm-up and the profiled launch, so the
kernel filter and the launch count see nothing else. The result is the child's signed `result`
event; an exception its `fatal` event.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TargetResult:
    """What the profiled process answers (target.json): the inputs' digest, the calls made, the last
    output's check against the reference."""

    input_sha256: str
    calls: int
    output_check: dict
    device_name: str
    ok: bool = True  # it ran to the end (a failure is its `fatal` event)


def input_digest(args) -> str:
    """SHA-256 over every argument: tensors by dtype, shape and bytes; other values by repr.

    Two profiles with the same digest measured the same inputs, whatever produced them.
    """
    import torch

    h = hashlib.sha256()
    for a in args:
        if isinstance(a, torch.Tensor):
            t = a.detach().contiguous().cpu()
            h.update(f"tensor:{t.dtype}:{list(a.shape)}:{list(a.stride())}\0".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(f"value:{a!r}\0".encode())
    return h.hexdigest()


def run(job) -> TargetResult:
    import torch

    from mini_kv.worker.compare import compare
    from mini_kv.worker.inputs import clone_args, import_path, make_case_inputs
    from mini_kv.worker.loader import load_op

    device = job.device
    op = load_op(job.library, job.op)
    factory = import_path(job.inputs)
    args = make_case_inputs(factory, job.params, job.dtype, device, int(job.seed))
    digest = input_digest(args)
    pristine = clone_args(args)
    cuda = torch.device(device).type == "cuda"
    out = None
    for _ in range(int(job.warmup) + int(job.calls)):
        out = op(*args)
    if cuda:
        torch.cuda.synchronize()
    reference = import_path(job.reference)
    tol = job.tolerance
    check = compare(out, reference(*pristine), tol["atol"], tol["rtol"])
    errors = {k: getattr(check.errors, k, None) for k in ("max_abs_err", "mismatches")}
    return TargetResult(
        digest,
        int(job.warmup) + int(job.calls),
        {"ok": check.ok, "reason": check.reason, **errors},
        torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu",
    )
