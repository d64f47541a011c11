"""What the jail (mini_kv.jail) costs: its start per child, and whole verify/bench runs side by side
with another commit's mini_kv (default: fe16f55, main before the jail), measured in one run.

    python benchmarks/jail_cost.py [--runs N] [--baseline COMMIT | --baseline-src DIR] [--device cpu|cuda]
                                   [--only TEXT] [--skip-start] [--skip-commands]

1. start: from asking for a jailed child (`jail.popen`) until its interpreter runs (`python -I -S`
   writes a byte on a pipe), median of N, beside the same child started plainly (`subprocess.Popen`):
   jailed as a worker child starts (it applies Landlock itself), the same in a memory cgroup of its own
   (the memory_cap layer), the same without its CPU-time meter's cgroup (what the cpu_meter layer
   costs), and as a tool starts (through the Landlock prelude); and the same with a
   full `python` start (site-packages, no -I -S).
2. commands: on CPU, `verify` of every shipped candidate of tasks/vector_add.yaml and `bench` of the
   shipped custom_inputs_matmul solution; with `--device cuda`, `verify` of every candidate of
   tasks/vector_add.yaml and `bench` of rmsnorm's shipped cuda_cpp and pytorch solutions on the GPU
   (cold L2, as bench times SOL problems). Baseline and this checkout alternate, N rounds after one
   untimed warm-up each (builds cached), medians of the wall time. `--baseline-src DIR`: the
   baseline's `src/` already extracted (`git archive COMMIT src schemas | tar -x -C DIR/..`), for a
   machine without the git history (the GPU machine gets a copy of the working tree only).

3. bytecode: a jailed child importing torch and opcheck's compiler stack (what a worker's subject
   does for a card), median of N: where the environment keeps no bytecode (an empty
   `PYTHONPYCACHEPREFIX`, as on an image that sets PYTHONDONTWRITEBYTECODE and ships none), and from
   mini_kv's cache once `pycache.warm_for_children` has written it (`--skip-bytecode` leaves it out).

4. memory watch: where no memory cgroup can be made, `jail.MemoryWatch` reads the jailed tree's memory
   every 0.1 s: one read of a tree of a process holding 300 MiB and 0, 8 and 32 forks of it, page by
   page (`/proc/PID/status`, every poll) and by each page's share (`smaps_rollup`, only when the first
   puts the tree past its cap), median of N (`--skip-watch` leaves it out).

Each version runs in a project of its own (a copy of tasks/, problems/, solutions/, with its own
`.build/`): versions that record builds differently would otherwise discard each other's cache entries
and rebuild on every run.

Prints one JSON document (machine, date, figures). docs/measurements/jail.md keeps a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mini_kv import jail  # noqa: E402 - this checkout's, whatever is installed
from mini_kv.codec import to_json  # noqa: E402


def _until_running(start, argv: list[str]) -> float:
    """Seconds from `start(argv, stdout=pipe)` until the child has written its first byte."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    proc = start(argv, w)
    os.close(w)
    os.read(r, 1)
    elapsed = time.perf_counter() - t0
    os.close(r)
    proc.wait()
    if hasattr(proc, "cleanup"):
        proc.cleanup()
    return elapsed


