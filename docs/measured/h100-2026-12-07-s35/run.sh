#!/usr/bin/env bash
# s35 (one H100): main's library (lib.tar.xz beside this script). Phases by argument:
#   tl     kernel timelines (bench/layer_timeline_probe.py) at the 1-token misses: GPT-OSS-20B in fp8, fp8_block,
#          w4a16_awq; Mixtral-8x7B and DeepSeek-V3 in fp8_block; W4A16 at 16 tokens (GPT-OSS-20B, Mixtral-8x7B)
#   b1     moe-build bench at 1 token, the three FP8 scalings of GPT-OSS-20B in one process, twice
# Run from the repository root as .device_carry/s35/run.sh PHASE...; results in $OUT/s35.tar.xz.
set -u
C=$PWD/.device_carry/s35
R=/tmp/s35r; mkdir -p $R /tmp/libs35
[ -d /tmp/libs35/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs35
[ -d /tmp/libs35/newlib2 ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/new.tar.xz /tmp/libs35
MAIN=/tmp/libs35/lib/libmoe_build_kernels.so NEW=/tmp/libs35/newlib2/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=${LIB:-$MAIN}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
RD=r${ROUND:-1}
SWEEP_TOKENS=${SWEEP_TOKENS:-1,2,3,4,6,8,12,16,24,32,48,64,96,128,192,256}
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = tl ]; then
    for q in "fp8 gpt-oss-20b:1" "fp8_block gpt-oss-20b:1,mixtral-8x7b:1,deepseek-v3:1" \
             "w4a16_awq gpt-oss-20b:1,gpt-oss-20b:16,mixtral-8x7b:16"; do
      set -- $q
      LAYER_TIMELINE_QUANT=$1 LAYER_TIMELINE_POINTS=$2 timeout 120 python3 bench/layer_timeline_probe.py \
        $R/tl_$1_$RD.json > $R/tl_$1_$RD.log 2>&1; echo "tl $1 rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = gtest ]; then  # the activation kernels' tests and the runners that take the group-item kernel
    MOE_BUILD_KERNELS_LIB=$NEW timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantize.py \
      -k "fc1_activation" > $R/gtest_act.log 2>&1; echo "gtest act rc=$?" | tee -a $R/phases.txt; tail -2 $R/gtest_act.log
    MOE_BUILD_KERNELS_LIB=$NEW timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_fp8.py \
      tests/gpu/test_runner_w4afp8.py -k "block128 or static" > $R/gtest_run.log 2>&1
    echo "gtest run rc=$?" | tee -a $R/phases.txt; tail -2 $R/gtest_run.log
  elif [ "$ph" = ab ]; then  # main's library against the group-item kernel's, decode token counts
    timeout 330 python3 bench/lib_ab.py --libs main=$MAIN,new=$NEW --rounds 2 --out $R/ab_block -- --quant fp8_block \
      --shapes mixtral-8x7b,deepseek-v3,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,4,16 --variants ours \
      --iters 5 --input-sets 2 > $R/ab_block.txt 2>&1; echo "ab rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = tlnew ]; then
    MOE_BUILD_KERNELS_LIB=$NEW LAYER_TIMELINE_QUANT=fp8_block LAYER_TIMELINE_POINTS=mixtral-8x7b:1,deepseek-v3:1,qwen3-30b-a3b:16 \
      timeout 100 python3 bench/layer_timeline_probe.py $R/tlnew.json > $R/tlnew.log 2>&1; echo "tlnew rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = acttest ]; then  # the final library's activation tests (every case of the decode-rows test)
    MOE_BUILD_KERNELS_LIB=$NEW timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantize.py \
      -k "fc1_activation" > $R/acttest.log 2>&1; echo "acttest rc=$?" | tee -a $R/phases.txt; tail -n 2 $R/acttest.log
    MOE_BUILD_KERNELS_LIB=$NEW timeout 100 python3 -m pytest -q -p no:cacheprovider --gpu-cases=all \
      tests/gpu/test_fp8_quantize.py -k "decode_rows" > $R/acttest_all.log 2>&1
    echo "acttest_all rc=$?" | tee -a $R/phases.txt; tail -n 2 $R/acttest_all.log
  elif [ "$ph" = sweep ]; then  # the plan over 1-256 tokens (issue 46's floor range), both dynamic scalings
    for q in ${SWEEP_QUANTS:-fp8_block}; do
      MOE_BUILD_KERNELS_LIB=$NEW timeout 260 python3 -m moe_build bench --quant $q --tokens $SWEEP_TOKENS \
        --variants ours --iters 5 --input-sets 2 --json $R/sweep_$q.json > $R/sweep_$q.log 2>&1
      echo "sweep $q rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = gforce ]; then  # GPT-OSS-20B's block-128 layer at 2-12 tokens, other decode forms forced beside the plan
    V="ours,ours:gemm1_tactic=decode:ksplit1:after_trigger:plain,ours:gemm1_tactic=decode:twocta_ksplit2:after_trigger:plain"
    V="$V,ours:gemm2_tactic=decode:ksplit1:after_trigger:plain,ours:fc1_activation=gated_epilogue+fc2_input_quant=gemm2"
    MOE_BUILD_KERNELS_LIB=$NEW timeout 150 python3 -m moe_build bench --quant fp8_block --shapes gpt-oss-20b \
      --tokens 2,3,4,8,12 --variants "$V" --iters 5 --input-sets 2 --json $R/gforce.json > $R/gforce.log 2>&1
    echo "gforce rc=$?" | tee -a $R/phases.txt
    MOE_BUILD_KERNELS_LIB=$NEW LAYER_TIMELINE_QUANT=fp8_block LAYER_TIMELINE_POINTS=gpt-oss-20b:3,gpt-oss-20b:8 \
      timeout 60 python3 bench/layer_timeline_probe.py $R/tl_gpt3.json > $R/tl_gpt3.log 2>&1
  elif [ "$ph" = final ]; then  # the final library: the FP8 quantization, FP8 and W4AFP8 runner tests (pairwise)
    MOE_BUILD_KERNELS_LIB=$NEW timeout 280 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantize.py \
      tests/gpu/test_runner_fp8.py tests/gpu/test_runner_w4afp8.py > $R/final.log 2>&1
    echo "final rc=$?" | tee -a $R/phases.txt; tail -n 3 $R/final.log
  elif [ "$ph" = ncu ]; then  # Nsight Compute on GPT-OSS-20B's block-128 decode GEMMs at 3 and 8 tokens
    for t in 3 8; do
      MOE_BUILD_KERNELS_LIB=$NEW timeout 120 ncu --profile-from-start off -k regex:fp8_decode_kernel --clock-control none \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats python3 $C/ncu_probe.py $t > $R/ncu_$t.txt 2>&1; echo "ncu $t rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = b1 ]; then
    for i in 1 2; do
      timeout 150 python3 -m moe_build bench --quant fp8,fp8_static,fp8_block --shapes gpt-oss-20b --tokens 1 \
        --variants ours --iters 5 --input-sets 2 --json $R/b1_${RD}_$i.json > $R/b1_${RD}_$i.log 2>&1
      echo "b1 $i rc=$?" | tee -a $R/phases.txt
    done
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s35.tar.xz -C $R .
done
python3 - $R <<'PY'
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/gforce.json"):
    for p in json.load(open(f))["points"]:
        print(p["tokens"], p["targets"]["floor"]["limit_us"], {k[5:45]: round(v.get("graph_us") or 0, 1) for k, v in p["variants"].items()})
for f in sorted(glob.glob(sys.argv[1] + "/b1_*.json") + glob.glob(sys.argv[1] + "/sweep_*.json")):
    for p in json.load(open(f))["points"]:
        o = p["variants"]["ours"].get("graph_us")
        if p['targets']['floor']['met'] and 'sweep' in f: continue
        print(f"{f[-9:]} {p['quant']:10s} {p.get('weight_scales','')} {p['shape']} {p['tokens']} ours {o or 0:7.1f} floor {p['floor_us']:6.1f} limit {p['targets']['floor']['limit_us']:6.1f}")
PY
