#!/usr/bin/env bash
# s34 (one H100): main's library (1b8cd75, key f5f54b5557007112ea76; lib.tar.xz beside the script when it ran).
# Run as `RUN_K="block128" DEADLINE=420 call1.sh run band b16`. Phases by argument:
#   run    the FP8 runner tests (tests/gpu/test_runner_fp8.py; RUN_K selects, block128 by default)
#   band   the gated GEMM1's pingpong band at other counts, gated against the activation kernel
#   b16    the plan at 16 tokens and 1 token (the decode band) for the floor targets
set -u
C=$PWD/.device_carry/s34
R=/tmp/s34r; mkdir -p $R /tmp/libs34
[ -d /tmp/libs34/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs34
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs34/lib/libmoe_build_kernels.so
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
  if [ "$ph" = run ]; then
    timeout 240 $PT tests/gpu/test_runner_fp8.py -k "${RUN_K:-block128}" > $R/run.log 2>&1
    echo "run rc=$?" | tee -a $R/phases.txt
    tail -3 $R/run.log
  elif [ "$ph" = band ]; then
    for pt in "qwen3-30b-a3b 64,128,320,640" "deepseek-v2-lite 48,128,426" "gpt-oss-20b 16,64,320" \
              "mixtral-8x7b 32,96,160" "deepseek-v3 65,512,1280"; do
      set -- $pt
      bench band_$1_$RD fp8_block $1 $2 "ours,ours:fc1_activation=separate"
    done
  elif [ "$ph" = b16 ]; then
    bench b16_$RD fp8_block qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b,deepseek-v3 1,16 ours
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s34.tar.xz -C $R .
done
