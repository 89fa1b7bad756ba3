#!/usr/bin/env bash
# s32b (one H100 or H200): the library of this checkout (lib.tar.xz beside this script: the block-128 gated GEMM1 on
# the wgmma kernel). Phases by argument:
#   gall   every case of the block-128 gated wgmma tests (tests/gpu/test_fp8_gemm_gated.py --gpu-cases=all)
#   gemm   the FP8 GEMM tests (plain, finalize, gated, gated quantized), the default pairwise cases
#   run    the FP8 runner tests (tests/gpu/test_runner_fp8.py; RUN_K selects, block128 by default)
#   bench  moe-build bench --quant fp8_block at 256 and 4096 tokens: the plan (GEMM1's gated epilogue on the
#          wgmma tiles) beside the activation kernel forced (fc1_activation=separate, the plan before) and our bf16 layer
#   b16    the same at 16 tokens and 1 token (the decode band, unchanged) for the floor targets
# Run from the repository root as .device_carry/s32b/run.sh PHASE...; results in $OUT/s32b.tar.xz.
set -u
C=$PWD/.device_carry/s32b
R=/tmp/s32br; mkdir -p $R /tmp/libs
[ -d /tmp/libs/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
RD=r${ROUND:-1}
PT="python3 -m pytest -q -p no:cacheprovider"
bench() {  # name quant shape tokens variants
  timeout ${BT:-200} python3 -m moe_build bench --quant $2 --shapes $3 --tokens $4 --variants "$5" --iters 5 \
    --input-sets 2 --json $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc=$?" | tee -a $R/phases.txt
}
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = gall ]; then
    timeout 150 $PT --gpu-cases=all tests/gpu/test_fp8_gemm_gated.py -k "block128 or refusals" > $R/gall.log 2>&1
    echo "gall rc=$?" | tee -a $R/phases.txt; tail -3 $R/gall.log
  elif [ "$ph" = gemm ]; then
    timeout 200 $PT tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_gemm_gated_quantized.py \
      > $R/gemm.log 2>&1; echo "gemm rc=$?" | tee -a $R/phases.txt; tail -3 $R/gemm.log
  elif [ "$ph" = run ]; then
    timeout 240 $PT tests/gpu/test_runner_fp8.py -k "${RUN_K:-block128}" > $R/run.log 2>&1
    echo "run rc=$?" | tee -a $R/phases.txt
    tail -3 $R/run.log
  elif [ "$ph" = bench ]; then
    for pt in "qwen3-30b-a3b 256,4096" "deepseek-v2-lite 256,4096" "gpt-oss-20b 256" "mixtral-8x7b 4096"; do
      set -- $pt
      bench bench_$1_$RD fp8_block $1 $2 "ours,ours:fc1_activation=separate,ours_bf16"
    done
  elif [ "$ph" = b16 ]; then
    bench b16_$RD fp8_block qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b,deepseek-v3 1,16 ours
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s32b.tar.xz -C $R .
done
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*_r*.json")):
    for p in json.load(open(f))["points"]:
        us = {k: e.get("graph_us") for k, e in p["variants"].items()}
        o, b = us.get("ours"), us.get("ours_bf16")
        sep = us.get("ours:fc1_activation=separate")
        tgt = p.get("targets") or {}
        print(f"{p['shape']:17s} {p['tokens']:5d} plan {o or 0:8.1f} act-kernel {sep or 0:8.1f} "
              f"({(sep / o) if sep and o else 0:.3f}) bf16 {b or 0:8.1f} bf16/plan {b / o if o and b else 0:.2f} "
              f"floor {p.get('floor_us') or 0:8.1f} x{o / p['floor_us'] if o and p.get('floor_us') else 0:.2f}")
PY
