#!/usr/bin/env bash
# THE one device script: on a fresh GPU machine build the kernel library, run the GPU tests,
# run the bench, leave JSON/PNG/logs under $OUT, and print a short table last (the device
# reply carries only the tail of the output). Budgeted to finish inside one 10-minute call:
# each phase gets a hard timeout, and a failed phase does not stop the ones after it.
#
# Usage (from the repository root, via the device `run` tool):
#   bash scripts/device_run.sh              # build + tests + bench
#   SKIP_TESTS=1 bash scripts/device_run.sh # build + bench
#   BENCH_ARGS="--shapes mixtral-8x7b --tokens 1,16" bash scripts/device_run.sh
#   GEMM_PROBE=1 bash scripts/device_run.sh  # + the grouped-GEMM tile probe (bench/gemm_rate_probe.py)
#   NCU_PROBE=1 bash scripts/device_run.sh   # + Nsight Compute counters of the 4096-token GEMMs (bench/gemm_ncu_probe.py)
#   POWER_PROBE=1 bash scripts/device_run.sh # + the 4096-token layer vs the matmul ceiling, cool and hot (bench/power_state_probe.py)
#   MOE_BUILD_KERNELS_LIB=build/kernels/libmoe_build_kernels.so bash scripts/device_run.sh
#       (a library built on the CPU machine with `python -m moe_build.kernel_build --out build/kernels`,
#        carried with the call: the device has no nvidia-cutlass headers)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# carried wheels (e.g. nvidia-cutlass headers) unpacked on the CPU machine, when present
[ -d .device_carry/site ] && export PYTHONPATH="$PWD/.device_carry/site:$PYTHONPATH"
PY=${PY:-python3}
# CUTLASS headers: kernel_build finds them through the `cutlass_library` package; the device has
# no pip, so when only the carried headers (.device_carry/cutlass_include) exist, expose them as one.
if ! "$PY" -c "import cutlass_library" 2>/dev/null && [ -d .device_carry/cutlass_include/cutlass ]; then
  shim=$(mktemp -d)/site
  mkdir -p "$shim/cutlass_library/source"
  touch "$shim/cutlass_library/__init__.py"
  ln -s "$PWD/.device_carry/cutlass_include" "$shim/cutlass_library/source/include"
  export PYTHONPATH="$shim:$PYTHONPATH"
fi
BUILD_S=${BUILD_S:-200}; TESTS_S=${TESTS_S:-150}; BENCH_S=${BENCH_S:-230}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.csv" 2>&1
"$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())" \
  > "$OUT/versions.txt" 2>&1

phase() {  # phase NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, record rc and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit took=$((SECONDS - t0))s" | tee -a "$OUT/phases.txt"
  return $rc
}

if [ -n "${MOE_BUILD_KERNELS_LIB:-}" ] && [ -f "$MOE_BUILD_KERNELS_LIB" ]; then
  echo "build: using the carried library $MOE_BUILD_KERNELS_LIB" | tee "$OUT/build.log" >> "$OUT/phases.txt"
else
  phase build "$BUILD_S" "$PY" -m moe_build.kernel_build -j 16
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  phase gpu_tests "$TESTS_S" "$PY" -m pytest -q -rs tests/gpu --junitxml="$OUT/gpu_tests.xml"
fi
# GEMM_PROBE=1: the prefill grouped-GEMM tiles timed side by side (bench/gemm_rate_probe.py) at 4096 and 256 tokens
if [ "${GEMM_PROBE:-0}" = 1 ]; then
  for t in 4096 256; do
    phase "gemm_probe_$t" 120 "$PY" bench/gemm_rate_probe.py --tokens "$t" --json "$OUT/gemm_rate_probe_$t.json" \
      --tiles auto,coop128x256,pingpong64x256,pingpong64x128,pingpong64x256c2,pingpong64x192c2
  done
fi
# NCU_PROBE=1: what bounds each 4096-token GEMM (SM / L2 / DRAM throughput under Nsight Compute)
if [ "${NCU_PROBE:-0}" = 1 ]; then
  phase gemm_ncu 240 "$PY" bench/gemm_ncu_probe.py --json "$OUT/gemm_ncu_probe.json" \
    --tiles auto,pingpong64x256,pingpong64x256c2,coop128x256
fi
# POWER_PROBE=1: the 4096-token layer and the matmul ceiling after an idle gap and hot (bench/power_state_probe.py)
if [ "${POWER_PROBE:-0}" = 1 ]; then
  for s in qwen3-30b-a3b deepseek-v2-lite; do
    phase "power_$s" 60 "$PY" bench/power_state_probe.py --shape "$s" --json "$OUT/power_state_$s.json"
  done
fi
# shellcheck disable=SC2086
phase bench "$BENCH_S" "$PY" -m moe_build.bench --json "$OUT/bench.json" --png "$OUT/bench.png" ${BENCH_ARGS:-}

echo "==== build (tail)";     tail -n 5 "$OUT/build.log"
[ -f "$OUT/gpu_tests.log" ] && { echo "==== gpu tests (tail)"; tail -n 25 "$OUT/gpu_tests.log"; }
echo "==== gpu";              cat "$OUT/gpu.csv" "$OUT/versions.txt"
echo "==== bench (us, median; x floor = ours/floor)"
if [ -f "$OUT/bench.json" ]; then
  "$PY" -c "import json,sys; from moe_build.bench import table; print(table(json.load(open(sys.argv[1]))))" \
    "$OUT/bench.json"
else
  tail -n 20 "$OUT/bench.log"
fi
for f in "$OUT"/power_*.log; do [ -f "$f" ] && { echo "==== $(basename "$f" .log)"; tail -n 5 "$f"; }; done
echo "==== phases"; cat "$OUT/phases.txt"
