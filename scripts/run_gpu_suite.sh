#!/usr/bin/env bash
# The local GPU gate: doctor, every build the gate needs (in parallel, into the project's build cache),
# the GPU tests, then `verify` of every candidate of every task card. Each step prints its time.
# Exits non-zero if any step fails. Logs go to $MINI_KV_GATE_LOGS (default: artifacts/gate-logs).
#
#   bash scripts/run_gpu_suite.sh            # on a GPU machine
#   MINI_KV_GATE_DRY=1 bash scripts/run_gpu_suite.sh   # without a GPU: the same steps, the GPU tests skip
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${MINI_KV_GATE_LOGS:-artifacts/gate-logs}"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
failed=()
gate_start=$SECONDS

step() {  # step NAME CMD...
  local name="$1" t0=$SECONDS; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc, $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name($rc)")
}

declare -A bg_pid bg_t0
beside() {  # beside NAME CMD...: start a step in the background; `joined NAME` waits and reports it
  local name="$1"; shift
  echo "=== $name: $* (in the background)"
  "$@" > "$logs/$name.log" 2>&1 &
  bg_pid[$name]=$!; bg_t0[$name]=$SECONDS
}
joined() {  # joined NAME: wait for a background step, print its output, exit code and time
  local name="$1" rc
  wait "${bg_pid[$name]}"; rc=$?
  cat "$logs/$name.log"
  echo "=== $name: exit $rc, $((SECONDS - bg_t0[$name])) s (started in the background)"
  [ "$rc" -eq 0 ] || failed+=("$name($rc)")
}

if [ -z "${MINI_KV_GATE_DRY:-}" ]; then
  python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "no CUDA device visible to torch: this gate needs a GPU (MINI_KV_GATE_DRY=1 runs it without)"; exit 1; }
fi

cards=(tasks/*.yaml)
# doctor reads the machine while the builds below take its cores
beside doctor python -m mini_kv doctor
# Every C++ build the steps below need, all at once: the task cards' candidates (verify and the GPU
# exploit and isolation tests) and the SOL C++ solutions the GPU tests bench. Same compiler, flags and
# cache keys as verify and bench, so they all hit the cache. Planted broken sources fail here by
# design (--keep-going): their tests judge them.
sol_pairs=()
for s in solutions/*/*/solution.json; do
  sol_pairs+=("problems/sol-execbench/$(basename "$(dirname "$(dirname "$s")")")" "$s")
done
for s in tests/sol_solutions/*/solution.json tests/exploits/sol_cuda/*/solution.json; do
  sol_pairs+=(tests/sol_solutions/problem "$s")
done
card_args=()
for c in "${cards[@]}" tests/exploits/task_card_cuda/exploits.yaml tests/planted/planted_cuda.yaml; do
  card_args+=(--card "$c")
done
if [ -n "${MINI_KV_GATE_DRY:-}" ]; then  # no GPU: CPU builds of the cards' candidates only (what verify
  card_args=(); for c in "${cards[@]}"; do card_args+=(--card "$c"); done; sol_pairs=()  # runs below)
fi
beside prebuild python scripts/prebuild_solutions.py --keep-going "${sol_pairs[@]}" "${card_args[@]}"
# The GPU tests, less the one that is the verify steps below (every candidate of every card on the
# GPU, integrity and status): the gate runs that once, as verify. Those that judge only verdicts run
# side by side (pytest-xdist, one per two cores, at most 8) while prebuild runs: a build they need
# that prebuild has under way is waited for (the cache's per-build file lock), then a cache hit.
# Those that judge timings or take the GPU's counters (marker `timing`) run afterwards, alone, as
# do the verify steps, which time.
pytest_gpu=(python -m pytest -q -p no:cacheprovider --durations=10
  --deselect tests/exploits/test_exploits.py::test_shipped_candidates_are_not_flagged_on_gpu)
jobs=$(( $(nproc) / 2 )); jobs=$(( jobs < 1 ? 1 : (jobs > 8 ? 8 : jobs) ))
step gpu-tests "${pytest_gpu[@]}" -m "gpu and not timing" -n "$jobs" --dist load
joined prebuild
joined doctor
step gpu-timing-tests "${pytest_gpu[@]}" -m "gpu and timing"
device_args=()
[ -n "${MINI_KV_GATE_DRY:-}" ] && device_args=(--device cpu --skip-benchmark)
task_args=(); for c in "${cards[@]}"; do task_args+=(--task "$c"); done
# every card in one verify: one start-up, and the next candidate's checks beside this one's
step verify python -m mini_kv verify "${task_args[@]}" --candidate '*' "${device_args[@]}" ${MINI_KV_VERIFY_ARGS:-}

echo "GPU gate: $((SECONDS - gate_start)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "GPU gate FAILED: ${failed[*]}"
  exit 1
fi
echo "GPU gate passed"
