"""Solutions per hour through the batch evaluator, on a labelled corpus (benchmarks/make_corpus.py).

    python benchmarks/throughput.py DIR [--device D] [--gpus all|0,1] [--limit N] [--part K/N]
                                        [--sequential [--time-limit S] | --no-ahead] [--json]

Runs the corpus's solutions through the batch evaluator (`mini_kv.cli_batch.run_items`, what `mini-kv
batch` and `bench` with several solutions run: builds ahead on every core while the GPU evaluates, or a
Dask cluster with --gpus), or with --sequential one `python -m mini_kv bench` call per solution, as a
user's loop does today. Prints solutions per hour, the time per stage (for the batch on one device
also `between solutions`: wall time that no solution's run holds, and with --json the `timeline`: when
each solution ran, and `stages_by_solution`: each one's own seconds per stage), the GPU busy fraction (the
GPUs' utilization sampled through NVML or nvidia-smi; n/a without a GPU) and every verdict that differs
from its label. Exit status 1 if any verdict is wrong, 2 on bad input.

A verdict is read back from the stored attempt: attempt.json's status as the store recomputes it, the
statuses of its traces and its geometric-mean speedup. It is wrong when the status differs from the
label's, or, where the label names a `workload_status`, when a failing workload's status is another.
A slow-but-correct solution whose speedup is not below 1 is listed apart (timing, not a verdict).

--no-ahead runs the batch without starting the next solution's worker while one is evaluated (the
batch's look-ahead, runner.AheadOfTurn), for the side-by-side figure of what it saves.

--limit N takes a stratified slice: the solutions grouped by (label, language), each group its share of
N, so a slice of 60 keeps the corpus's mix of languages and verdicts. --part K/N runs the K-th of N
interleaved parts of that slice, so that N calls (each within a time limit) run one slice between them;
the slice's rate is then its size over the sum of the parts' wall times. --time-limit S (sequential
only) stops the call under way after S seconds and reports the solutions that finished before it
(`unfinished` names the rest), so a run cut by a machine's call limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSED = "PASSED"
# cumulative laps of pipeline.run_stages -> the stage each one ends
STAGES = (
    ("prepare", "prepared_s"),
    ("build", "built_s"),
    ("worker start", "worker_ready_s"),
    ("evaluate", "evaluated_s"),
    ("store", "recorded_s"),
)


class CorpusError(Exception):
    """A corpus that cannot be run: says which file and what is wrong."""


# ------------------------------------------------------------------------------------ the corpus


@dataclass(frozen=True)
class Entry:
    name: str
    solution: Path
    problem: Path
    language: str
    kind: str
    expect: dict

    @property
    def stratum(self) -> tuple[str, str, str]:
        return (self.expect["status"], self.expect.get("workload_status") or "", self.language)


def load_corpus(corpus_dir: Path) -> tuple[dict, list[Entry]]:
    path = corpus_dir / "corpus.json"
    if not path.is_file():
        raise CorpusError(
            f"{path}: no such file (make one with benchmarks/make_corpus.py --out {corpus_dir})"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = [
            Entry(
                e["name"],
                (corpus_dir / e["solution"]).resolve(),
                (corpus_dir / e["problem"]).resolve(),
                e["language"],
                e["kind"],
                e["expect"],
            )
            for e in data["solutions"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorpusError(f"{path}: not a corpus of make_corpus.py: {type(exc).__name__}: {exc}") from None
    for e in entries:
        if not e.solution.is_file() or not (e.problem / "definition.json").is_file():
            raise CorpusError(
                f"{path}: solution {e.name!r}: {e.solution} or {e.problem}/definition.json missing"
            )
    if not entries:
        raise CorpusError(f"{path}: no solutions (an empty selection is an error, never a pass)")
    return data, entries


def stratified(entries: list[Entry], limit: int | None) -> list[Entry]:
    """`limit` entries in the corpus's proportions of (label, language) groups: every group one while
    `limit` allows, then one at a time to the group furthest below its share; each group's entries taken
    evenly spread over it; the slice keeps the corpus's order."""
    if limit is None or limit >= len(entries):
        return entries
    groups: dict[tuple, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.stratum, []).append(e)
    target = {k: limit * len(g) / len(entries) for k, g in groups.items()}
    share = dict.fromkeys(groups, 1 if limit >= len(groups) else 0)
    first = {k: n for n, k in enumerate(groups)}
    while sum(share.values()) < limit:  # one more to the group furthest below its share
        k = max(
            (k for k in groups if share[k] < len(groups[k])), key=lambda k: (target[k] - share[k], -first[k])
        )
        share[k] += 1
    chosen = {id(g[(i * len(g)) // share[k]]) for k, g in groups.items() for i in range(share[k])}
    return [e for e in entries if id(e) in chosen]


def part_of(entries: list[Entry], part: str | None) -> list[Entry]:
    """`K/N`: every N-th entry from the K-th, so that N calls run one slice between them."""
    if part is None:
        return entries
    k, n = (int(x) for x in part.split("/"))
    return entries[k - 1 :: n]


# ------------------------------------------------------------------------------------ verdicts


@dataclass
class Verdict:
    status: str
    workloads: Counter = field(default_factory=Counter)  # trace statuses
    speedup: float | None = None
    attempt: str | None = None
    note: str = ""

    def text(self) -> str:
        failing = sorted(s for s in self.workloads if s != PASSED)
        return self.status + (f" ({', '.join(failing)})" if failing else "")


def verdict_of(attempt: str | None, fallback: str, note: str = "") -> Verdict:
    """The stored attempt's verdict, through the store's own checks (what `leaderboard` ranks)."""
    from mini_kv.store.index import AttemptInvalid, check_attempt

    if not attempt or not (Path(attempt) / "attempt.json").is_file():
        return Verdict(fallback, note=note or "no attempt stored")
    try:
        row = check_attempt(Path(attempt)).row
    except AttemptInvalid as exc:
        return Verdict("INVALID", attempt=attempt, note=str(exc))
    traces = Path(attempt) / "traces.jsonl"
    lines = traces.read_text(encoding="utf-8").splitlines() if traces.is_file() else []
    evaluations = [json.loads(x)["evaluation"] for x in lines if x.strip()]
    workloads = Counter(e["status"] for e in evaluations)
    # why each failing status was given (its first workload's log, first line): a wrong verdict says why
    why: dict[str, str] = {}
    for e in evaluations:
        why.setdefault(e["status"], (e.get("log") or "").strip().split("\n")[0][:200])
    note = note or "; ".join(f"{s}: {why[s]}" for s in sorted(why) if s != PASSED)
    speedup = row.geomean_speedup
    return Verdict(row.status, workloads, speedup if isinstance(speedup, float) else None, attempt, note)


def is_right(expect: dict, got: Verdict) -> bool:
    if got.status != expect["status"]:
        return False
    if not expect.get("workload_status"):
        return True
    failing = {s for s in got.workloads if s != PASSED}
    return bool(failing) and failing <= {expect["workload_status"]}


# ------------------------------------------------------------------------------------ GPU busy


class BusySampler:
    """The GPUs' utilization (the fraction of each sample period a kernel ran), sampled about every 0.2 s
    in a thread, through NVML (pynvml) or else `nvidia-smi -lms 200`: its mean is the busy fraction.
    `source` says which, or why there is none (no GPU, neither tool)."""

    def __init__(self, indices: list[int]):
        self.samples: list[float] = []
        self.source = "no GPU" if not indices else "neither pynvml nor nvidia-smi"
        self._indices = indices
        self._stop = threading.Event()
        self._read = None
        self._proc = None
        if indices:
            self._read = self._nvml() or self._nvidia_smi()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _nvml(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self._indices]
        except Exception:  # noqa: BLE001 - no pynvml or no NVML: try nvidia-smi
            return None
        self.source = "NVML"

        def read():
            if self._stop.wait(0.2):
                return None
            return [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]

        return read

    def _nvidia_smi(self):
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        ids = ",".join(map(str, self._indices))
        self._proc = subprocess.Popen(
            [exe, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", ids],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.source = "nvidia-smi"

        def read():
            line = self._proc.stdout.readline()
            return [float(line)] if line.strip().replace(".", "", 1).isdigit() else ([] if line else None)

        return read

    def _run(self) -> None:
        while not self._stop.is_set() and (values := self._read()) is not None:
            self.samples += [v / 100.0 for v in values]

    def __enter__(self):
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._read is not None:
            self._thread.join()

    @property
    def fraction(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def gpu_indices(device: str, gpus: str | None) -> list[int]:
    if not device.startswith("cuda"):
        return []
    if gpus and gpus != "all":
        return [int(g) for g in gpus.split(",")]
    if gpus == "all":
        import torch

        return list(range(torch.cuda.device_count()))
    return [int(device.split(":")[1]) if ":" in device else 0]


# ------------------------------------------------------------------------------------ the runs


def stage_seconds(phases: dict) -> dict[str, float]:
    """Seconds per stage from one run's cumulative laps (pipeline.run_stages' `phases`)."""
    out, before = {}, 0.0
    for stage, lap in STAGES:
        if isinstance(phases.get(lap), (int, float)):
            out[stage] = max(0.0, phases[lap] - before)
            before = phases[lap]
    for key, secs in phases.items():  # where the worker's time went, summed over the workloads
        m = re.fullmatch(r"workload_(\w+)_s", key)
        if m and isinstance(secs, (int, float)):
            out[f"  of which {m.group(1)}"] = secs
    return out


def bench_item(name: str, problem: Path, solution: Path, device: str, options: dict, store: Path):
    """One solution as a batch item (cluster.batch.Item), as `batch` makes it from a manifest."""
    from mini_kv.cluster.batch import BENCH, Item
    from mini_kv.solexec.run import BenchOptions

    opts = BenchOptions(solution=str(solution), device=device, artifacts=str(store), **options)
    return Item(BENCH, name, str(problem), None, opts, str(store))


def run_items_here(items: list, gpus: str | None = None) -> list:
    """The items through `batch`'s evaluator: in this process, or on an embedded Dask cluster with `gpus`."""
    from mini_kv.cli_batch import run_items
    from mini_kv.cluster.cluster import placement_from

    where = placement_from(
        argparse.Namespace(
            gpus=gpus, workers=None, cluster=None, retries=2, tls_ca_file=None, tls_cert=None, tls_key=None
        )
    )
    return run_items(items, where)


def run_batch(
    entries: list[Entry],
    device: str,
    options: dict,
    store: Path,
    gpus: str | None,
    timeline: list,
    by_solution: dict | None = None,
):
    """Every entry through the batch evaluator; (verdicts by name, seconds per stage summed). In this
    process (no `gpus`) `timeline` gets [solution, start s, end s] for each, from the batch's start, in
    the order they ran (cluster.batch.next_turn's); `by_solution` each one's own seconds per stage."""
    from mini_kv.cluster import batch

    items = [bench_item(e.name, e.problem, e.solution, device, options, store) for e in entries]
    real, t0 = batch.run_item, time.perf_counter()

    def run_item(item, *args, **kw):
        start = time.perf_counter() - t0
        try:
            return real(item, *args, **kw)
        finally:
            timeline.append([item.label, round(start, 2), round(time.perf_counter() - t0, 2)])

    batch.run_item = run_item
    try:
        results = run_items_here(items, gpus)
    finally:
        batch.run_item = real
    stages: Counter = Counter()
    verdicts = {}
    for r in results:
        own = stage_seconds(r.detail.phases if r.detail is not None else {})  # BENCH items only
        stages.update(own)
        if by_solution is not None:
            by_solution[r.label] = {k: round(v, 2) for k, v in own.items()}
        reason = (r.reason or "") if r.detail is None else ""
        verdicts[r.label] = verdict_of(r.attempt, str(r.status), reason)
    return verdicts, dict(stages)


OPTION_FLAGS = {"give_up_after": "--give-up-after", "memory_limit_gb": "--memory-limit"}


def _cli_call(cmd: list[str], timeout: float | None) -> subprocess.CompletedProcess | None:
    """`cmd` run to its end, or None where `timeout` came first: the call is then stopped as SIGTERM
    stops mini_kv (its workers' trees killed, its jails' dirs and cgroups removed), SIGKILL after 30 s."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_sequential(
    entries: list[Entry], device: str, options: dict, store: Path, deadline: float | None = None
):
    """One `python -m mini_kv bench` call per entry, one after the other; (verdicts, seconds per call).
    At `deadline` (perf_counter) the call under way is stopped and not counted: the verdicts are then of
    the entries that finished, one after the other from the first."""
    flags = [str(x) for k, v in options.items() for x in (OPTION_FLAGS.get(k, "--" + k.replace("_", "-")), v)]
    verdicts, stages = {}, Counter()
    for e in entries:
        cmd = [sys.executable, "-m", "mini_kv", "bench", str(e.problem), "--solution", str(e.solution),
               "--device", device, "--artifacts", str(store), *flags]  # fmt: skip
        t0 = time.perf_counter()
        left = None if deadline is None else deadline - t0
        if left is not None and left <= 0:
            break
        res = _cli_call(cmd, left)
        if res is None:
            print(f"{e.name}: stopped at the time limit ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
            break
        stages["cli call"] += time.perf_counter() - t0
        found = re.search(r"^attempt: (.+)$", res.stdout, re.M)
        tail = (res.stderr.strip().splitlines() or [""])[-1]
        verdicts[e.name] = verdict_of(found and found.group(1).strip(), f"EXIT_{res.returncode}", tail)
        print(f"{e.name}: {verdicts[e.name].text()} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return verdicts, dict(stages)


# ------------------------------------------------------------------------------------ report


def report(entries: list[Entry], verdicts: dict, stages: dict, wall: float, busy: float | None, meta: dict):
    wrong, not_slower = [], []
    for e in entries:
        got = verdicts.get(e.name) or Verdict("NOT_RUN", note="no result")
        if not is_right(e.expect, got):
            wrong.append({"solution": e.name, "kind": e.kind, "language": e.language, "expected": e.expect,
                          "got": got.text(), "attempt": got.attempt, "note": got.note})  # fmt: skip
        elif e.expect.get("slower") and not (got.speedup is not None and got.speedup < 1):
            not_slower.append({"solution": e.name, "speedup": got.speedup})
    return {
        **meta,
        "solutions": len(entries),
        "languages": dict(Counter(e.language for e in entries)),
        "wall_s": round(wall, 2),
        "solutions_per_hour": round(len(entries) * 3600.0 / wall, 1) if wall > 0 else None,
        "stages_s": {k: round(v, 2) for k, v in stages.items()},
        "gpu_busy_fraction": None if busy is None else round(busy, 3),
        "right": len(entries) - len(wrong),
        "verdicts": {
            e.name: {"expected": e.expect, "got": v.text(), "speedup": v.speedup}
            for e in entries
            if (v := verdicts.get(e.name)) is not None
        },
        "wrong": wrong,
        "speedup_not_below_1": not_slower,
    }


def print_report(rep: dict) -> None:
    langs = ", ".join(f"{n} {k}" for k, n in sorted(rep["languages"].items()))
    print(
        f"{rep['mode']} on {rep['device']}{rep['where']}: {rep['solutions']} solutions ({langs}) of {rep['corpus']}"
    )
    rate = rep["solutions_per_hour"]
    print(
        f"wall {rep['wall_s']:.1f} s: "
        + ("no solution finished" if rate is None else f"{rate:.0f} solutions per hour")
    )
    if rep.get("unfinished"):
        print(f"stopped at the time limit: {len(rep['unfinished'])} not run ({', '.join(rep['unfinished'])})")
    for stage, secs in rep["stages_s"].items():
        print(f"  {stage:<28} {secs:9.1f} s")
    busy = rep["gpu_busy_fraction"]
    src = rep["gpu_busy_source"]
    print(
        "GPU busy: "
        + (f"n/a ({src})" if busy is None else f"{100 * busy:.0f}% (utilization, sampled by {src})")
    )
    print(f"verdicts: {rep['right']} right, {len(rep['wrong'])} wrong")
    for w in rep["wrong"]:
        print(f"  WRONG {w['solution']}: expected {w['expected']}, got {w['got']} {w['note']}".rstrip())
    for s in rep["speedup_not_below_1"]:
        print(f"  timing: {s['solution']} is labelled slower than the reference, speedup {s['speedup']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="a corpus directory of benchmarks/make_corpus.py")
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: the corpus's)")
    ap.add_argument("--gpus", help="'all' or '0,1': an embedded Dask cluster, one worker per GPU")
    ap.add_argument("--limit", type=int, help="a stratified slice of N solutions (by label and language)")
    ap.add_argument("--sequential", action="store_true", help="one `mini_kv bench` call per solution")
    ap.add_argument(
        "--no-ahead",
        action="store_true",
        help="the batch without starting the next solution's worker ahead (for an A/B)",
    )
    ap.add_argument(
        "--part",
        metavar="K/N",
        help="only the K-th of N interleaved parts of the slice (to split a long run)",
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        metavar="S",
        help="with --sequential: stop after S seconds and report the solutions that finished (a run cut "
        "by a machine's call limit keeps its figures)",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("--artifacts", help="the attempt store (default: a temporary one, removed at the end)")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit {args.limit}: expected a positive number of solutions")
    if args.part is not None and not (
        re.fullmatch(r"[1-9][0-9]*/[1-9][0-9]*", args.part)
        and int(args.part.split("/")[0]) <= int(args.part.split("/")[1])
    ):
        ap.error(f"--part {args.part}: expected K/N with 1 <= K <= N")
    if args.time_limit is not None and not (args.sequential and args.time_limit > 0):
        ap.error(f"--time-limit {args.time_limit}: expected a positive number of seconds, with --sequential")
    try:
        data, entries = load_corpus(Path(args.corpus))
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    entries = part_of(stratified(entries, args.limit), args.part)
    device = args.device or data.get("device") or "cpu"
    store = Path(args.artifacts) if args.artifacts else Path(tempfile.mkdtemp(prefix="mini-kv-throughput-"))
    meta = {
        "corpus": str(args.corpus),
        "mode": "sequential CLI calls"
        if args.sequential
        else "batch evaluator" + (" without look-ahead" if args.no_ahead else ""),
        "slice": {"limit": args.limit, "part": args.part},
        "device": device,
        "where": f", GPUs {args.gpus}" if args.gpus and not args.sequential else "",
        "options": data.get("options") or {},
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],  # 1, 5 and 15 minutes, at the start
    }
    try:
        timeline: list = []  # the batch's solutions as they ran here: [name, start s, end s]
        by_solution: dict = {}  # each solution's own seconds per stage (where a solution's time went)
        with BusySampler(gpu_indices(device, args.gpus)) as busy:
            t0 = time.perf_counter()
            if args.sequential:
                deadline = None if args.time_limit is None else t0 + args.time_limit
                verdicts, stages = run_sequential(entries, device, meta["options"], store, deadline)
                # cut by --time-limit: the figures are of the solutions that finished, over their calls
                meta["unfinished"] = [e.name for e in entries if e.name not in verdicts]
                entries = [e for e in entries if e.name in verdicts]
            else:
                if args.no_ahead:  # every solution's worker started in its own turn
                    from mini_kv.cluster import batch

                    batch.started_ahead = lambda item, ahead=True: None
                verdicts, stages = run_batch(
                    entries, device, meta["options"], store, args.gpus, timeline, by_solution
                )
            wall = stages.get("cli call", 0.0) if args.sequential else time.perf_counter() - t0
            if timeline:
                # one solution at a time here: the wall time no solution's run holds is the evaluator
                # waiting between them, for a build not yet done (cluster.batch.next_turn), mostly
                ran = sum(end - start for _, start, end in timeline)
                stages["between solutions"] = max(0.0, wall - ran)
    except KeyboardInterrupt:
        return 130
    finally:
        if not args.artifacts:
            shutil.rmtree(store, ignore_errors=True)
    meta["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["gpu_busy_source"] = busy.source
    meta["timeline"] = timeline
    meta["stages_by_solution"] = by_solution
    rep = report(entries, verdicts, stages, wall, busy.fraction, meta)
    if args.json:
        print(json.dumps(rep))
    else:
        print_report(rep)
    return 1 if rep["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
