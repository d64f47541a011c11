#!/usr/bin/env bash
# A new user's first hour, replayed from the README on a fresh clone of this checkout: set-up, `doctor`,
# the main job, a task card with a bad expression, an operator of one's own, `bench`, `new sol`, `batch` (and its
# Ctrl-C), `report`, `leaderboard`, `attempts`. Each step checks what a user would otherwise stop
# trusting the tool over (silent compiles, tracebacks on Ctrl-C or for a candidate's failure, the same
# traceback three times, cut tables, dead links, stray files) and the run fails on the first one seen.
#
#   scripts/first_hour.sh            # set-up: this Python's packages, the clone's src/ on PYTHONPATH
#   FIRST_HOUR_SETUP=readme scripts/first_hour.sh   # set-up: the README's pip command, as written
#   FIRST_HOUR_KEEP=1 ...            # keep the clone and its logs (the path is printed)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mini-kv-first-hour.XXXXXX")
[ -n "${FIRST_HOUR_KEEP:-}" ] && echo "first hour in $WORK" || trap 'rm -rf "$WORK"' EXIT
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/tmp"
export TMPDIR=$WORK/tmp  # the commands' scratch dirs, checked at the end: none may be left
fail() { echo "FIRST HOUR FAILED at '$STEP': $*" >&2; exit 1; }
step() { STEP=$1; echo "== $STEP"; }
# run NAME CMD...: the command's stdout+stderr in $LOGS/NAME.log, its exit status in $RC
run() {
    local name=$1 t0=$SECONDS
    shift
    set +e
    "$@" >"$LOGS/$name.log" 2>&1
    RC=$?
    set -e
    echo "   $name: exit $RC, $((SECONDS - t0)) s"
}
expect_rc() { [ "$RC" -eq "$1" ] || { tail -30 "$LOGS/$2.log"; fail "exit $RC, expected $1 ($2)"; }; }
no_traceback_of_ours() {  # a candidate's failure or a Ctrl-C is a result, never a traceback of mini_kv's
    if grep -q 'File ".*mini_kv/' "$LOGS/$1.log"; then
        grep -n -B2 -A2 'File ".*mini_kv/' "$LOGS/$1.log" | head -20
        fail "a traceback through mini_kv's own frames in $1"
    fi
}

step "fresh clone"
git clone -q "$SRC" "$WORK/repo"
cd "$WORK/repo"

step "set-up (README, Quick start)"
if [ "${FIRST_HOUR_SETUP:-venv}" = readme ]; then
    python -m pip install torch==2.13.0 -e '.[dev]'
    MK=(python -m mini_kv)
else  # this machine's packages, the clone's mini_kv in front of the installed one (nothing is installed)
    export PYTHONPATH=$WORK/repo/src
    MK=(python -m mini_kv)
fi
"${MK[@]}" --help >/dev/null

step "doctor, in 80 columns"
run doctor env COLUMNS=80 "${MK[@]}" doctor
expect_rc 0 doctor
if grep -q '…' "$LOGS/doctor.log"; then fail "doctor's table cut at 80 columns"; fi

step "the main job"
run verify "${MK[@]}" verify --task tasks/vector_add.yaml
expect_rc 0 verify
grep -q "compile v0_naive" "$LOGS/verify.log" || fail "the compile step said nothing while it ran"
grep -q "^PASSED v0_naive" "$LOGS/verify.log" || fail "no PASSED summary for v0_naive"

step "-v means one thing"
v_text() { "${MK[@]}" "$1" --help | tr -s ' \n' ' ' | grep -o -- '-v, --verbose [^-]*went'; }
[ "$(v_text verify)" = "$(v_text bench)" ] || fail "verify -v and bench -v are documented differently"

step "a card with an unknown name in an expression"
sed 's/flops: numel/flops: 2*rowz*cols/' tasks/vector_add.yaml >tasks/bad_card.yaml
run bad_card "${MK[@]}" validate-task tasks/bad_card.yaml
rm tasks/bad_card.yaml
expect_rc 2 bad_card
grep -q "rowz" "$LOGS/bad_card.log" || { cat "$LOGS/bad_card.log"; fail "validate-task did not name the unknown name"; }

