#!/usr/bin/env bash
# s38 (one H100): MXFP4's quarters form in 16-row tiles (codes and exponents). lib.tar.xz: old/ (HEAD eef927c's
# library) and new/ (this change's); old_tree.tar.xz: eef927c's moe_build (its quarters form in rows). Phases:
#   ab        bench/lib_ab.py: WFP4A16, four shapes, 1-32 tokens, old (its own tree) and new alternated, 2 rounds
#   gemmtest  tests/gpu/test_woq_gemm.py and test_token_digits.py, 4 shards
#   runtest   tests/gpu/test_runner_woq.py, and the plugin's enqueue on MXFP4, 4 shards
#   band      WFP4A16 GPT-OSS-20B / Mixtral-8x7B at 4-32 tokens: GEMM1 (and GEMM2) forced onto the digits tile
#   plan      WFP4A16, four shapes, 1 / 16 / 32 / 48 tokens: the plan beside both GEMMs forced onto the digits tile
#   timeline  bench/layer_timeline_probe.py: per-row W4AFP8 and W4A16 at 1 / 16 tokens (where per-row W4AFP8's time goes)
# Run from the repository root as .device_carry/s38/run.sh PHASE...; results under $OUT/r.
set -u
C=$PWD/.device_carry/s38
R=$OUT/r; mkdir -p $R /tmp/l38 /tmp/old38
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/l38
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/old_tree.tar.xz /tmp/old38
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e /tmp/old38/moe_build/plugins ] || ln -s ../plugins /tmp/old38/moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/l38/new/libmoe_build_kernels.so
for lib in old new; do  # fail fast: each library loads (build.json beside it)
  MOE_BUILD_KERNELS_LIB=/tmp/l38/$lib/libmoe_build_kernels.so python3 -c "from moe_build.kernels.library import load_library; load_library()" \
    || { echo "library $lib does not load"; exit 3; }
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = ab ]; then
    timeout 420 python3 bench/lib_ab.py --libs old=/tmp/l38/old/libmoe_build_kernels.so@/tmp/old38,new=/tmp/l38/new/libmoe_build_kernels.so \
      --rounds ${ROUNDS:-2} --out $R/ab -- --quant ${QUANT:-wfp4a16} --shapes ${SHAPES:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b} \
      --tokens ${TOKENS:-1,2,4,8,16,32} --variants ours --iters 5 --input-sets 2 > $R/ab.txt 2>&1
    echo "ab rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = gemmtest ] || [ "$ph" = runtest ]; then
    T="tests/gpu/test_woq_gemm.py tests/gpu/test_token_digits.py"; K=""
    [ "$ph" = runtest ] && T="tests/gpu/test_runner_woq.py tests/gpu/test_plugin_enqueue.py"
    for i in 0 1 2 3; do
      if [ "$ph" = runtest ]; then
        timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --shard $i/4 $T -k "${RUN_K:-mxfp4 or wfp4a16}" > $R/${ph}_$i.log 2>&1 &
      else
        timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --shard $i/4 $T > $R/${ph}_$i.log 2>&1 &
      fi
    done
    wait
    for i in 0 1 2 3; do echo "$ph $i: $(tail -n 1 $R/${ph}_$i.log)" | tee -a $R/phases.txt; done
  elif [ "$ph" = band ]; then  # the digits tile past MXFP4's band: both GEMMs (or GEMM1 alone) forced onto it
    D=decode:digits_ksplit1:after_trigger:plain
    timeout 200 python3 -m moe_build bench --quant wfp4a16 --shapes ${BAND_SHAPES:-gpt-oss-20b,mixtral-8x7b} --tokens ${BAND_TOKENS:-4,16,24,32} \
      --variants "ours,ours:gemm1_tactic=$D,ours:gemm1_tactic=$D+gemm2_tactic=$D" --iters 5 --input-sets 2 \
      --json $R/band.json > $R/band.log 2>&1
    echo "band rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = plan ]; then  # this change's plan (MXFP4's digits band) beside both GEMMs forced onto the tile
    D=decode:digits_ksplit1:after_trigger:plain
    timeout 300 python3 -m moe_build bench --quant wfp4a16 --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b \
      --tokens ${PLAN_TOKENS:-1,16,32,48} --variants "ours,ours:gemm1_tactic=$D+gemm2_tactic=$D" --iters 5 --input-sets 2 \
      --json $R/plan.json > $R/plan.log 2>&1
    echo "plan rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = timeline ]; then
    for q in w4afp8_dynamic w4a16_awq; do
      LAYER_TIMELINE_QUANT=$q LAYER_TIMELINE_POINTS=${POINTS:-mixtral-8x7b:1,gpt-oss-20b:1,gpt-oss-20b:16} \
        timeout 120 python3 bench/layer_timeline_probe.py $R/timeline_$q.json > $R/timeline_$q.txt 2>&1
      echo "timeline $q rc=$?" | tee -a $R/phases.txt
    done
  fi
  echo "$ph $((SECONDS - t0))s" | tee -a $R/phases.txt
done
[ -f $R/ab.txt ] && tail -n 30 $R/ab.txt
cd $OUT && tar cJf s38.tar.xz r && rm -rf r
