"""Worker side: has the solution replaced the functions that judge or time it?

The solution runs in the same process as the checks and timers (it must, to be timed on the same
stream), so after importing it and after each call we compare the identity of every function the
verdict depends on with a snapshot taken before the solution was imported.
"""

from __future__ import annotations

import importlib
import time

import torch

WATCHED = {
    "mini_kv.worker.timing": ("measure", "time_cupti", "time_graph", "time_events", "time_wallclock",
                              "iteration_activity", "L2Flusher"),
    "mini_kv.solexec.check": ("compare",),
    "mini_kv.solexec.inputs": ("make_inputs", "allocate_outputs", "normalize_outputs", "clone_inputs"),
    "mini_kv.solexec.evaluate": ("evaluate_workload",),
    "mini_kv.judge.stats": ("summarize_repeats", "speedup"),
}


def _watched_objects() -> dict[str, object]:
    found = {f"{mod}.{name}": getattr(importlib.import_module(mod), name)
             for mod, names in WATCHED.items() for name in names}
    found.update({
        "time.perf_counter": time.perf_counter, "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.Tensor.__eq__": torch.Tensor.__eq__, "torch.isfinite": torch.isfinite,
    })
    return found


def snapshot() -> dict[str, int]:
    return {name: id(obj) for name, obj in _watched_objects().items()}


def changed(before: dict[str, int]) -> list[str]:
    """Names whose object is no longer the one snapshotted."""
    now = snapshot()
    return sorted(name for name, ident in before.items() if now.get(name) != ident)
