#!/usr/bin/env bash
# The GPU check: everything attnbench does on a GPU, in one call of the device tool, in at most 6 minutes.
#
#   scripts/gpu_check.sh          on the lent GPU (no network there)
#   scripts/gpu_check.sh --cpu    every step on tiny CPU shapes: the same plumbing, tested here (tests/e2e)
#   scripts/gpu_check.sh --plan   print the steps and their time budgets, and stop
#
# Device run (docs/how-to/gpu.md: the whole call), once `scripts/prepare_gpu_wheels.sh` has filled the git-ignored
# .whl/ here:
#   command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 420
#
# Each step runs under a hard `timeout` that stops it with SIGINT at its budget (then SIGKILL 3 s later): pytest
# answers SIGINT by finishing its session, writing its JUnit file and its -rA summary (SIGTERM killed it with
# neither), and a sweep by closing its folder with its finished rows. SIGINT is un-ignored for the step first, as a
# process started in the background without job control inherits it ignored. The budgets below, graces included,
# add up to at most 360 s, so the whole check ends inside 6 minutes even when every step runs into its budget. The
# compile-heavy GPU tests (inductor, Triton, FlexAttention, fla on a cold cache) have a step of their own after the
# others; cut at its budget with none of its tests failed, it is reported cut, not failed. The article's claim cases, presets
# included, run first. Each run folder is packed into one tarball the moment its sweep ends, and sweeps write
# outside $OUT, so what comes back is at most 8 plain files at $OUT's top level (the device tool returns at most 8
# files of at most 16 MiB, no more than 2 folders deep):
#   gpu-check.log             everything printed, as it happened (it survives the script being killed)
#   summary.md                one screen: each step's verdict and time against its budget, and the key figures
#   claims-run.tgz            the claims run folder (run.json, results.jsonl, telemetry.jsonl, summaries, plots)
#   claims.md                 `attnbench claims` on it
#   flash-run.tgz             the attention-kernel sweep's run folder
#   selfcheck.md              attnbench vs torch.utils.benchmark and triton's do_bench
#   gpu-tests.xml             the GPU tests, one result each, both steps' (JUnit XML; the log has the -rA summaries)
#   telemetry-overhead.md     what the telemetry sampler costs the timed calls
# The exit code is 0 only when every step passed. It never changes clocks, power limits or modes, and never resets
# the GPU. Commit what it brought back under results/ with the GPU in the folder name (results/gpu-check-h200/).
set -uo pipefail

MODE=gpu
case "${1:-}" in
  "") ;;
  --cpu) MODE=cpu ;;
  --plan) MODE=plan ;;
  *) echo "usage: scripts/gpu_check.sh [--cpu | --plan]" >&2; exit 2 ;;
esac

# name:budget_s:cpu_s, in the order they run: each step's hard limit, and what the step took in a `--cpu` run (one
# shared, loaded 2-core machine; budget >= 1.5 x it, tests/e2e/test_gpu_check.py). With the kill grace after each
# (a stopped sweep closes its folder and renders its summaries), they add up to at most TOTAL_LIMIT_S (`--plan`).
# setup installs the carried wheels and imports every package the check needs but torch (a missing one fails there,
# in seconds): the first torch import (CUDA 13 loads GBs of libraries) belongs to env, whose budget absorbs it.
# calibrate runs before the claims sweep, so the sweep's rows are held to this GPU's measured ceilings.
STEPS=(
  setup:15:5
  env:32:21
  calibrate:30:20
  claims-sweep:60:34
  claims-pack:5:1
  claims-report:8:2
  selfcheck:30:19
  flash-sweep:42:28
  flash-pack:5:1
  gpu-tests:40:12
  gpu-compile-tests:32:10
  telemetry-overhead:25:14
)
KILL_GRACE_S=3
TOTAL_LIMIT_S=360

