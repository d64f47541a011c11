#!/usr/bin/env bash
# `bench` on a GPU machine: the GPU tests of the SOL-ExecBench path, then every solution found for
# every problem under problems/sol-execbench (solutions/<problem>/<language>/solution.json, and the
# examples/rmsnorm/<language>/ solutions), each printing its table and writing its traces into OUT_DIR;
# then benchmarks/sol_build_timing.py: the cuda_cpp rmsnorm solution once with a build, twice from the cache.
#
#   bash benchmarks/run_sol_gpu.sh OUT_DIR
#
# OUT_DIR gets: prebuild.log, pytest.log, <problem>__<language>.{log,jsonl,rc}, build-timing.json, summary.txt.
# Exits non-zero if the tests fail, if a run that should pass does not, or if a build-timing run fails. A language that cannot run here ("unavailable here", exit 2) is listed, not failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: run_sol_gpu.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1
artifacts="$out/artifacts"
failed=()
summary="$out/summary.txt"
: > "$summary"

python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "no CUDA device visible to torch: this script needs a GPU"; exit 1; }

# Every run: solutions/<problem>/<language>/ against its problem, examples/rmsnorm/<language>/
# against rmsnorm; tags name their output files.
problems=() solutions=() tags=()
for problem in problems/sol-execbench/*/; do
  name="$(basename "$problem")"
  for solution in solutions/"$name"/*/solution.json; do
    [ -f "$solution" ] || continue
    problems+=("$problem") solutions+=("$solution") tags+=("${name}__$(basename "$(dirname "$solution")")")
  done
done
for solution in examples/rmsnorm/*/solution.json; do
  [ -f "$solution" ] || continue
  problems+=(problems/sol-execbench/rmsnorm) solutions+=("$solution")
  tags+=("rmsnorm__example_$(basename "$(dirname "$solution")")")
done

# Build every C++ solution in the background, in parallel, while the tests run: the bench runs
# below then hit the build cache instead of building one after the other.
pairs=()
for i in "${!solutions[@]}"; do pairs+=("${problems[$i]}" "${solutions[$i]}"); done
python scripts/prebuild_solutions.py "${pairs[@]}" > "$out/prebuild.log" 2>&1 &
prebuild=$!

echo "=== pytest -m gpu tests/test_sol_*.py"
python -m pytest -m gpu -q -p no:cacheprovider tests/test_sol_*.py 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
echo "pytest (gpu): exit $rc" | tee -a "$summary"
[ "$rc" -eq 0 ] || failed+=("pytest($rc)")

wait "$prebuild"
echo "prebuild (exit $?): $(tail -1 "$out/prebuild.log")" | tee -a "$summary"

bench() {  # bench PROBLEM_DIR SOLUTION_JSON TAG
  local problem="$1" solution="$2" tag="$3"
  echo "=== bench $problem --solution $solution"
  python -m mini_kv bench "$problem" --solution "$solution" --artifacts "$artifacts" \
    -o "$out/$tag.jsonl" -v 2>&1 | tee "$out/$tag.log"
  local rc=${PIPESTATUS[0]}
  echo "$rc" > "$out/$tag.rc"
  echo "$tag: exit $rc" | tee -a "$summary"
  case "$rc" in
    0) ;;
    2) grep -q "unavailable here" "$out/$tag.log" || failed+=("$tag($rc)") ;;
    *) failed+=("$tag($rc)") ;;
  esac
}

for i in "${!solutions[@]}"; do
  bench "${problems[$i]}" "${solutions[$i]}" "${tags[$i]}"
done

# Build cache: the first run in a fresh project root builds, the next ones must hit the cache.
if [ -f solutions/rmsnorm/cuda_cpp/solution.json ]; then
  python benchmarks/sol_build_timing.py "$out/build-timing.json" --problem problems/sol-execbench/rmsnorm \
    --solution solutions/rmsnorm/cuda_cpp/solution.json --cached-runs 2 2>&1 | tee -a "$summary"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed+=("build-timing($rc)")
else
  echo "no cuda_cpp rmsnorm solution found: cache timing skipped" | tee -a "$summary"
fi

python -m mini_kv leaderboard --artifacts "$artifacts" 2>&1 | tee "$out/leaderboard.txt"

if [ ${#failed[@]} -gt 0 ]; then
  echo "run_sol_gpu FAILED: ${failed[*]}" | tee -a "$summary"
  exit 1
fi
echo "run_sol_gpu passed" | tee -a "$summary"