def start_costs(runs: int) -> dict:
    info = jail.probe()
    spec = jail.JailSpec()
    code = "import os; os.write(1, b'x')"
    plain = lambda argv, w: subprocess.Popen(argv, stdout=w)  # noqa: E731
    # as a worker child starts: it applies the Landlock rules itself, no prelude interpreter
    worker = lambda argv, w: jail.popen(argv, spec, info, stdout=w, self_landlock=True)  # noqa: E731
    # as a tool starts (nvcc, ncu): the prelude applies Landlock, then execs it
    tool = lambda argv, w: jail.popen(argv, spec, info, stdout=w)  # noqa: E731
    # as a worker, in a memory cgroup of its own too (the memory_cap layer; where the machine has none,
    # the same start as the worker's)
    capped = jail.JailSpec(limits=jail.Limits(memory_bytes=4 << 30))
    worker_capped = lambda argv, w: jail.popen(argv, capped, info, stdout=w, self_landlock=True)  # noqa: E731
    # as a worker without its CPU-time meter (the cpu_meter layer's own cgroup left out): what that layer
    # costs a start, where the machine has it
    unmetered = dataclasses.replace(jail._cgroup_roots(), cpu=None)

    def worker_unmetered(argv, w):
        with mock.patch.object(jail, "_cgroup_roots", lambda: unmetered):
            return jail.popen(argv, spec, info, stdout=w, self_landlock=True)

    out = {"jail": to_json(info.record())}
    for label, argv in (
        ("python -I -S", [sys.executable, "-I", "-S", "-c", code]),
        ("python", [sys.executable, "-c", code]),
    ):
        hows = (
            ("plain", plain),
            ("jailed as a worker", worker),
            ("jailed as a worker, memory cap", worker_capped),
            ("jailed as a worker, no cpu_meter group", worker_unmetered),
            ("jailed as a tool", tool),
        )
        for how, start in hows:
            _until_running(start, argv)  # warm the page cache and the seccomp program
            xs = [_until_running(start, argv) for _ in range(runs)]
            out[f"{label} {how}"] = {"median_ms": round(statistics.median(xs) * 1000, 1), "runs": runs}
    return out


def bytecode_costs(runs: int) -> dict:
    """A jailed child's imports without bytecode and from mini_kv's warmed cache (module docstring, 3)."""
    from mini_kv import pycache

    code = "import torch, torch._dynamo, torch.testing._internal.optests"
    info, spec, out = jail.probe(), jail.JailSpec(), {}
    with tempfile.TemporaryDirectory(prefix="mini-kv-bytecode-") as tmp:
        for label, where in (("no bytecode", "empty"), ("mini_kv's warmed cache", "cache")):
            prefix = Path(tmp) / where
            prefix.mkdir()
            with mock.patch.object(sys, "pycache_prefix", str(prefix)):
                if where == "cache":
                    with mock.patch.object(sys, "dont_write_bytecode", False):
                        pycache.warm_for_children.__wrapped__()
                xs = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    res = jail.run([sys.executable, "-c", code], spec, info, timeout=600)
                    if res.returncode != 0:
                        raise SystemExit(f"the jailed import failed ({label}):\n{res.output[-3000:]}")
                    xs.append(time.perf_counter() - t0)
            out[label] = {"median_s": round(statistics.median(xs), 2), "runs_s": [round(x, 2) for x in xs]}
    return out