# On --cpu the same steps run on a shared, possibly loaded CPU (CI, a laptop): the budgets, sized for the H200, are
# scaled (GPU_CHECK_BUDGET_SCALE, default 3 there, 1 on the GPU) so load cannot fail the plumbing it checks.
SCALE=${GPU_CHECK_BUDGET_SCALE:-1}
[ "$MODE" = cpu ] && SCALE=${GPU_CHECK_BUDGET_SCALE:-3}
# For the tests (and a rerun of part of the check): GPU_CHECK_STEPS="setup gpu-tests" runs only those steps (the
# others say "not selected", which fails nothing); GPU_CHECK_BUDGETS="gpu-tests:4" replaces a budget, unscaled.
step_field() { local s f; for s in "${STEPS[@]}"; do [ "${s%%:*}" = "$1" ] && { IFS=: read -ra f <<< "$s"; echo "${f[$2]}"; return; }; done; }
# The grace scales too: on a loaded CPU a stopped pytest took more than 3 s to write its summary and JUnit file.
GRACE_S=$((KILL_GRACE_S * SCALE))
budget_of() {
  local o
  for o in ${GPU_CHECK_BUDGETS:-}; do [ "${o%%:*}" = "$1" ] && { echo "${o##*:}"; return; }; done
  echo $(($(step_field "$1" 1) * SCALE))
}
selected() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; }
plan_total() { local s t=0; for s in "${STEPS[@]}"; do t=$((t + $(step_field "${s%%:*}" 1) + KILL_GRACE_S)); done; echo "$t"; }

if [ "$MODE" = plan ]; then
  printf '| step | budget s | took on --cpu, s |\n| --- | --- | --- |\n'
  for s in "${STEPS[@]}"; do printf '| %s | %s | %s |\n' "${s%%:*}" "$(step_field "${s%%:*}" 1)" "$(step_field "${s%%:*}" 2)"; done
  printf '| total, with %s s kill grace per step | %s (limit %s) | |\n' "$KILL_GRACE_S" "$(plan_total)" "$TOTAL_LIMIT_S"
  exit 0
fi

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/gpu-check.log"
: > "$LOG"
# Run folders and the calibration cache live outside $OUT: only the tarballs and reports come back.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export ATTNBENCH_CACHE="$WORK/cache"  # this run's calibration is what this run's sweeps use
export PYTHONUNBUFFERED=1 COLUMNS=160
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ "$MODE" = cpu ]; then DEVICE=cpu; else DEVICE=cuda; fi

RESULTS=()  # "name|verdict|seconds|budget"
FAILED=0
log() { echo "$*" | tee -a "$LOG"; }

# A step's command starts with SIGINT at its default (Python's KeyboardInterrupt): a process started in the
# background without job control inherits SIGINT ignored, which bash cannot undo, and the stop would then be a kill.
UNIGNORE_SIGINT='import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])'

# run_step NAME CMD...: CMD under the step's hard timeout, its output appended to the log as it comes. At the budget
# the step gets SIGINT (pytest then writes its JUnit file and summary; a sweep closes its folder), KILL_GRACE_S later
# SIGKILL.
run_step() {
  local name=$1; shift
  local budget rc start verdict
  budget=$(budget_of "$name")
  if ! selected "$name"; then
    RESULTS+=("$name|not selected|0|$budget")
    return 0
  fi
  log ""
  log "=== $name (budget ${budget} s, $(date -u +%H:%M:%S))"
  start=$SECONDS
  timeout -s INT -k "$GRACE_S" "$budget" "$PY" -c "$UNIGNORE_SIGINT" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) verdict=ok ;;
    124) verdict="TIMEOUT (stopped at ${budget} s)" ;;
    137) verdict="TIMEOUT (killed ${GRACE_S} s after ${budget} s)" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  if [ "$rc" -eq 124 ] && [ "$name" = gpu-compile-tests ] && junit_clean "$WORK/gpu-compile-tests.xml"; then
    # Compile-heavy tests on a cold cache may outlast any budget the check can give them: cut, with every test that
    # ran passed or skipped (the JUnit file lists them), is not a failure of the check.
    verdict="cut at ${budget} s (none failed: $(junit_counts "$WORK/gpu-compile-tests.xml"))"
    rc=0
  fi
  [ "$rc" -eq 0 ] || FAILED=1
  RESULTS+=("$name|$verdict|$((SECONDS - start))|$budget")
  log "--- $name: $verdict in $((SECONDS - start)) s"
  return "$rc"
}

skip_step() {
  selected "$1" || { RESULTS+=("$1|not selected|0|$(budget_of "$1")"); return; }
  RESULTS+=("$1|FAILED (not run: $2)|0|$(budget_of "$1")")
  FAILED=1
  log "--- $1: not run: $2"
}

