#!/usr/bin/env bash
# s31 (one H100): main's library (lib.tar.xz beside this script). Phases by argument:
#   gemms  tiles_vs_cublas.py (our FP8 tiles against cuBLAS e4m3 / bf16 on the 4096-token GEMMs)
#   steps  bench/layer_steps_probe.py: Mixtral-8x7B, GPT-OSS-20B, DeepSeek-V2-Lite at 4096 tokens, bf16 / fp8 / fp8_static
#   tiles  moe-build bench at 4096 tokens, FP8 tiles forced beside the plan and our bf16 layer
#   c2     the gated GEMM1 forced onto pingpong128x128c2 beside the plan (and our bf16 layer) where the plan takes
#          pingpong128x128, per shape at the counts of that band, fp8 and fp8_static (ROUND names the files)
#   c2b    the same with the plan on the clusters (the rule of this call's checkout) and the single CTA forced
#   gtest  the gated FP8 GEMM tests of the cluster tile (tests/gpu/test_fp8_gemm_gated.py -k pingpong128x128c2)
#   dsv3   the block-128 DeepSeek-V3 bench at 4096 tokens with the scaled_grouped_mm peer (the bf16 copy dropped
#          after setup; it ran out of memory on 80 GB before)
# Run from the repository root as .device_carry/s31/run.sh PHASE...; results in $OUT/s31.tar.xz.
set -u
C=$PWD/.device_carry/s31
R=/tmp/s31r; mkdir -p $R /tmp/libs
[ -d /tmp/libs/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
P1=wgmma:pingpong128x128:plain:evict_last
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = gemms ]; then
    timeout 200 python3 $C/tiles_vs_cublas.py $R/gemms.json > $R/gemms.log 2>&1; echo "gemms rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = steps ]; then
    (cd bench && LAYER_STEPS_SHAPES=${STEPS_SHAPES:-mixtral-8x7b,gpt-oss-20b,deepseek-v2-lite} LAYER_STEPS_TOKENS=4096 \
      LAYER_STEPS_QUANTS=bf16,fp8,fp8_static timeout 200 python3 layer_steps_probe.py $R/steps.json > $R/steps.log 2>&1)
    echo "steps rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = tiles ]; then
    for shape in ${TILE_SHAPES:-mixtral-8x7b gpt-oss-20b}; do
      V="ours,ours:gemm1_tactic=wgmma:coop128x256:plain:evict_last,ours:gemm2_tactic=wgmma:coop128x256:plain:evict_last"
      V="$V,ours:gemm1_tactic=wgmma:pingpong128x128c2:plain:evict_last,ours:gemm2_tactic=wgmma:coop128x192:plain:evict_last"
      V="$V,ours:gemm2_tactic=$P1,ours_bf16"
      timeout 240 python3 -m moe_build bench --quant fp8_static,fp8 --shapes $shape --tokens 4096 --variants "$V" \
        --iters 5 --input-sets 2 --json $R/tiles_$shape.json > $R/tiles_$shape.log 2>&1
      echo "tiles $shape rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = c2 ]; then
    for pt in "mixtral-8x7b 1024,2048,4096,8192" "gpt-oss-20b 2048,4096,8192" "deepseek-v2-lite 3072,4096,8192" \
              "qwen3-30b-a3b 4096,8192" "deepseek-v3 1280,2048,4096"; do
      set -- $pt
      timeout 200 python3 -m moe_build bench --quant fp8,fp8_static --shapes $1 --tokens $2 \
        --variants "ours,ours:gemm1_tactic=wgmma:pingpong128x128c2:plain:evict_last,ours_bf16" --iters 5 --input-sets 2 \
        --json $R/c2_$1_r${ROUND:-1}.json > $R/c2_$1_r${ROUND:-1}.log 2>&1
      echo "c2 $1 r${ROUND:-1} rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = c2b ]; then
    for pt in "mixtral-8x7b 2048,4096" "gpt-oss-20b 4096" "deepseek-v2-lite 4096" "qwen3-30b-a3b 4096" "deepseek-v3 4096"; do
      set -- $pt
      timeout 200 python3 -m moe_build bench --quant fp8,fp8_static --shapes $1 --tokens $2 \
        --variants "ours,ours:gemm1_tactic=wgmma:pingpong128x128:plain:evict_last,ours_bf16" --iters 5 --input-sets 2 \
        --json $R/c2b_$1_r${ROUND:-1}.json > $R/c2b_$1_r${ROUND:-1}.log 2>&1
      echo "c2b $1 r${ROUND:-1} rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = gtest ]; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_gemm_gated_quantized.py \
      -k "pingpong128x128c2 or runner" > $R/gtest.log 2>&1; echo "gtest rc=$?" | tee -a $R/phases.txt; tail -3 $R/gtest.log
  elif [ "$ph" = dsv3 ]; then
    timeout 300 python3 -m moe_build bench --quant fp8_block --shapes deepseek-v3 --tokens ${DSV3_TOKENS:-4096} \
      --variants ours,ours_bf16,scaled_grouped_mm --iters 5 --input-sets 2 --json $R/dsv3.json > $R/dsv3.log 2>&1
    echo "dsv3 rc=$?" | tee -a $R/phases.txt; nvidia-smi --query-gpu=memory.used --format=csv >> $R/phases.txt
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s31.tar.xz -C $R .
done
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/c2*_*.json")):
    for p in json.load(open(f))["points"]:
        v = p["variants"]; us = {k: e.get("graph_us") for k, e in v.items()}
        o, b = us.get("ours"), us.get("ours_bf16")
        c = us.get("ours:gemm1_tactic=wgmma:pingpong128x128c2:plain:evict_last") or us.get("ours:gemm1_tactic=wgmma:pingpong128x128:plain:evict_last")
        f2 = lambda x: f"{x:8.1f}" if x else "       -"
        print(f"{f.split('/')[-1][:3]} {p['quant']:10s} {p['shape']:17s} {p['tokens']:5d} plan {f2(o)} forced {f2(c)} bf16 {f2(b)}  "
              f"forced/plan {c / o if o and c else 0:.3f}  bf16/plan {b / o if o and b else 0:.2f}  bf16/c2 {b / c if c and b else 0:.2f}")
PY
cat $R/gemms.log 2>/dev/null
grep -E "GEMM|gemm|quantize|activation|expand|finalize|replay|total" $R/steps.log 2>/dev/null | cut -c1-150 | head -60
[ -f $R/dsv3.log ] && grep -B2 -A6 "^quant " $R/dsv3.log | cut -c1-200
for f in $R/tiles_*.log; do [ -f $f ] && { echo "== $f"; grep -A12 "^quant " $f | cut -c1-200; }; done
