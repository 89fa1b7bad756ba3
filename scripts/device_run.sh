#!/usr/bin/env bash
# The one device script: on a fresh GPU machine, use (or build) the kernel library, run the GPU tests, time
# the layer, and leave JSON/PNG/logs under $OUT, printing a short table last (the device reply carries only
# the tail of the output). Every phase has a hard timeout; a failed phase does not stop the ones after it.
#
# Phases, chosen by PHASES (default "tests bench"):
#   tests  the GPU tests (GPU_TESTS, default tests/gpu and the README's Python example: pytest paths or node ids,
#          word-split). GPU_CASES (default pairs) is pytest's --gpu-cases: "pairs" runs the parametrized cases that
#          hold every pair of parameter values (about 3,200 of 8,500), "all" every combination
#   tests_split  the single-GPU tests (GPU_TESTS, default every tests/gpu/test_*.py but the multi-GPU
#          test_expert_parallel.py, and the README's Python example) in WORKERS_PER_GPU (default 4) pytest
#          processes a GPU side by side, each taking every P-th test (pytest --shard, P processes in all), whose
#          torch threads tests/conftest.py sets to cores / P (without it their fp64 references, on the CPU, slowed
#          each other many times over); GPU_CASES as for tests; logs gpu_tests_split_<process>.log
#   bench  moe-build bench: the four bench shapes at 1/16/256/4096 tokens, ours and its forced-off variants
#          beside the peers and the floor (BENCH_ARGS adds or overrides options)
#   sweep  moe-build bench --sweep: the default plan at a dense set of token counts from 1 to 8192
#          (SWEEP_ARGS adds options, e.g. --variants with forced tactics and --tokens); sweep2 a second one
#          with SWEEP2_ARGS (sweep2.json)
#   ab     the layer (ours, graph replay) at the bench points with this tree's library and with a baseline
#          tree's (AB_BASELINE: a folder holding an older moe_build/, plugins/ and its
#          libmoe_build_kernels.so), one process of each per round (rounds AB_FIRST..AB_LAST, default 1..2),
#          alternated; prints old vs new per point over every ab_*.json under $OUT
#   bench_woq  moe-build bench --quant w4a16_awq,w8a16,wfp4a16: the weight-only layers beside our bf16 runner
#          (BENCH_WOQ_ARGS adds options, e.g. --shapes / --tokens)
#   probes  the single-GPU probes of bench/ named in PROBES (default "fp8_tactics_probe woq_tactics_probe
#          layer_steps_probe"), each writing its JSON under the results (PROBES_S seconds each, default 240)
#   bench_ep  moe-build bench-ep on every GPU of the host (a 2- or 4-GPU kind): expert-parallel dispatch +
#          combine, memory, and the layer against one GPU (BENCH_EP_ARGS adds options)
#
# FP8 checkpoints made by a real producer tool (tests/gpu/test_runner_fp8_checkpoints.py): write them here with
#   `python scripts/make_fp8_tool_checkpoints.py .device_carry/fp8_tool_checkpoints`, carry the folder and set
#   MOE_BUILD_FP8_TOOL_CHECKPOINTS=.device_carry/fp8_tool_checkpoints (the device lacks the tool). Weight-only ones
#   likewise (tests/gpu/test_runner_woq_checkpoints.py): `python scripts/make_woq_tool_checkpoints.py
#   .device_carry/woq_tool_checkpoints`, carried, with MOE_BUILD_WOQ_TOOL_CHECKPOINTS=.device_carry/woq_tool_checkpoints.
# Usage (from the repository root, via the device tool; carry the library built here with
#   `moe-build kernels --out .device_carry/lib`, since the device has no CUTLASS headers):
#   MOE_BUILD_KERNELS_LIB=.device_carry/lib/libmoe_build_kernels.so PHASES="tests ab" \
#     AB_BASELINE=.device_carry/baseline bash scripts/device_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# Everything is written under RESULTS and packed into $OUT/results.tgz at the end (the device tool returns
# at most a few files).
OUT=${OUT:-$PWD/device_out}
RESULTS=$(mktemp -d)
export MOE_BUILD_GPU_RESULTS=$RESULTS  # tests that keep measured data (tests/gpu/test_expert_parallel.py) write it here
mkdir -p "$OUT"
PY=${PY:-python3}
README_EXAMPLE=tests/test_docs.py::test_the_readme_python_example_runs
PHASES=${PHASES:-tests bench}
# The device runs the tree in place (no install): moe_build.plugins is the top-level plugins/ folder, as the
# package's install maps it.
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$RESULTS/gpu.csv" 2>&1
"$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())" \
  > "$RESULTS/versions.txt" 2>&1