setup() {
  # On the GPU machine: pydantic and what it needs (and fla, for kernel: fla), from the wheels carried in .whl/
  # (installed offline). Then every package the later steps import, torch aside (its cold import is env's): one
  # missing fails here, in seconds, naming what needs it, rather than a step minutes in.
  if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1 && ! "$PY" -c "import pydantic" 2> /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      .whl/*.whl || return 1
    export PYTHONPATH="$WORK/site:$PYTHONPATH"
  fi
  "$PY" - "$MODE" << 'PYTHON'
import importlib
import importlib.util
import sys

needed = {
    "pydantic": "configs", "yaml": "configs", "typer": "the CLI", "rich": "the CLI", "pandas": "reports",
    "tabulate": "report tables (claims.md)", "numpy": "analysis", "scipy": "analysis (claims, selfcheck)",
    "psutil": "telemetry", "pynvml": "telemetry (nvidia-ml-py)", "matplotlib": "a sweep's plots",
    "pytest": "the GPU tests", "xdist": "the GPU tests (pyproject's addopts pass --dist)",
    "hypothesis": "the GPU tests' modules",
}
if sys.argv[1] == "gpu":
    needed["triton"] = "selfcheck's do_bench, FlexAttention, fla"
missing = []
for name, why in needed.items():
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the answer
        missing.append(f"{name}, for {why}: {type(exc).__name__}: {exc}")
if missing:
    print("error: the GPU check cannot run without:\n  " + "\n  ".join(missing), file=sys.stderr)
    print("hint: carry its cp312 wheel in .whl/ (docs/how-to/gpu.md, Prepare)", file=sys.stderr)
    sys.exit(1)
import pydantic  # noqa: E402 - checked above

fla = "fla carried (kernel: fla runs)" if importlib.util.find_spec("fla") else "no fla (kernel: fla rows unsupported)"
print("python", sys.version.split()[0], "pydantic", pydantic.VERSION, f"and {len(needed)} packages import;", fla)
PYTHON
}

environment() {
  if [ "$MODE" = gpu ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,power.default_limit \
      --format=csv || true
  fi
  # torch's version and CUDA's are among its rows; a separate `import torch` to print them cost a second import.
  "$PY" -m attnbench env --device "$DEVICE"
}

# reached NAME: how many of its config's cases the sweep NAME recorded (a sweep cut by its budget keeps its rows).
reached() {
  local folder
  folder=$(run_folder "$1")
  [ -n "$folder" ] || { echo "$1: no run folder"; return 1; }
  "$PY" - "$folder" "$DEVICE" << 'PYTHON'
import sys
from attnbench.config.experiment import stored_experiment
from attnbench.results.store import load_run

stored = load_run(sys.argv[1])
planned = stored_experiment(stored.run.config, stored.run.config_source).cases(sys.argv[2])
ok = sum(r.ok for r in stored.results)
print(f"reached {len(stored.results)} of {len(planned)} cases ({ok} ok)")
PYTHON
}

# The article's claims: every claim's cases at batch 1 and three lengths, each model at one scope, and the three
# 110 M-parameter presets at one length (claim 3); on the CPU, the same at toy sizes, one grid and one decode length
# and bert-base alone (a preset cannot shrink: lstm-110m's and mingru-110m's rows took 6 of the CPU sweep's 10 s, and
# take the same path as bert-base's; a second grid length added a third to a loaded CPU's 35-50 s). Decode and the presets run first (order): a sweep cut by its budget loses the grid's longest
# lengths, not claim 1's decode rows or claim 3.
# minGRU runs its parallel scan only: the sequential one launches tens of thousands of kernels at n = 2k-8k.
claims_sweep() {
  local rc
  if [ "$MODE" = gpu ]; then
    "$PY" -m attnbench sweep configs/claims.yaml --device cuda --out "$WORK/claims" -q --set 'order=[decode,presets]' \
      --set 'grid.batch=[1]' --set 'model_options.lstm={scope: core}' --set 'model_options.vanilla={scope: core}' \
      --set 'model_options.sdpa-flash={scope: core}' --set 'model_options.mingru={scan: parallel}' \
      --set 'presets.seq_len=[128]' --set 'decode.models=[lstm,sdpa-flash]' \
      --set 'decode.seq_len=[2048,16384,131072]' --set timing.max_case_s=0.3 --set timing.min_time_s=0.1
  else
    "$PY" -m attnbench sweep configs/claims-cpu.yaml --device cpu --out "$WORK/claims" -q \
      --set 'order=[decode,presets]' --set 'grid.seq_len=[16]' --set d_model=32 --set heads=2 \
      --set 'presets.names=[bert-base]' --set 'presets.seq_len=[8]' --set 'presets.modes=[forward]' \
      --set 'decode.seq_len=[64]' \
      --set 'model_options.mingru={scan: parallel}' \
      --set timing.max_case_s=0.3 --set timing.warmup_max_s=0.1 --set timing.min_time_s=0.02 \
      --set timing.process_warmup_s=0.05
  fi
  rc=$?
  reached claims
  return "$rc"
}

# Every attention kernel (and cuDNN LSTM) at two lengths (2048: claim 4's), causal and not: the flash-vs-vanilla comparison, each
# forced SDPA backend beside PyTorch's own choice, useful vs executed FLOPs, and which RNN path runs. Mamba-2 (its torch
# form, bf16) runs first, at the same lengths: no other step of the check runs it in a sweep.
flash_sweep() {
  local models='models=[mamba2,vanilla,sdpa-math,sdpa-flash,sdpa-efficient,sdpa-cudnn,sdpa,flash-attn,lstm]'
  if [ "$MODE" = gpu ]; then
    "$PY" -m attnbench sweep configs/gpu-seq-sweep.yaml --device cuda --out "$WORK/flash" -q --telemetry full \
      --set "$models" --set 'grid.seq_len=[2048,8192]' --set 'grid.heads=[16]' --set 'modes=[forward]' \
      --set timing.max_case_s=0.3
  else  # the same kernels at one tiny length: the plumbing, not the comparison
    "$PY" -m attnbench sweep configs/gpu-seq-sweep.yaml --device cpu --out "$WORK/flash" -q \
      --set "$models" --set grid.tokens=64 --set 'grid.seq_len=[32]' --set 'grid.heads=[4]' --set d_model=32 \
      --set 'grid.causal=[true]' --set 'dtype=[float32]' --set 'modes=[forward]' --set timing.max_case_s=0.2 \
      --set timing.min_time_s=0.02 --set timing.warmup_max_s=0.05 --set timing.process_warmup_s=0.05
  fi
}

run_folder() { ls -d "$WORK/$1"/*/ 2> /dev/null | head -n 1; }

