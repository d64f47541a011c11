"""The ncu command lines, running them, and telling their failures apart.

Clocks are never touched (`--clock-control none`): the GPU runs at the clocks every other
measurement of this machine sees, and a profile never leaves the GPU locked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from mini_kv.proc import run_with_timeout

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "WarpStateStats", "LaunchStats")
PERMISSION_MARK = "ERR_NVGPUCTRPERM"
NO_KERNELS_MARK = "No kernels were profiled"
# `__global__ [qualifiers] void [qualifiers] name(`: __launch_bounds__(...) may stand before or after
# `void` (both compile), and must never be taken for the name.
_QUALIFIERS = r"(?:(?:__launch_bounds__\s*\([^)]*\)|static|inline|__noinline__|__forceinline__)\s*)*"
_GLOBAL = re.compile(r"__global__\s+" + _QUALIFIERS + r"void\s+" + _QUALIFIERS + r"([A-Za-z_]\w*)\s*\(")


def find_ncu(explicit: str | None = None) -> str | None:
    """--ncu, else $MINI_KV_NCU, else `ncu` on PATH, else the toolkit's copy under CUDA_HOME."""
    for cand in (explicit, os.environ.get("MINI_KV_NCU")):
        if cand:
            return cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    from mini_kv.environment import cuda_home_dir

    home = cuda_home_dir()
    cand = os.path.join(home, "bin", "ncu") if home else None
    return cand if cand and os.path.isfile(cand) else None


def ncu_version(ncu: str) -> str | None:
    """The "Version ..." line of `ncu --version`."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.lower().startswith("version")), lines[-1] if lines else None)


def kernel_names(candidate_dir: Path, cuda_sources: list[str]) -> list[str]:
    """Names of the __global__ functions defined in the candidate's CUDA sources."""
    names: list[str] = []
    for src in cuda_sources:
        path = Path(candidate_dir) / src
        if path.suffix in (".cu", ".cuh") and path.is_file():
            text = re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(errors="replace"), flags=re.S)
            names += [n for n in _GLOBAL.findall(text) if n not in names]
    return names


def profile_command(
    ncu: str, report_base: Path, kernel_filter: str, launch_skip: int, target: list[str]
) -> list[str]:
    """ncu around the target: one launch of the filtered kernel after `launch_skip` matching ones.

    --launch-skip counts only launches that pass the kernel filter, so the warm-up calls of the
    candidate are skipped and nothing else shifts the count.
    """
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all"]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += ["--kernel-name-base", "function", "--kernel-name", f"regex:{kernel_filter}"]
    cmd += ["--launch-skip", str(launch_skip), "--launch-count", "1"]
    return [*cmd, "--export", str(report_base), "--force-overwrite", *target]


def import_command(ncu: str, report: Path) -> list[str]:
    """Re-import the saved report and export the raw page (every collected metric, one row per launch)."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


@dataclass(frozen=True)
class Command:
    """One ncu run as profile.json's `ncu.commands` records it (its output is in its log)."""

    name: str
    argv: list[str]
    returncode: int
    timed_out: bool
    duration_s: float
    log: str


def run_logged(
    name: str,
    cmd: list[str],
    log: Path,
    timeout: float,
    env: dict | None = None,
    cwd: str | None = None,
    spec=None,
) -> tuple[Command, str, str]:
    """Run `cmd` jailed (mini_kv.jail, as `spec` says: ncu reads what the target made), keep
    stdout+stderr in `log`: its record (for profile.json), stdout, stderr."""
    from mini_kv import jail
    from mini_kv.runner import default_sandbox

    t0 = time.perf_counter()
    res = jail.run(cmd, spec or jail.JailSpec(), default_sandbox(), timeout=timeout, env=env, cwd=cwd)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        f"$ {' '.join(cmd)}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}\n"
        f"--- exit {res.returncode}{' (timed out)' if res.timed_out else ''}\n"
    )
    duration = round(time.perf_counter() - t0, 3)
    return Command(name, cmd, res.returncode, res.timed_out, duration, log.name), res.stdout, res.stderr


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


# ------------------------------------------------------------------------------- doctor


def _admin_only() -> bool | None:
    """The driver's RmProfilingAdminOnly setting (True: only root may read counters), if readable."""
    try:
        text = Path("/proc/driver/nvidia/params").read_text()
    except OSError:
        return None
    m = re.search(r"RmProfilingAdminOnly:\s*(\d+)", text)
    return None if m is None else m.group(1) != "0"


PROBE = "import torch; x = torch.ones(1024, device='cuda'); (x + 1).sum().item()"


def probe_counters(ncu: str, timeout: float = 180.0) -> tuple[bool, str]:
    """Profile one tiny torch kernel: can this user read the counters here? (ok, what was seen)."""
    import sys

    flags = "--clock-control none --metrics gpu__time_duration.sum --launch-count 1 --csv --page raw"
    cmd = [ncu, *flags.split(), sys.executable, "-c", PROBE]
    res = run_with_timeout(cmd, timeout=timeout)
    out = res.stdout + res.stderr
    if PERMISSION_MARK in out:
        return False, f"no: permission denied ({PERMISSION_MARK})"
    if res.timed_out:
        return False, f"no: the probe did not finish within {timeout:.0f} s"
    if res.returncode != 0 or "gpu__time_duration.sum" not in out:
        last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
        return False, f"no: probe exited {res.returncode}: {last[:200]}"
    return True, "yes (profiled a probe kernel)"


def doctor_rows(gpu_visible: bool, probe: bool = True) -> list[dict]:
    """Rows for `doctor`: is ncu there, which version, and can it read the counters."""
    fix_perm = (
        "run as root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0 "
        "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
    )
    ncu = find_ncu()
    rows = [
        {
            "name": "ncu",
            "value": f"{ncu} ({ncu_version(ncu)})" if ncu else "not found",
            "ok": ncu is not None,
            "blocks": "profile (optional)",
            "fix": "install Nsight Compute (ships with the CUDA toolkit) and put "
            "ncu on PATH, or set MINI_KV_NCU",
        }
    ]
    if ncu is None:
        rows.append(
            {
                "name": "ncu counters",
                "value": "not checked: ncu not found",
                "ok": False,
                "blocks": "profile (optional)",
                "fix": "install Nsight Compute first",
            }
        )
        return rows
    admin = _admin_only()
    if admin and os.geteuid() != 0:
        value, ok = "no: the driver restricts counters to admin users (RmProfilingAdminOnly=1)", False
    elif not gpu_visible:
        value, ok = "not checked: no GPU visible", False
    elif not probe:
        value, ok = "not checked", False
    else:
        ok, value = probe_counters(ncu)
    rows.append(
        {
            "name": "ncu counters",
            "value": value,
            "ok": ok,
            "blocks": "profile (optional)",
            "fix": fix_perm
            if "permission" in value or "admin" in value
            else "run on a machine with a GPU; see the probe's message",
        }
    )
    return rows