phase() {  # phase NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, record rc and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit took=$((SECONDS - t0))s" | tee -a "$RESULTS/phases.txt"
  tar -czf "$OUT/results.tgz" -C "$RESULTS" .  # what is done so far comes back even if the call is cut short
  return $rc
}
has() { [[ " $PHASES " == *" $1 "* ]]; }

if [ -n "${MOE_BUILD_KERNELS_LIB:-}" ]; then
  echo "library: $MOE_BUILD_KERNELS_LIB (carried)" >> "$RESULTS/phases.txt"
else
  phase build "${BUILD_S:-300}" "$PY" -m moe_build kernels -j 16
fi
# shellcheck disable=SC2086
has tests && phase gpu_tests "${TESTS_S:-240}" "$PY" -m pytest -q -rs -p no:cacheprovider ${GPU_TESTS:-tests/gpu $README_EXAMPLE} \
  --gpu-cases="${GPU_CASES:-pairs}" --junitxml="$RESULTS/gpu_tests.xml"
if has tests_split; then
  gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  [ "$gpus" -ge 1 ] || gpus=1
  processes=$((gpus * ${WORKERS_PER_GPU:-4}))
  # shellcheck disable=SC2086,SC2207
  files=(${GPU_TESTS:-$(ls tests/gpu/test_*.py | grep -v test_expert_parallel.py) $README_EXAMPLE})
  t0=$SECONDS
  for p in $(seq 0 $((processes - 1))); do
    CUDA_VISIBLE_DEVICES=$((p % gpus)) timeout "${TESTS_S:-240}" "$PY" -m pytest -q -rs -p no:cacheprovider \
      "${files[@]}" --gpu-cases="${GPU_CASES:-pairs}" --shard="$p/$processes" > "$RESULTS/gpu_tests_split_$p.log" 2>&1 &
  done
  wait
  for log in "$RESULTS"/gpu_tests_split_*.log; do
    echo "gpu_tests_split $(basename "$log" .log): $(tail -n 1 "$log")" | tee -a "$RESULTS/phases.txt"
  done
  echo "gpu_tests_split ${TESTS_S:-240}s-limit took=$((SECONDS - t0))s" | tee -a "$RESULTS/phases.txt"
  tar -czf "$OUT/results.tgz" -C "$RESULTS" .