def _baseline_src(commit: str, where: Path) -> Path:
    """The baseline commit's src/ and schemas/ (git archive); both versions run on this checkout's files."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src", "schemas"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where / "src"


CPU_COMMANDS = {
    "verify vector_add (every candidate, cpu)": [
        "verify",
        "--task",
        "tasks/vector_add.yaml",
        "--candidate",
        "*",
        "--device",
        "cpu",
    ],
    "bench custom_inputs_matmul pytorch (cpu)": [
        "bench",
        "problems/sol-execbench/custom_inputs_matmul",
        "--solution",
        "solutions/custom_inputs_matmul/pytorch/solution.json",
        "--device",
        "cpu",
    ],
}
_RMSNORM = ["bench", "problems/sol-execbench/rmsnorm", "--device", "cuda", "--solution"]
CUDA_COMMANDS = {
    "verify vector_add (every candidate, cuda)": CPU_COMMANDS["verify vector_add (every candidate, cpu)"][:-1]
    + ["cuda"],
    "bench rmsnorm cuda_cpp (cuda)": [*_RMSNORM, "solutions/rmsnorm/cuda_cpp/solution.json"],
    "bench rmsnorm pytorch (cuda)": [*_RMSNORM, "solutions/rmsnorm/pytorch/solution.json"],
}


def _project(where: Path) -> Path:
    """A project of its own for one version: the inputs the commands name, and its own .build/."""
    where.mkdir(parents=True)
    for d in ("tasks", "problems", "solutions", "candidates"):
        if (ROOT / d).exists():
            shutil.copytree(ROOT / d, where / d, symlinks=True)
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


def _run(src: Path, args: list[str], store: Path, project: Path = ROOT) -> float:
    # the version's src/ first; the rest of PYTHONPATH stays (the GPU machine's carried wheels)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "mini_kv", *args, "--artifacts", str(store)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    if res.returncode not in (0, 5):  # 5: an unstable benchmark on a busy machine, still a whole run
        raise SystemExit(f"{' '.join(args)} with {src}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return elapsed


def command_costs(runs: int, commit: str, device: str, baseline_src: str | None, only: str = "") -> dict:
    out = {}
    commands = {k: v for k, v in (CUDA_COMMANDS if device == "cuda" else CPU_COMMANDS).items() if only in k}
    with tempfile.TemporaryDirectory(prefix="mini-kv-jail-cost-") as tmp:
        base = Path(baseline_src).resolve() if baseline_src else _baseline_src(commit, Path(tmp))
        versions = {f"baseline {commit}": base, "this checkout": ROOT / "src"}
        projects = {v: _project(Path(tmp) / f"project-{i}") for i, v in enumerate(versions)}
        for name, args in commands.items():
            times: dict[str, list[float]] = {v: [] for v in versions}
            for label, src in versions.items():  # untimed warm-up: builds cached, page cache warm
                _run(src, args, projects[label] / "artifacts", projects[label])
            for _ in range(runs):
                for label, src in versions.items():
                    times[label].append(_run(src, args, projects[label] / "artifacts", projects[label]))
                    print(f"{name}: {label} {times[label][-1]:.2f} s", file=sys.stderr, flush=True)
            med = {v: statistics.median(xs) for v, xs in times.items()}
            before, after = med[f"baseline {commit}"], med["this checkout"]
            out[name] = {
                **{
                    v: {"median_s": round(m, 2), "runs_s": [round(x, 2) for x in times[v]]}
                    for v, m in med.items()
                },
                "ratio": round(after / before, 3),
            }
    return out


def watch_costs(runs: int) -> dict:
    """Milliseconds of one MemoryWatch read (proc.tree_resident_bytes, both ways) per tree size."""
    from mini_kv.proc import tree_resident_bytes

    code = (
        "import os, sys, time\nb = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])\n"
        "for _ in range(int(sys.argv[1])):\n    if os.fork() == 0:\n        time.sleep(600)\n        os._exit(0)\n"
        "print('ready', flush=True); time.sleep(600)\n"
    )
    out = {}
    for forks in (0, 8, 32):
        tree = subprocess.Popen([sys.executable, "-c", code, str(forks)], stdout=subprocess.PIPE, text=True)
        try:
            tree.stdout.readline()
            row = {}
            for proportional in (False, True):
                times, size = [], 0
                for _ in range(max(runs, 5)):
                    t0 = time.perf_counter()
                    size = tree_resident_bytes(tree.pid, proportional)
                    times.append((time.perf_counter() - t0) * 1e3)
                key = "by_share" if proportional else "page_by_page"
                row[key] = {"ms": round(statistics.median(times), 2), "counted_mib": round(size / 2**20)}
            out[f"{forks} forks"] = row
        finally:
            subprocess.run(["pkill", "-KILL", "-P", str(tree.pid)], check=False)
            tree.kill()
            tree.wait()
            tree.stdout.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--baseline", default="fe16f55", help="the baseline commit (its name, with --baseline-src)"
    )
    ap.add_argument("--baseline-src", help="the baseline's src/, already extracted")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--only", default="", help="only the commands whose name holds this text")
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--skip-commands", action="store_true")
    ap.add_argument("--skip-bytecode", action="store_true")
    ap.add_argument("--skip-watch", action="store_true")
    ns = ap.parse_args()
    doc = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {platform.release()}",
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    if not ns.skip_start:
        doc["start"] = start_costs(max(ns.runs * 4, 21))
    if not ns.skip_bytecode:
        doc["bytecode"] = bytecode_costs(ns.runs)
    if not ns.skip_watch:
        doc["memory_watch"] = watch_costs(ns.runs)
    if not ns.skip_commands:
        doc["commands"] = command_costs(ns.runs, ns.baseline, ns.device, ns.baseline_src, ns.only)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
