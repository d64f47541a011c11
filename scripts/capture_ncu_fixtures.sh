#!/usr/bin/env bash
# Capture the Nsight Compute test fixtures on a GPU machine with ncu:
#   doctor -> profile rmsnorm v0_naive and v1_block_reduce on the bench case -> compare-profiles.
# OUTDIR receives (at most 8 files, the names tests/fixtures/ncu/ expects):
#   doctor.txt, rmsnorm-<cand>.raw.csv, rmsnorm-<cand>.profile.json (both candidates), compare.txt,
#   compare.json, profiles.tgz (both profile directories whole, with .ncu-rep reports and logs, and
#   every command's output).
# Exits non-zero if a step fails; whatever was captured is still copied.
#
# usage: bash scripts/capture_ncu_fixtures.sh OUTDIR
set -uo pipefail
out="${1:?usage: scripts/capture_ncu_fixtures.sh OUTDIR}"
cd "$(dirname "$0")/.."
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
art="$work/artifacts"
logs="$work/logs"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # works without `pip install -e .` too
failed=()

step() {  # step NAME CMD... : stdout+stderr to the console and $logs/NAME.log
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || failed+=("$name($rc)")
  return "$rc"
}

{ command -v ncu && ncu --version; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; } \
  > "$logs/machine.txt" 2>&1
cat "$logs/machine.txt"

step doctor python -m mini_kv doctor
cp "$logs/doctor.log" "$out/doctor.txt"

declare -A path
for cand in v0_naive v1_block_reduce; do
  step "profile-$cand" python -m mini_kv profile --task tasks/rmsnorm.yaml --candidate "$cand" \
    --artifacts "$art" --json
  # a --json run prints its result as one JSON line; its "path" is the profile directory
  path[$cand]="$(python - "$logs/profile-$cand.log" <<'PY'
import json, sys
for line in reversed(open(sys.argv[1]).read().splitlines()):
    try:
        print(json.loads(line)["path"])
        break
    except (ValueError, KeyError, TypeError):
        continue
PY
)"
  if [ -n "${path[$cand]}" ] && [ -d "${path[$cand]}" ]; then
    cp "${path[$cand]}/profile.json" "$out/rmsnorm-$cand.profile.json"
    [ -f "${path[$cand]}/raw.csv" ] && cp "${path[$cand]}/raw.csv" "$out/rmsnorm-$cand.raw.csv"
  fi
done

if [ -n "${path[v0_naive]}" ] && [ -n "${path[v1_block_reduce]}" ]; then
  step compare python -m mini_kv compare-profiles "${path[v0_naive]}" "${path[v1_block_reduce]}" \
    --json "$work/compare.json"
  cp "$logs/compare.log" "$out/compare.txt"
  [ -f "$work/compare.json" ] && cp "$work/compare.json" "$out/compare.json"
fi

tar -czf "$out/profiles.tgz" -C "$work" artifacts logs $( [ -f "$work/compare.json" ] && echo compare.json )
ls -l "$out"
if [ ${#failed[@]} -gt 0 ]; then
  echo "capture FAILED: ${failed[*]}"
  exit 1
fi
echo "capture done: copy $out/* to tests/fixtures/ncu/"