# pack NAME: the run folder of sweep NAME as $OUT/NAME-run.tgz, plots dropped if it would not come back (16 MiB).
pack() {
  local folder tarball
  folder=$(run_folder "$1")
  [ -n "$folder" ] || { echo "no run folder under $WORK/$1"; return 1; }
  tarball="$OUT/$1-run.tgz"
  tar -czf "$tarball" -C "$(dirname "$folder")" "$(basename "$folder")" || return 1
  if [ "$(stat -c %s "$tarball")" -gt $((15 * 1024 * 1024)) ]; then
    tar -czf "$tarball" --exclude=plots -C "$(dirname "$folder")" "$(basename "$folder")" || return 1
    echo "plots left out of $tarball: the whole folder was over 15 MiB"
  fi
  echo "packed $folder -> $tarball ($(stat -c %s "$tarball") bytes)"
}

claims_report() {
  local folder
  folder=$(run_folder claims)
  [ -n "$folder" ] || { echo "no claims run folder"; return 1; }
  "$PY" -m attnbench claims "$folder" -f md -o "$OUT/claims.md" && cat "$OUT/claims.md"
}

calibrate() {
  if [ "$MODE" = gpu ]; then
    "$PY" -m attnbench calibrate --device cuda --quick --refresh
  else
    "$PY" -m attnbench calibrate --device cpu --quick --dtype float32
  fi
}

selfcheck() {
  local rc extra=()
  # On --cpu the verdict is not held against the check (below): one round runs every op through both timers and
  # writes the report (three rounds took 16 s of a loaded CPU check's ~45 s), and none is added to reach a verdict.
  [ "$MODE" = cpu ] && extra=(--rounds 1 --max-rounds 1)
  # Its own budget, a few seconds inside the step's, so it ends with a verdict rather than a kill.
  "$PY" -m attnbench selfcheck --device "$DEVICE" --quick -o "$OUT/selfcheck.md" --budget-s "$SELFCHECK_BUDGET_S" \
    "${extra[@]}"
  rc=$?
  # A shared CPU's tiny ops may disagree under load: on --cpu the step checks the plumbing (the command ran to a
  # verdict and wrote its report), not the verdict. On the GPU a disagreement fails the check; an inconclusive
  # verdict (exit 5: the rounds could not tell an op from the tolerance) is reported, not failed.
  if [ "$MODE" = cpu ] && { [ "$rc" -eq 1 ] || [ "$rc" -eq 5 ]; } \
    && grep -qE "^\*\*selfcheck (FAILED|inconclusive)" "$OUT/selfcheck.md"; then
    echo "(--cpu: the verdict of tiny ops on a shared CPU is not held against the check)"
    return 0
  fi
  if [ "$rc" -eq 5 ]; then
    echo "(selfcheck inconclusive: the GPU was too noisy for a verdict; rerun it on a quiet device)"
    return 0
  fi
  return "$rc"
}

