#!/usr/bin/env bash
# s32 (one H100 or H200): main's library (lib.tar.xz beside this script). Phases by argument:
#   gtest  the gated FP8 GEMM tests of the cluster tile and the runner's launches (tests/gpu/test_fp8_gemm_gated*.py)
#   sep    FP8 static layers: GEMM2's input quantized by a separate step (fc2_input_quant=separate) forced beside the
#          plan's GEMM1 epilogue (gemm1), and our bf16 layer, at 2048-8192 tokens (ROUND names the files)
#   c2b    FP8 (dynamic, static): the plan (GEMM1 on pingpong128x128c2 where k < 7168) with the single CTA forced
#   dsv3   block-128 DeepSeek-V3 at 4096 tokens with our bf16 layer and the scaled_grouped_mm peer
#   steps  bench/layer_steps_probe.py: Qwen3-30B-A3B and DeepSeek-V2-Lite at 4096 tokens, bf16 / fp8 / fp8_static
#   tiles  FP8 (dynamic, static) at 4096 tokens on Qwen3-30B-A3B and DeepSeek-V2-Lite, each GEMM's other tiles forced
# Run from the repository root as .device_carry/s32/run.sh PHASE...; results in $OUT/s32.tar.xz.
set -u
C=$PWD/.device_carry/s32
R=/tmp/s32r; mkdir -p $R /tmp/libs
[ -d /tmp/libs/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
RD=r${ROUND:-1}
bench() {  # name quant shape tokens variants
  timeout ${BT:-200} python3 -m moe_build bench --quant $2 --shapes $3 --tokens $4 --variants "$5" --iters 5 \
    --input-sets 2 --json $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc=$?" | tee -a $R/phases.txt
}
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = gtest ]; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gemm_gated.py \
      tests/gpu/test_fp8_gemm_gated_quantized.py -k "pingpong128x128c2 or runner" > $R/gtest.log 2>&1
    echo "gtest rc=$?" | tee -a $R/phases.txt; tail -3 $R/gtest.log
  elif [ "$ph" = sep ]; then
    for pt in "deepseek-v2-lite 2048,4096,8192" "qwen3-30b-a3b 2048,4096,8192" "gpt-oss-20b 2048,4096,8192" \
              "mixtral-8x7b 2048,4096" "deepseek-v3 4096"; do
      set -- $pt
      bench sep_$1_$RD fp8_static $1 $2 "ours,ours:fc2_input_quant=separate,ours_bf16"
    done
  elif [ "$ph" = c2b ]; then
    for pt in "deepseek-v2-lite 4096" "qwen3-30b-a3b 4096" "gpt-oss-20b 4096" "mixtral-8x7b 2048,4096"; do
      set -- $pt
      bench c2b_$1_$RD fp8,fp8_static $1 $2 "ours,ours:gemm1_tactic=wgmma:pingpong128x128:plain:evict_last,ours_bf16"
    done
  elif [ "$ph" = steps ]; then
    (cd bench && LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite LAYER_STEPS_TOKENS=4096 \
      LAYER_STEPS_QUANTS=bf16,fp8,fp8_static timeout 200 python3 layer_steps_probe.py $R/steps.json > $R/steps.log 2>&1)
    echo "steps rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = tiles ]; then
    V=ours
    for t in coop128x256 coop128x192 coop128x192c2 pingpong128x128; do V="$V,ours:gemm1_tactic=wgmma:$t:plain:evict_last"; done
    for t in coop128x192 coop128x192c2 coop128x256 coop128x128c2 pingpong128x128 pingpong64x128c2; do
      V="$V,ours:gemm2_tactic=wgmma:$t:plain:evict_last"; done
    for shape in qwen3-30b-a3b deepseek-v2-lite; do bench tiles_${shape}_$RD fp8,fp8_static $shape 4096 "$V"; done
  elif [ "$ph" = dsv3 ]; then
    BT=300 bench dsv3_$RD fp8_block deepseek-v3 4096 ours,ours_bf16,scaled_grouped_mm
    nvidia-smi --query-gpu=memory.used --format=csv >> $R/phases.txt
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s32.tar.xz -C $R .
done
grep -E "GEMM|gemm|quantiz|activation|expan|finaliz|replay|total|rout" $R/steps.log 2>/dev/null | cut -c1-150 | head -60
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*_r*.json")):
    for p in json.load(open(f))["points"]:
        us = {k: e.get("graph_us") for k, e in p["variants"].items()}
        o, b = us.get("ours"), us.get("ours_bf16")
        forced = [(k, x) for k, x in us.items() if k.startswith("ours:")]
        fs = " ".join(f"{k[5:10]}{k.split('=', 1)[1][6:22]} {x:8.1f} ({x / o:.3f})" for k, x in forced if x and o)
        print(f"{f.split('/')[-1][:-5]:28s} {p['quant']:10s} {p['tokens']:5d} plan {o or 0:8.1f} bf16 {b or 0:8.1f} "
              f"bf16/plan {b / o if o and b else 0:.2f} | {fs}")
PY
