#!/usr/bin/env bash
# The GPU check, in one call of the device tool (no network there; well under 6 minutes):
#   1. once, here:  scripts/prepare_gpu_wheels.sh          (fills the git-ignored .whl/)
#   2. device run:  command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 480
# It runs the test suite's GPU tests and a short subset of configs/gpu-seq-sweep.yaml, and leaves under $OUT:
#   gpu-check.log (everything printed, the telemetry table and the sampler's overhead on the GPU),
#   summary.md, summary.csv, run.tgz (the whole run folder, telemetry.jsonl included).
# Commit the run under results/ with the GPU in the folder name (e.g. results/gpu-check-h200/).
# It never changes clocks, power limits or modes, and never resets the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH="$PWD/.site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
step() { echo; echo "=== $*"; }
{
  step "nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  step "attnbench env"; timeout 60 python3 -m attnbench env --device cuda
  step "attnbench models (bfloat16)"; timeout 120 python3 -m attnbench models --device cuda --dtype bfloat16
  step "GPU tests"; timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests
  echo "pytest exit: $?"
} 2>&1 | tee "$LOG"

step "short gpu-seq-sweep" | tee -a "$LOG"
timeout 170 python3 -m attnbench sweep configs/gpu-seq-sweep.yaml --device cuda --out "$OUT/runs" \
  --set 'grid.seq_len=[1024,4096,16384]' --set 'grid.heads=[16]' --set 'grid.causal=[false]' \
  --set timing.max_case_s=0.5 --telemetry full 2>&1 | tee -a "$LOG"
echo "sweep exit: ${PIPESTATUS[0]}" | tee -a "$LOG"

run=$(ls -d "$OUT"/runs/*/ 2>/dev/null | head -n 1)
if [ -n "$run" ]; then
  cp "$run/summary.md" "$run/summary.csv" "$OUT/" 2>/dev/null
  step "telemetry per case" | tee -a "$LOG"
  python3 -m attnbench report "$run" --telemetry 2>&1 | tee -a "$LOG"
  step "telemetry sampler overhead (GPU)" | tee -a "$LOG"
  timeout 60 python3 scripts/telemetry_overhead.py --device cuda --rounds 2 2>&1 | tee -a "$LOG"
  tar -czf "$OUT/run.tgz" -C "$OUT/runs" .
  rm -rf "$OUT/runs"  # the device tool brings back at most 8 files
fi