# Only the files that mark a test `gpu`: collecting the whole suite to deselect ~2,200 tests took 40 of a CPU
# check's 45 s here, time the GPU's budget is better spent on. (No file found: pytest collects everything.) -rA and
# the JUnit file say which test did what, even when the step is stopped at its budget (SIGINT: pytest ends its
# session); a test past ATTNBENCH_TEST_TIMEOUT_S fails on its own (tests/conftest.py). The compile-heavy tests
# (FlexAttention's, those marked `compiles`) run in a step of their own, ATTNBENCH_COMPILE_HEAVY choosing (the same
# conftest), their JUnit file joined to the other's at the end. On --cpu, where every one of them skips, the first
# such file alone (for the compile step, the first with a `compiles` test): the step's plumbing, not ten files'
# imports (the suite itself collects them all). GPU_CHECK_TEST_FILES replaces the files (a test of the check).
gpu_test_files() {
  local files
  # A mark at a line's start (a decorator, a pytestmark entry), not one quoted in a test's text.
  files=${GPU_CHECK_TEST_FILES:-$(grep -rlE '^[[:space:]]*@?pytest\.mark\.gpu\b' tests --include='*.py' | sort)}
  if [ "$MODE" = cpu ] && [ -z "${GPU_CHECK_TEST_FILES:-}" ]; then
    # shellcheck disable=SC2086  # one word per file
    [ "$1" = only ] && files=$(grep -lE '^[[:space:]]*@pytest\.mark\.compiles\b' $files | sort)
    files=$(echo "$files" | head -n 1)
  fi
  echo "$files"
}

run_gpu_tests() {
  local junit=$1 compile_heavy=$2 rc
  # shellcheck disable=SC2046  # one word per file
  ATTNBENCH_TEST_TIMEOUT_S=20 ATTNBENCH_COMPILE_HEAVY=$compile_heavy "$PY" -m pytest -m gpu -rA -q \
    -p no:cacheprovider --junitxml="$junit" $(gpu_test_files "$compile_heavy")
  rc=$?
  [ "$rc" -eq 5 ] && { echo "(no $compile_heavy-compile-heavy GPU test in these files)"; return 0; }
  return "$rc"
}
gpu_tests() { run_gpu_tests "$OUT/gpu-tests.xml" none; }
gpu_compile_tests() { run_gpu_tests "$WORK/gpu-compile-tests.xml" only; }