step "an operator of one's own"
mkdir -p candidates/my_add
cp -r candidates/vector_add/v0_naive candidates/my_add/v0
sed -i 's/mini_kv_vector_add_v0_naive/mini_kv_my_add_v0/g' candidates/my_add/v0/*
python - <<'EOF'
import yaml
card = yaml.safe_load(open("tasks/vector_add.yaml"))
card["id"] = "my_add"
card["candidates"] = [{"id": "v0", "path": "candidates/my_add/v0", "op": "mini_kv_my_add_v0::vector_add",
                       "sources": {"cpu": ["op.cpp"]}, "backward": True}]
card["default_candidate"] = "v0"
yaml.safe_dump(card, open("tasks/my_add.yaml", "w"), sort_keys=False)
EOF
run my_add "${MK[@]}" verify --task tasks/my_add.yaml --device cpu
expect_rc 0 my_add

step "bench a SOL-ExecBench solution"
PROBLEM=problems/sol-execbench/custom_inputs_matmul
run bench "${MK[@]}" bench "$PROBLEM" --solution solutions/custom_inputs_matmul/pytorch/solution.json --device cpu
expect_rc 0 bench
no_traceback_of_ours bench

step "a SOL-ExecBench problem from a task card, and a solution of one's own"
run new_sol "${MK[@]}" new sol tasks/vector_add.yaml --dtype float32 --out "$WORK/vector_add_sol"
expect_rc 0 new_sol
mkdir -p "$WORK/my_sol"
printf 'def run(a, b):\n    return a + b\n' >"$WORK/my_sol/kernel.py"
cat >"$WORK/my_sol/solution.json" <<EOF
{"name": "my_add", "definition": "vector_add", "author": "me",
 "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "kernel.py::run",
          "destination_passing_style": false},
 "sources": [{"path": "kernel.py"}]}
EOF
run bench_new "${MK[@]}" bench "$WORK/vector_add_sol" --solution "$WORK/my_sol/solution.json" --device cpu
expect_rc 0 bench_new
no_traceback_of_ours bench_new

step "a reference that cannot run here: its log once"
run triton "${MK[@]}" bench problems/sol-execbench/triton_ref_vecadd \
    --solution solutions/triton_ref_vecadd/pytorch/solution.json --device cpu
if [ "$(grep -c '^Traceback' "$LOGS/triton.log")" -gt 1 ]; then fail "the same traceback printed more than once"; fi

step "report and leaderboard take what bench took: the problem directory"
run leaderboard env COLUMNS=80 "${MK[@]}" leaderboard "$PROBLEM"
expect_rc 0 leaderboard
if grep -q '…' "$LOGS/leaderboard.log"; then fail "the leaderboard cut a column at 80 columns"; fi
run report "${MK[@]}" report "$PROBLEM" -o "$WORK/report.html"
expect_rc 0 report
[ -s "$WORK/report.html" ] || fail "no report written"
run attempts "${MK[@]}" attempts list tasks/vector_add.yaml
expect_rc 0 attempts

step "batch with the command line's option names"
cat >"$WORK/batch.yaml" <<EOF
schema_version: 1
verify:
  - task: $PWD/tasks/vector_add.yaml
    candidates: ["*"]
    options: {device: cpu, skip_benchmark: true, case: [n31, n33], memory_limit: 4}
bench:
  - problem: $PWD/$PROBLEM
    solutions: [$PWD/solutions/custom_inputs_matmul/pytorch/solution.json]
    options: {device: cpu, rounds: 2}
EOF
run batch "${MK[@]}" batch "$WORK/batch.yaml"
expect_rc 0 batch
no_traceback_of_ours batch
if ! python -c "import bokeh" 2>/dev/null && grep -q "dashboard" "$LOGS/batch.log"; then
    fail "a dashboard address without bokeh (a dead link)"
fi

step "Ctrl-C in a batch"
cat >"$WORK/long_batch.yaml" <<EOF
schema_version: 1
verify:
  - task: $PWD/tasks/vector_add.yaml
    candidates: ["*"]
    options: {device: cpu, bench_all: true}
EOF
set +e
set -m  # a job of its own, as in a terminal: a background job of a script would ignore SIGINT
# ... and SIGINT at its default, as a terminal's job has it: where this script itself was started in
# the background (`script &`, nohup, CI), SIGINT came ignored and bash cannot restore it, so the
# batch would inherit the ignore and run to its end whatever it is sent
python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
    "${MK[@]}" batch "$WORK/long_batch.yaml" >"$LOGS/batch_int.log" 2>&1 &
pid=$!
set +m
for _ in $(seq 600); do  # Ctrl-C once it is timing its first candidate
    grep -q "benchmark 1/" "$LOGS/batch_int.log" && break
    sleep 0.5
done
kill -INT "$pid"
wait "$pid"
RC=$?
set -e
no_traceback_of_ours batch_int
grep -q "^interrupted: " "$LOGS/batch_int.log" ||
    { tail -20 "$LOGS/batch_int.log"; fail "Ctrl-C did not say what was stored and what was not run"; }
[ "$RC" -eq 130 ] || fail "Ctrl-C exited $RC, not 130"

step "no files left behind"
stray=$(find .build -maxdepth 1 -name 'tmp-*' 2>/dev/null | head -5)
[ -z "$stray" ] || fail "temporary build directories left in .build: $stray"
left=$(find "$TMPDIR" -maxdepth 1 -name 'mini-kv-*' | head -5)
[ -z "$left" ] || fail "scratch directories left in the temp dir: $left"
[ -z "$(git status --porcelain --ignored=no -- src tests)" ] || fail "the commands changed the checkout's sources"

echo "first hour: every step as the README says, none of the known symptoms"
