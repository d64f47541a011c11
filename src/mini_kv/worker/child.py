"""Child-process entry: `python -m mini_kv.worker.child --result-fd N`, job JSON on stdin.

Results go back one JSON line per event on a pipe the parent owns; the parent alone writes
attempt files. A `begin` event precedes each case so that a crash or hang is pinned on it.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import traceback

POISONED_MARKERS = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS", "cudaError")


class Channel:
    """Events signed with a per-run key from the parent, so bytes written to the fd by anything
    that does not hold the key (e.g. a candidate scanning for open fds) are rejected."""

    def __init__(self, fd: int, key: bytes):
        self.f = os.fdopen(fd, "w", buffering=1)
        self.key = key
        self.seq = 0

    def send(self, **event) -> None:
        self.seq += 1
        body = json.dumps({**event, "seq": self.seq}, default=str)
        mac = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
        self.f.write(json.dumps({"mac": mac, "body": body}) + "\n")
        self.f.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--warm-profiler", action="store_true")
    ns = parser.parse_args()
    import torch  # noqa: F401 - every job needs it; loading it before the job arrives overlaps the parent's work

    if ns.warm_profiler:
        _warm_profiler()
    job = json.load(sys.stdin)
    chan = Channel(ns.result_fd, bytes.fromhex(job.pop("channel_key")))
    _limit_memory(job)
    try:
        return run_job(job, chan)
    except Exception as exc:  # noqa: BLE001 - report, then exit non-zero
        chan.send(event="fatal", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        return 3


def _warm_profiler() -> None:
    """The first CUPTI session of a process costs seconds (about 4 s on an H200, against 5 ms for
    each later one): a child started before its job pays it while the parent still prepares the job.
    No candidate code has been loaded yet; the harness's snapshot is taken after this."""
    import torch

    if not torch.cuda.is_available():
        return
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - only a head start: timing reports a profiler that cannot run
        pass


def _limit_memory(job: dict) -> None:
    """On CPU, cap the address space so an op that allocates without bound fails inside this
    child (a clean error) instead of exhausting the machine. Not on CUDA: its driver maps huge
    virtual ranges."""
    limit = job.get("memory_limit_bytes")
    if limit and not str(job["device"]).startswith("cuda"):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_job(job: dict, chan: Channel) -> int:
    if job.get("kind") == "sol":  # a SOL-ExecBench solution: same channel, its own stages
        from mini_kv.worker import sol_child

        return sol_child.run_job(job, chan)
    import torch

    from mini_kv.status import Status
    from mini_kv.worker import benchmark, contract, correctness, integrity, loader
    from mini_kv.worker.inputs import import_path

    if job.get("project_root") and job["project_root"] not in sys.path:
        sys.path.append(job["project_root"])  # the card's own modules, as the loader imports them
    device = job["device"]
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))
    # One intra-op thread on CPU: the reference gets no parallelism the candidate lacks, and
    # timings do not swing with the other core's load.
    torch.set_num_threads(job.get("threads") or 1)
    reference = import_path(job["reference"])
    factory = import_path(job["inputs"])
    # what the harness relies on, before any candidate code runs (the library's static initialisers)
    guard = integrity.Guard(integrity.snapshot())
    known = loader.op_names()
    try:
        op = loader.load_op(job["library"], job["op"])
    except Exception as exc:  # noqa: BLE001
        hint = loader.registration_hint(job["op"], loader.op_names() - known)
        chan.send(event="load", ok=False, reason=f"{type(exc).__name__}: {exc}", hint=hint)
        return 0
    try:
        guard.check("loading the library")
    except integrity.Violation as v:
        chan.send(event="load", ok=False, integrity=v.code, reason=str(v))
        return 0
    kernels = loader.registered_kernels(job["op"])
    # no CPU or Meta kernel often means the kernels went to another namespace or op name: say which
    hint = None if kernels.get("CPU") and kernels.get("Meta") else \
        loader.registration_hint(job["op"], loader.op_names() - known)
    if job.get("baseline"):
        # the regression gate's same-run comparison: the baseline's own build, under its own
        # dispatcher namespace, takes the reference's place in the interleaved timing below
        try:
            reference = loader.load_op(job["baseline"]["library"], job["baseline"]["op"])
            guard.check("loading the baseline's library")
        except Exception as exc:  # noqa: BLE001 - a Violation too: either way no same-run comparison
            chan.send(event="load", ok=False, reason=f"the baseline's build did not load: {type(exc).__name__}: {exc}")
            return 0
    chan.send(event="load", ok=True, kernels=kernels, hint=hint)
    task_id, salt = job["task_id"], job["salt"]

    for case in job["cases"]:
        # `inputs` until the card's factory has made them: a crash or hang there is the card's fault
        chan.send(event="begin", stage="inputs", case=case["id"])
        tol = job["tolerances"].get(case["dtype"])
        rec = correctness.run_case(op, reference, factory, task_id, case, tol, device, salt, guard,
                                   on_inputs=lambda c=case: chan.send(event="begin", stage="correctness", case=c["id"]))
        chan.send(event="case", record=rec)
        if rec["status"] == "RUNTIME_ERROR" and any(m in rec.get("reason", "") for m in POISONED_MARKERS):
            return 4  # the CUDA context may be poisoned: the parent continues in a fresh child

    checks = {"opcheck": contract.opcheck, "gradcheck": contract.gradcheck}
    for name in job.get("contract", []):
        chan.send(event="begin", stage="contract", case=name)
        rec = checks[name](op, factory, task_id, job["all_cases"], device, salt)
        try:
            guard.check(f"after {name}")
        except integrity.Violation as v:
            rec = {**rec, "status": Status.FAILED, "integrity": v.code, "reason": str(v)}
        chan.send(event="contract", name=name, record=rec)

    for case in job.get("bench_cases", []):
        chan.send(event="begin", stage="benchmark", case=case["id"])
        try:
            rec = benchmark.bench_case(op, reference, factory, task_id, case, job["benchmark"],
                                       job["tolerances"][case["dtype"]], device, salt, job.get("peak_bw"),
                                       job.get("exprs", {}), guard)
        except integrity.Violation as v:
            rec = {"id": case["id"], "status": Status.BENCHMARK_ERROR, "integrity": v.code, "reason": str(v)}
        except Exception as exc:  # noqa: BLE001 - a failed benchmark is a result
            rec = {"id": case["id"], "status": Status.BENCHMARK_ERROR, "reason": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-4000:]}
        chan.send(event="bench", record=rec)
    chan.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
