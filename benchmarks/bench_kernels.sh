#!/usr/bin/env bash
# GPU run of the roofline candidates (docs/measurements/kernels-cold-l2-h200.md): every candidate of the vector_add,
# fused_bias_relu and rmsnorm cards verified and timed with a cold L2, then layout checks of the
# vectorised candidates' CUDA kernels on shapes and pointer offsets the cards do not reach, then the
# leaderboard. Run on a GPU machine from anywhere:
#
#   benchmarks/bench_kernels.sh OUT_DIR [TASK...]
#
# TASK: vector_add, fused_bias_relu, rmsnorm (default: all three). To stay under a per-command time
# limit, run one task per call with the same OUT_DIR (builds are cached in .build/ between calls).
# MINI_KV_BENCH_CANDIDATES: candidate glob (default '*': every candidate, so the baselines v0/v1 are
# timed too; '*vectorized' times only the three vectorised candidates).
# OUT_DIR receives, per task: <task>.jsonl (verify --json, one summary line per candidate),
# <task>.stderr, <task>.table.md (per bench case: P50/P95, reference P50, speedup, GB/s, share of
# the measured copy bandwidth, stability), attempts/<task>/<candidate>/*.json (the attempt's
# benchmark, correctness, compile and environment records); then layout_checks.txt,
# leaderboard.{txt,json,csv}, exit_codes.txt, doctor.txt, nvidia-smi.txt.
# Extra verify arguments can be passed in $MINI_KV_VERIFY_ARGS. Exit status: the worst of the steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: benchmarks/bench_kernels.sh OUT_DIR [TASK...]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
TASKS=("$@")
[ ${#TASKS[@]} -gt 0 ] || TASKS=(vector_add fused_bias_relu rmsnorm)
CANDS="${MINI_KV_BENCH_CANDIDATES:-*}"

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "no CUDA device visible to torch: this run needs a GPU" >&2; exit 1; }
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
"$PYTHON" -m mini_kv doctor > "$out/doctor.txt" 2>&1 || true
echo "# $(date -u +%FT%TZ) tasks: ${TASKS[*]} candidates: $CANDS" >> "$out/exit_codes.txt"
worst=0
note_rc() {  # note_rc STEP RC
  echo "$1: exit $2" | tee -a "$out/exit_codes.txt"
  if [ "$2" -ne 0 ] && { [ "$worst" -eq 0 ] || [ "$2" -gt "$worst" ]; }; then worst=$2; fi
}

for t in "${TASKS[@]}"; do
  [ -f "tasks/$t.yaml" ] || { echo "no task card tasks/$t.yaml" >&2; note_rc "verify-$t" 2; continue; }
  echo "=== verify $t (candidates '$CANDS', --l2 cold)"
  # shellcheck disable=SC2086
  "$PYTHON" -m mini_kv verify --task "tasks/$t.yaml" --candidate "$CANDS" --l2 cold --json ${MINI_KV_VERIFY_ARGS:-} \
    > "$out/$t.jsonl" 2> "$out/$t.stderr"
  note_rc "verify-$t" $?
  cat "$out/$t.jsonl"
  # per-case table from the attempts, and a copy of their JSON records
  "$PYTHON" - "$out" "$t" <<'EOF' | tee "$out/$t.table.md"
import json, pathlib, shutil, sys

out, task = pathlib.Path(sys.argv[1]), sys.argv[2]
print(f"## {task}\n")
print("| candidate | status | case | method | L2 | P50 µs | P95 µs | ref P50 µs | speedup | GB/s | % copy BW | stable | post-check |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)
for line in (out / f"{task}.jsonl").read_text().splitlines():
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    cand, attempt = rec.get("candidate"), rec.get("attempt")
    status = rec.get("status", "?")
    if not attempt or not pathlib.Path(attempt).is_dir():
        print(f"| {cand} | {status} | (no attempt) | | | | | | | | | | |")
        continue
    attempt = pathlib.Path(attempt)
    dest = out / "attempts" / task / cand
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("benchmark.json", "correctness.json", "compile.json", "environment.json", "attempt.json"):
        if (attempt / name).is_file():
            shutil.copy(attempt / name, dest / name)
    bench = attempt / "benchmark.json"
    cases = json.loads(bench.read_text()).get("cases", []) if bench.is_file() else []
    if not cases:
        print(f"| {cand} | {status} | (no bench case ran) | | | | | | | | | | |")
    for c in cases:
        if "candidate" not in c:
            print(f"| {cand} | {status} | {c.get('id')} | error: {c.get('error') or c.get('reason')} | | | | | | | | | |")
            continue
        cs, rs = c["candidate"]["summary"]["overall"], c["reference"]["summary"]["overall"]
        roof = c.get("roofline") or {}
        share = roof.get("peak_share")
        print(f"| {cand} | {status} | {c['id']} | {c.get('method')} | {c.get('l2')} | {fmt(cs['p50'])} | {fmt(cs['p95'])} "
              f"| {fmt(rs['p50'])} | {fmt(c.get('speedup'), '{:.3f}')} | {fmt(roof.get('gbps'), '{:.0f}')} "
              f"| {fmt(None if share is None else 100 * share, '{:.1f}')} | {(c.get('stability') or {}).get('stable')} "
              f"| {(c.get('post_check') or {}).get('ok')} |")
print()
EOF
done

echo "=== layout checks of the vectorised CUDA kernels"
"$PYTHON" - "$out" "${TASKS[@]}" <<'EOF' 2>&1 | tee -a "$out/layout_checks.txt"
# Shapes and pointer offsets the cards do not reach: contiguous views that start 1 element into a
# buffer (not 16-byte aligned), odd sizes (scalar tails), and rmsnorm rows on every kernel path.
import json, os, pathlib, sys

import torch

from mini_kv.references import fused_bias_relu as fbr, rmsnorm as rn, vector_add as va

out = pathlib.Path(sys.argv[1])
DEV = os.environ.get("MINI_KV_LAYOUT_DEVICE", "cuda")  # "cpu" only to dry-run this script
WANT = {"vector_add": "v1_vectorized", "fused_bias_relu": "v1_vectorized", "rmsnorm": "v2_vectorized"}
WANT = {t: c for t, c in WANT.items() if t in sys.argv[2:]}
TOL = {"vector_add": {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12},
       "fused_bias_relu": {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12},
       "rmsnorm": {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}}
ops, failures, checks = {}, 0, 0
for task, cand in WANT.items():
    path = out / "attempts" / task / cand / "compile.json"
    if not path.is_file():
        print(f"SKIP {task}/{cand}: no compile record (did verify build it?)")
        failures += 1
        continue
    build_dir = pathlib.Path(json.loads(path.read_text())["build_dir"])
    libs = sorted(build_dir.glob("*.so"))
    if not libs:
        print(f"SKIP {task}/{cand}: no library in {build_dir}")
        failures += 1
        continue
    torch.ops.load_library(str(libs[0]))
    ops[task] = getattr(getattr(torch.ops, f"mini_kv_{task}_{cand}"), task)

gen = torch.Generator(device=DEV).manual_seed(0)


def view(shape, dtype, off):
    """A contiguous tensor of `shape` starting `off` elements into a fresh buffer."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.randn(n + off, generator=gen, device=DEV, dtype=torch.float32).to(dtype)
    return buf[off:].view(shape)


def check(task, label, got, want, dtype):
    global failures, checks
    checks += 1
    tol = TOL[task][dtype]
    try:
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    except AssertionError as exc:
        failures += 1
        print(f"FAIL {task} {label}: {str(exc).splitlines()[0:3]}")


DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
OFFS = ((0, 0), (1, 0), (0, 1), (1, 1))
if "vector_add" in ops:
    for dtype in DTYPES:
        for n in (1, 3, 7, 8, 9, 31, 1023, 1025, 8193, 65537, (1 << 20) + 3):
            for oa, ob in OFFS:
                a, b = view((n,), dtype, oa), view((n,), dtype, ob)
                check("vector_add", f"{dtype} n={n} offsets={oa},{ob}", ops["vector_add"](a, b), va.reference(a, b), dtype)
if "fused_bias_relu" in ops:
    for dtype in DTYPES:
        for rows, cols in ((1, 31), (7, 129), (5, 8), (3, 16), (40, 8), (64, 8192), (1000, 4097), (3, 24600)):
            for ox, ob in OFFS:
                x, b = view((rows, cols), dtype, ox), view((cols,), dtype, ob)
                check("fused_bias_relu", f"{dtype} {rows}x{cols} offsets={ox},{ob}", ops["fused_bias_relu"](x, b),
                      fbr.reference(x, b), dtype)
if "rmsnorm" in ops:
    for dtype in DTYPES:
        for rows, hidden in ((5, 8), (3, 64), (3, 136), (4, 1000), (4, 1032), (3, 2048), (3, 4096), (5, 8192),
                             (3, 16384), (3, 16392), (2, 32768), (2, 32776), (2, 65536), (700, 8192)):
            for ox, ow in OFFS:
                x, w = view((rows, hidden), dtype, ox), view((hidden,), dtype, ow)
                check("rmsnorm", f"{dtype} {rows}x{hidden} offsets={ox},{ow}", ops["rmsnorm"](x, w, 1e-6),
                      rn.reference(x, w, 1e-6), dtype)
if DEV != "cpu":
    torch.cuda.synchronize()
print(f"layout checks: {checks} run, {failures} failed")
sys.exit(1 if failures else 0)
EOF
note_rc layout-checks "${PIPESTATUS[0]}"

echo "=== leaderboard"
"$PYTHON" -m mini_kv leaderboard --json "$out/leaderboard.json" --csv "$out/leaderboard.csv" 2>&1 | tee "$out/leaderboard.txt"
note_rc leaderboard "${PIPESTATUS[0]}"

echo "results in $out; exit codes:"
cat "$out/exit_codes.txt"
exit "$worst"