fi
sweep_phase() {  # sweep_phase NAME ARGS: the phase NAME, a sweep written to NAME.json / NAME.png, ARGS word-split
  # shellcheck disable=SC2086
  phase "$1" "${SWEEP_S:-420}" "$PY" -m moe_build bench --sweep --json "$RESULTS/$1.json" --png "$RESULTS/$1.png" $2
}
has sweep && sweep_phase sweep "${SWEEP_ARGS:-}"
if has ab; then
  base=${AB_BASELINE:?AB_BASELINE must name the baseline tree}
  [[ $base == /* ]] || base=$PWD/$base  # relative to the repository root; the old side runs from inside it
  for round in $(seq "${AB_FIRST:-1}" "${AB_LAST:-2}"); do
    phase "ab_new_$round" "${AB_S:-150}" "$PY" -m moe_build bench --variants ours --input-sets 2 \
      --json "$RESULTS/ab_new_$round.json"
    # from the baseline's folder: `python -m` puts the working directory first on the path
    phase "ab_old_$round" "${AB_S:-150}" env -C "$base" PYTHONPATH=. MOE_BUILD_KERNELS_LIB="$base/libmoe_build_kernels.so" \
      "$PY" -m moe_build bench --variants ours --input-sets 2 --json "$RESULTS/ab_old_$round.json"
  done
fi

has sweep2 && sweep_phase sweep2 "${SWEEP2_ARGS:-}"
if has probes; then
  for probe in ${PROBES:-fp8_tactics_probe woq_tactics_probe layer_steps_probe}; do
    # the probes write their JSON to $OUT (here: the results folder); bench/ holds their shared timing module
    phase "$probe" "${PROBES_S:-240}" env OUT="$RESULTS" PYTHONPATH="$PWD/bench:$PYTHONPATH" "$PY" "bench/$probe.py"
  done
fi
# shellcheck disable=SC2086
has bench_ep && phase bench_ep "${BENCH_EP_S:-400}" env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 "$PY" -m moe_build bench-ep --json "$RESULTS/bench_ep.json" ${BENCH_EP_ARGS:-}
# shellcheck disable=SC2086
has bench_woq && phase bench_woq "${BENCH_WOQ_S:-400}" "$PY" -m moe_build bench --quant w4a16_awq,w8a16,wfp4a16 \
  --json "$RESULTS/bench_woq.json" ${BENCH_WOQ_ARGS:-}
# shellcheck disable=SC2086
has bench && phase bench "${BENCH_S:-300}" "$PY" -m moe_build bench --json "$RESULTS/bench.json" --png "$RESULTS/bench.png" \
  ${BENCH_ARGS:-}
[ -f "$RESULTS/gpu_tests.log" ] && { echo "==== gpu tests (tail)"; tail -n 15 "$RESULTS/gpu_tests.log"; }
for log in "$RESULTS"/gpu_tests_split_*.log; do
  [ -f "$log" ] && { echo "==== $(basename "$log" .log)"; grep -E "^(FAILED|ERROR)" "$log" | head -n 10; tail -n 1 "$log"; }
done
echo "==== gpu";  cat "$RESULTS/gpu.csv" "$RESULTS/versions.txt"
[ -f "$RESULTS/bench.json" ] && { echo "==== bench (us, median)";
  "$PY" -c "import json,sys; from moe_build.bench.layer import table; print(table(json.load(open(sys.argv[1]))))" \
    "$RESULTS/bench.json"; }
[ -f "$RESULTS/bench_woq.log" ] && { echo "==== bench --quant weight-only (us, median)";
  grep -A 200 "^quant " "$RESULTS/bench_woq.log"; }
[ -f "$RESULTS/bench_ep.log" ] && { echo "==== bench-ep"; grep -v "Warning\|warn(\|return func\|OMP_NUM\|\*\*\*" \
  "$RESULTS/bench_ep.log" | tail -n 40; }
[ -f "$RESULTS/sweep.json" ] && { echo "==== sweep"; tail -n 12 "$RESULTS/sweep.log"; }
[ -f "$RESULTS/sweep2.json" ] && { echo "==== sweep2"; tail -n 12 "$RESULTS/sweep2.log"; }
has ab && "$PY" -m moe_build.bench.compare "$RESULTS"/ab_old_*.json -- "$RESULTS"/ab_new_*.json | tee "$RESULTS/ab_table.txt"
if has probes; then
  for probe in ${PROBES:-fp8_tactics_probe woq_tactics_probe layer_steps_probe}; do
    echo "==== $probe (tail)"; tail -n "${PROBE_TAIL:-25}" "$RESULTS/$probe.log"
  done
fi
echo "==== phases"; cat "$RESULTS/phases.txt"
tar -czf "$OUT/results.tgz" -C "$RESULTS" .
