"""Worker side: has the solution replaced the functions that judge or time it?

The checks are shared with the task-card worker and live in `mini_kv.worker.integrity`; this module
keeps the names the SOL-ExecBench worker calls.
"""

from __future__ import annotations

from mini_kv.worker.integrity import Violation, changed, snapshot, violations

__all__ = ["Violation", "changed", "snapshot", "violations", "reward_hack_log"]


def reward_hack_log(code: str, message: str) -> str:
    """A REWARD_HACK trace's log starts with the reason code."""
    return f"{code}: {message}"
