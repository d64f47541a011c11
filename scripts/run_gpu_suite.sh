#!/usr/bin/env bash
# The local GPU gate: doctor, the GPU tests, then `verify` of every candidate of every task card.
# Exits non-zero if any step fails. Logs go to $MINI_KV_GATE_LOGS (default: artifacts/gate-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${MINI_KV_GATE_LOGS:-artifacts/gate-logs}"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
failed=()

step() {  # step NAME CMD...
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || failed+=("$name($rc)")
}

python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "no CUDA device visible to torch: this gate needs a GPU"; exit 1; }

step doctor python -m mini_kv doctor
step gpu-tests python -m pytest -m gpu -q -p no:cacheprovider
for card in tasks/*.yaml; do
  name="verify-$(basename "$card" .yaml)"
  step "$name" python -m mini_kv verify --task "$card" --candidate '*' ${MINI_KV_VERIFY_ARGS:-}
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "GPU gate FAILED: ${failed[*]}"
  exit 1
fi
echo "GPU gate passed"
