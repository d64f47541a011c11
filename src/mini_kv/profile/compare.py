"""`compare-profiles A B`: refuse what is not comparable, then lay the metrics that explain
performance side by side.

Two profiles compare only when they measured the same task and case, on the same environment
(machine, driver, torch, compilers, ncu), with the same inputs; a failed or altered profile never
compares. The profiler's duration is shown for completeness but labelled as a replay duration:
the latency comparison is the A/B timing (`mini_kv.profile.ab`).
"""

from __future__ import annotations

from pathlib import Path

from mini_kv.profile.reasons import CompareRefused
from mini_kv.profile.store import ProfileUnusable, read_profile, resolve
from mini_kv.status import ProfileStatus

# (label, summary key, how to show it); "ratio" rows get B/A
ROWS = (
    ("kernel", "kernel_name", "text"),
    ("grid size (blocks)", "grid_size", "int"),
    ("block size (threads)", "block_size", "int"),
    ("registers / thread", "registers_per_thread", "int"),
    ("waves per SM", "waves_per_sm", "float"),
    ("theoretical occupancy %", "theoretical_occupancy_pct", "pct"),
    ("achieved occupancy %", "achieved_occupancy_pct", "pct"),
    ("DRAM throughput % of peak", "dram_throughput_pct", "pct"),
    ("DRAM bandwidth GB/s", "dram_bandwidth_Bps", "GBps"),
    ("SM throughput % of peak", "sm_throughput_pct", "pct"),
    ("ncu replay duration µs (not latency)", "duration_ns", "us"),
)


def load_pair(a: str, b: str, artifacts: Path) -> tuple[dict, dict]:
    """Both profiles, verified; CompareRefused with every reason found (either side)."""
    docs, problems = [], []
    for label, spec in (("A", a), ("B", b)):
        try:
            doc = read_profile(resolve(spec, artifacts))
        except ProfileUnusable as exc:
            problems.append({"code": exc.code, "message": f"{label}: {exc.message}", "profile": label})
            docs.append(None)
            continue
        if doc["status"] != ProfileStatus.OK:
            r = doc["reason"] or {}
            problems.append(
                {
                    "code": "PROFILE_FAILED",
                    "profile": label,
                    "message": f"{label} ({doc['profile_id']}) failed: {r.get('code')}: {r.get('message')}",
                }
            )
        docs.append(doc)
    if problems:
        raise CompareRefused(problems)
    return docs[0], docs[1]


def _task_key(d: dict) -> dict:
    t = d["task"]
    return {"id": t["id"], "version": t["version"], "operator_version": t["operator"]["version"]}


def _case_key(d: dict) -> dict:
    c = d["case"]
    return {"id": c["id"], "dtype": c["dtype"], "params": c["params"]}


def _env_key(d: dict) -> dict:
    return {"environment_key": d["environment_key"], "device": d["device"], "ncu": d["ncu"]["version"]}


def _input_key(d: dict) -> dict:
    c = d["case"]
    return {"seed": c["seed"], "input_sha256": c["input_sha256"]}


CHECKS = (
    ("TASK_MISMATCH", _task_key),
    ("CASE_MISMATCH", _case_key),
    ("ENVIRONMENT_MISMATCH", _env_key),
    ("INPUT_MISMATCH", _input_key),
)


def refusals(a: dict, b: dict) -> list[dict]:
    """Every comparability check that fails, with the differing fields."""
    out = []
    for code, key in CHECKS:
        ka, kb = key(a), key(b)
        diff = {k: {"A": ka[k], "B": kb[k]} for k in ka if ka[k] != kb[k]}
        if code == "INPUT_MISMATCH" and not diff and ka["input_sha256"] is None:
            diff = {"input_sha256": {"A": None, "B": None}}  # an unknown digest proves nothing
        if diff:
            shown = ", ".join(f"{k} {v['A']!r} vs {v['B']!r}" for k, v in diff.items())
            out.append({"code": code, "message": shown, "fields": diff})
    return out


def _stall_rows(sa: dict, sb: dict) -> list[dict]:
    """The union of both profiles' top stall reasons, by the larger of the two values."""
    va = {s["reason"]: s["value"] for s in sa["top_stalls"]}
    vb = {s["reason"]: s["value"] for s in sb["top_stalls"]}
    reasons = sorted(set(va) | set(vb), key=lambda r: (-max(va.get(r, 0.0), vb.get(r, 0.0)), r))
    return [{"reason": r, "A": va.get(r), "B": vb.get(r)} for r in reasons]


def deltas(a: dict, b: dict) -> dict:
    """The comparison rows (A, B, B/A) and the stall table."""
    sa, sb = a["summary"], b["summary"]
    rows = []
    for label, key, kind in ROWS:
        va, vb = sa.get(key), sb.get(key)
        ratio = (
            vb / va
            if kind != "text" and isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va
            else None
        )
        rows.append({"label": label, "key": key, "kind": kind, "A": va, "B": vb, "ratio": ratio})
    return {"rows": rows, "stalls": _stall_rows(sa, sb)}


def compare(a_spec: str, b_spec: str, artifacts: Path) -> dict:
    """Both profiles read and checked, then the deltas; CompareRefused if they do not compare."""
    a, b = load_pair(a_spec, b_spec, artifacts)
    problems = refusals(a, b)
    if problems:
        raise CompareRefused(problems)
    return {"A": _ident(a), "B": _ident(b), **deltas(a, b), "profiles": (a, b)}


def _ident(d: dict) -> dict:
    return {
        "profile_id": d["profile_id"],
        "path": d["path"],
        "candidate": d["candidate"]["id"],
        "task": d["task"]["id"],
        "case": d["case"]["id"],
        "kernel": d["summary"]["kernel_name"],
    }


def fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "text":
        return str(value)
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "pct":
        return f"{value:.1f}"
    if kind == "GBps":
        return f"{value / 1e9:,.1f}"
    if kind == "us":
        return f"{value / 1e3:,.2f}"
    return f"{value:.3g}"
