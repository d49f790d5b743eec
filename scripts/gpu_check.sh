#!/usr/bin/env bash
# The GPU check, in one call of the device tool (no network there; about 8 minutes at most):
#   1. once, here:  scripts/prepare_gpu_wheels.sh          (fills the git-ignored .whl/)
#   2. device run:  command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 590
# In order, each step bounded so the whole fits one call:
#   GPU tests (pytest -m gpu) · attnbench calibrate (matmul FLOP/s per dtype, copy bandwidth, vs the vendor peak)
#   · attnbench selfcheck (attnbench vs torch.utils.benchmark and triton's do_bench) · a short flash-vs-vanilla
#   sweep (configs/gpu-seq-sweep.yaml subset, telemetry full) · configs/claims.yaml trimmed, then
#   attnbench claims · the telemetry sampler's overhead on the GPU.
# It leaves under $OUT: gpu-check.log (everything printed), selfcheck-gpu.md, flash-summary.md, claims-gpu.md,
# runs.tgz (both run folders, telemetry.jsonl and calibration included). The device tool returns at most 8 files.
# Commit the runs under results/ with the GPU in the folder name (e.g. results/gpu-check-h200/).
# It never changes clocks, power limits or modes, and never resets the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
export PYTHONUNBUFFERED=1
# The calibration cache lives with the outputs, so this run's sweeps use this run's ceilings.
export ATTNBENCH_CACHE="$OUT/cache"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH="$PWD/.site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
{
  step "nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  step "attnbench env"; timeout 60 python3 -m attnbench env --device cuda
  step "GPU tests"; timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider tests
  echo "pytest exit: $?"
  step "attnbench calibrate"; COLUMNS=160 timeout 60 python3 -m attnbench calibrate --device cuda --refresh
  echo "calibrate exit: $?"
  step "attnbench selfcheck"
  COLUMNS=160 timeout 90 python3 -m attnbench selfcheck --device cuda --rounds 3 -o "$OUT/selfcheck-gpu.md"
  echo "selfcheck exit: $?"
} 2>&1 | tee "$LOG"

step "short flash-vs-vanilla sweep (gpu-seq-sweep subset)" | tee -a "$LOG"
timeout 70 python3 -m attnbench sweep configs/gpu-seq-sweep.yaml --device cuda --out "$OUT/runs" \
  --set 'models=[vanilla,sdpa-math,sdpa-flash,sdpa-efficient,sdpa,flash-attn]' \
  --set 'grid.seq_len=[1024,4096,16384]' --set 'grid.heads=[16]' --set 'grid.causal=[false]' \
  --set timing.max_case_s=0.4 --telemetry full 2>&1 | tee -a "$LOG"
echo "sweep exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
flash=$(ls -d "$OUT"/runs/*gpu-seq-sweep*/ 2>/dev/null | head -n 1)
[ -n "$flash" ] && cp "$flash/summary.md" "$OUT/flash-summary.md"

step "configs/claims.yaml, trimmed to fit" | tee -a "$LOG"
timeout 170 python3 -m attnbench sweep configs/claims.yaml --device cuda --out "$OUT/runs" -q \
  --set timing.max_case_s=0.4 --set 'decode.models=[lstm,flash-attn]' 2>&1 | tail -n 3 | tee -a "$LOG"
echo "claims sweep exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
claims=$(ls -d "$OUT"/runs/*claims*/ 2>/dev/null | head -n 1)
if [ -n "$claims" ]; then
  python3 -m attnbench claims "$claims" -f md -o "$OUT/claims-gpu.md" 2>&1 | tee -a "$LOG"
  cp "$OUT/claims-gpu.md" "$claims/claims.md" 2>/dev/null
fi
if [ -n "$flash" ]; then
  step "telemetry per case (flash sweep)" | tee -a "$LOG"
  python3 -m attnbench report "$flash" --telemetry 2>&1 | tee -a "$LOG"
fi
if [ -d "$OUT/runs" ]; then
  tar -czf "$OUT/runs.tgz" -C "$OUT/runs" . && rm -rf "$OUT/runs"  # few files come back: pack the folders
fi
step "telemetry sampler overhead (GPU)" | tee -a "$LOG"
timeout 40 python3 scripts/telemetry_overhead.py --device cuda --rounds 1 2>&1 | tee -a "$LOG"
rm -rf "$OUT/cache"
