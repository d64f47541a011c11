#!/usr/bin/env bash
# Everything the docs report from a GPU, in one go: run on the GPU machine, then check in the numbers.
#   benchmarks/run_gpu_evidence.sh OUTDIR [STEP...]
# Steps (default: all that apply): gate fidelity repeat regression scaling kernels sol profile sweeps
# concurrent reference l2 throughput (throughput: part 1/6 of the 60-solution slice, cold, the batch then
# one CLI call per solution; about 6 minutes on an H100) integrity (integrity needs $MINI_KV_BEFORE_TREE: a copy of the project without the defences, see
# benchmarks/integrity_cost.py).
# OUTDIR can hold many files; copy OUTDIR/evidence.tgz where you need it.
# Each step's output goes to OUTDIR/<step>.log (and its own files under OUTDIR/<step>/); a step that
# fails is reported at the end and does not stop the others. OUTDIR/evidence.tgz holds it all.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: run_gpu_evidence.sh OUTDIR [STEP...]}"; shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gate fidelity repeat regression scaling kernels sol profile sweeps integrity concurrent reference l2 throughput)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=()

run_step() {  # run_step NAME CMD...
  local name="$1"; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  "$@" > >(tee "$out/$name.log") 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name($rc)")
}

throughput_pair() {  # the batch, then one CLI call per solution, on the same cold slice; exit 1 on a wrong verdict
  local corpus rc=0
  corpus=$(mktemp -d) && python benchmarks/make_corpus.py --out "$corpus/c" --device cuda > /dev/null || return 1
  for mode in batch sequential; do
    rm -rf .build ~/.triton/cache
    python benchmarks/throughput.py "$corpus/c" --limit 60 --part 1/6 --json \
      $([ $mode = sequential ] && echo --sequential) > "$1/throughput-$mode.json" || rc=1
  done
  rm -rf "$corpus"
  return $rc
}

for step in "${steps[@]}"; do
  case "$step" in
    gate) MINI_KV_GATE_LOGS="$out/gate" run_step gate bash scripts/run_gpu_suite.sh ;;
    fidelity) run_step fidelity python benchmarks/bench_fidelity.py --out "$out/bench_fidelity.json" ;;
    repeat) run_step repeat python benchmarks/repeatability.py --task tasks/rmsnorm.yaml --out "$out/repeatability.json" ;;
    regression) run_step regression python benchmarks/regression_demo.py --out artifacts/regression-demo
                mkdir -p "$out/regression" && cp artifacts/regression-demo/{demo.log,baseline.json} "$out/regression/" 2>/dev/null ;;
    scaling)
      if [ "$(python -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
        run_step scaling python benchmarks/dist_scaling.py "$out/dist-scaling-gpu.json" --mode gpu --workdir artifacts/dist-scaling
      else echo "=== scaling: skipped, fewer than 2 GPUs"; fi ;;
    kernels) [ -f benchmarks/bench_kernels.sh ] && run_step kernels bash benchmarks/bench_kernels.sh "$out/kernels" ;;
    sol) [ -f benchmarks/run_sol_gpu.sh ] && run_step sol bash benchmarks/run_sol_gpu.sh "$out/sol" ;;
    profile) [ -f scripts/capture_ncu_fixtures.sh ] && run_step profile bash scripts/capture_ncu_fixtures.sh "$out/ncu" ;;
    sweeps)
      run_step sweeps bash -c 'set -e; for s in rmsnorm vector_add; do
          nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/sweep_$s benchmarks/${s}_variants.cu; done
        nvcc -O3 -arch=sm_90 -std=c++17 -DMINI_KV_STREAM_HINTS -o /tmp/sweep_rmsnorm_hinted benchmarks/rmsnorm_variants.cu
        for m in hot cold; do /tmp/sweep_rmsnorm 16384 8192 15 $m; /tmp/sweep_rmsnorm_hinted 16384 8192 15 $m
          /tmp/sweep_vector_add 268435456 15 $m; done' ;;
    integrity)
      if [ -n "${MINI_KV_BEFORE_TREE:-}" ]; then
        run_step integrity python benchmarks/integrity_cost.py --before "$MINI_KV_BEFORE_TREE" --out "$out/integrity_cost.json"
      else echo "=== integrity: skipped, MINI_KV_BEFORE_TREE not set"; fi ;;
    concurrent) run_step concurrent python benchmarks/concurrent_benches.py --count 4 --json "$out/concurrent_benches.json" ;;
    reference) run_step reference python benchmarks/reference_reuse.py --device cuda --json "$out/reference_reuse.json" ;;
    l2) run_step l2 python benchmarks/l2_flush_ncu.py --out "$out/l2_flush_ncu.json" --samples 100 ;;
    throughput) run_step throughput throughput_pair "$out" ;;
    *) echo "unknown step $step"; failed+=("$step(unknown)") ;;
  esac
done

tar -czf /tmp/evidence.tgz -C "$out" . && mv /tmp/evidence.tgz "$out/evidence.tgz"
if [ ${#failed[@]} -gt 0 ]; then echo "GPU evidence: FAILED steps: ${failed[*]}"; exit 1; fi
echo "GPU evidence: all steps passed"