# junit_counts FILE: "N tests, F failed, E errors, S skipped" over its suites; junit_clean FILE: it exists, parses,
# and has no failure or error. (The compile step's verdict when it is cut.)
junit_counts() {
  "$PY" - "$1" << 'PYTHON'
import sys
import xml.etree.ElementTree as ET

suites = list(ET.parse(sys.argv[1]).getroot().iter("testsuite"))
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(f"{n['tests']} tests, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
PYTHON
}
junit_clean() { [ -f "$1" ] && junit_counts "$1" 2> /dev/null | grep -q " 0 failed, 0 errors,"; }

# The compile step's JUnit file joined to gpu-tests.xml (one file comes back: $OUT holds at most 8).
merge_junit() {
  [ -f "$WORK/gpu-compile-tests.xml" ] || return 0
  [ -f "$OUT/gpu-tests.xml" ] || { cp "$WORK/gpu-compile-tests.xml" "$OUT/gpu-tests.xml"; return; }
  "$PY" - "$OUT/gpu-tests.xml" "$WORK/gpu-compile-tests.xml" << 'PYTHON'
import sys
import xml.etree.ElementTree as ET

tree = ET.parse(sys.argv[1])
for suite in ET.parse(sys.argv[2]).getroot().iter("testsuite"):
    suite.set("name", suite.get("name", "pytest") + "-compile-heavy")
    tree.getroot().append(suite)
tree.write(sys.argv[1], encoding="utf-8", xml_declaration=True)
PYTHON
}

telemetry_overhead() {
  # On the GPU sized to its step: --budget-s, a few seconds inside the budget, sets each measurement and the
  # sampler's window (without it the script's 1.5 s measurements, warm-ups and CUDA's start took ~15 s).
  local args=(--device "$DEVICE" --rounds 1 --budget-s "$TELEMETRY_BUDGET_S")
  # On a CPU: the GPU path against the fake pynvml, on tiny cases (plumbing: a loaded CPU's timings mean nothing).
  [ "$MODE" = gpu ] || args=(--device "$DEVICE" --rounds 1 --nvml fake --quick)
  "$PY" scripts/telemetry_overhead.py "${args[@]}" > "$OUT/telemetry-overhead.md" || return 1
  cat "$OUT/telemetry-overhead.md"
}

export -f setup environment claims_sweep flash_sweep run_folder pack claims_report calibrate selfcheck gpu_tests \
  gpu_compile_tests run_gpu_tests gpu_test_files telemetry_overhead reached
SELFCHECK_BUDGET_S=$(($(budget_of selfcheck) - 8))
TELEMETRY_BUDGET_S=$(($(budget_of telemetry-overhead) - 3))
export MODE DEVICE PY OUT WORK SCALE SELFCHECK_BUDGET_S TELEMETRY_BUDGET_S

log "attnbench GPU check ($MODE mode) in $ROOT, $(date -u +%Y-%m-%dT%H:%M:%SZ); outputs in $OUT"
if run_step setup bash -c setup; then
  [ -d "$WORK/site" ] && export PYTHONPATH="$WORK/site:$PYTHONPATH"
  run_step env bash -c environment
  run_step calibrate bash -c calibrate
  run_step claims-sweep bash -c claims_sweep
  run_step claims-pack bash -c "pack claims"  # as soon as the sweep ends, whatever ended it
  run_step claims-report bash -c claims_report
  run_step selfcheck bash -c selfcheck
  run_step flash-sweep bash -c flash_sweep
  run_step flash-pack bash -c "pack flash"
  run_step gpu-tests bash -c gpu_tests
  run_step gpu-compile-tests bash -c gpu_compile_tests
  merge_junit
  run_step telemetry-overhead bash -c telemetry_overhead
else
  for s in "${STEPS[@]:1}"; do skip_step "${s%%:*}" "setup failed"; done
fi

# The one-screen summary: every step against its budget, then the figures a reader wants first.
{
  echo "# attnbench GPU check ($MODE mode), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "| step | verdict | s | budget s |"
  echo "| --- | --- | --- | --- |"
  total=0
  for r in "${RESULTS[@]}"; do
    IFS='|' read -r name verdict took budget <<< "$r"
    echo "| $name | $verdict | $took | $budget |"
    total=$((total + took))
  done
  echo "| all | $([ "$FAILED" = 0 ] && echo ok || echo FAILED) | $total | $(plan_total) |"
  [ "$SCALE" = 1 ] || echo "(budgets scaled ×$SCALE on --cpu; the plan's total is the GPU's)"
  echo
  echo "Key figures:"
  grep -E "^[│┃|].*(matmul (bfloat16|float32) |copy \(read)" "$LOG" | head -n 3 | tr -s ' ' | sed 's/^/- calibrate: /'
  grep -hE "^selfcheck (passed|FAILED|inconclusive)" "$LOG" | tail -n 1 | sed 's/^/- /'
  grep -hE "^Overall: " "$OUT/telemetry-overhead.md" 2> /dev/null | sed "s/^/- telemetry overhead ($MODE, 1 round): /"
  grep -h "^Verdicts:" "$OUT/claims.md" 2> /dev/null | sed 's/^Verdicts: /- claims: /'
  for step in gpu-tests gpu-compile-tests; do
    awk -v s="$step" '$0 ~ "^=== " s " " {on = 1} $0 ~ "^--- " s ":" {on = 0} on' "$LOG" \
      | grep -E "^[0-9]+ (passed|failed|skipped|deselected)|^no tests ran" | tail -n 1 | sed "s/^/- $step: /"
  done
  echo
  echo "Files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
} > "$OUT/summary.md"
cat "$OUT/summary.md" | tee -a "$LOG"
exit "$FAILED"
