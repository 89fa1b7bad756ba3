#!/usr/bin/env bash
# s36 (one H100): the FP8 row steps' kernels as plan data (step tactics). main.tar.xz: main's library (e96cffc),
# main_tree.tar.xz: main's Python (its ABI has no tactic argument); new.tar.xz: this change's library. Phases:
#   tests  the GPU tests of the changed entry points and their callers, new library, 4 shards side by side
#   alltests  every combination of the FP8 quantization tests' parameters (tests/gpu/test_fp8_quantize.py)
#   ab     main's library and tree against the new ones on whole layers where the plan's kernels are main's
#   ab2    ab's two points furthest from 1 (Mixtral-8x7B block-128 at 1 token, rowwise at 4096), two rounds
#   c4test the weight-only GEMM tests with the stagedc4 tile (K split over a cluster of four CTAs); NEWDIR=c4
#   c4bench Mixtral-8x7B's W4A16 / W4AFP8 layers with GEMM2 forced onto stagedc4 beside the plan
#   c4plan the plan with stagedc4: the weight-only and W4AFP8 runner tests, Mixtral-8x7B's 1 / 16-token points
#   band   the new plan against the warp kernel forced, where the rule's warp threshold moved (16-24 -> 32 rows an SM)
# Run from the repository root as .device_carry/s36/run.sh PHASE...; results in $OUT/s36.tar.xz.
set -u
C=$PWD/.device_carry/s36
R=/tmp/s36r; mkdir -p $R /tmp/libs36
x() { python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" "$@"; }
[ -d /tmp/libs36/lib ] || x $C/main.tar.xz /tmp/libs36
[ -d /tmp/libs36/main_tree ] || x $C/main_tree.tar.xz /tmp/libs36
[ -d /tmp/libs36/${NEWDIR:-new} ] || x $C/${NEWDIR:-new}.tar.xz /tmp/libs36
MAIN=/tmp/libs36/lib/libmoe_build_kernels.so NEW=/tmp/libs36/${NEWDIR:-new}/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e /tmp/libs36/main_tree/moe_build/plugins ] || ln -s ../plugins /tmp/libs36/main_tree/moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=$NEW
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = tests ]; then
    T="tests/gpu/test_fp8_quantize.py tests/gpu/test_runner_fp8.py tests/gpu/test_runner_w4afp8.py"
    T="$T tests/gpu/test_token_digits.py tests/gpu/test_woq_wgmma_gated.py"
    for i in 0 1 2 3; do
      timeout ${TEST_S:-420} python3 -m pytest -q -p no:cacheprovider --shard $i/4 $T > $R/tests_$i.log 2>&1 &
    done
    wait
    for i in 0 1 2 3; do echo "tests $i: $(tail -n 1 $R/tests_$i.log)" | tee -a $R/phases.txt; done
  elif [ "$ph" = alltests ]; then  # every combination of the step kernels' tests
    for i in 0 1 2 3; do
      timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --gpu-cases=all --shard $i/4 \
        tests/gpu/test_fp8_quantize.py > $R/alltests_$i.log 2>&1 &
    done
    wait
    for i in 0 1 2 3; do echo "alltests $i: $(tail -n 1 $R/alltests_$i.log)" | tee -a $R/phases.txt; done
  elif [ "$ph" = ab ]; then
    PYTHONPATH= timeout 300 python3 bench/lib_ab.py --libs main=$MAIN@/tmp/libs36/main_tree,new=$NEW --rounds 1 --out $R/ab_block \
      -- --quant fp8_block --shapes mixtral-8x7b,deepseek-v3,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,256 \
      --variants ours --iters 5 --input-sets 2 > $R/ab_block.txt 2>&1; echo "ab block rc=$?" | tee -a $R/phases.txt
    PYTHONPATH= timeout 200 python3 bench/lib_ab.py --libs main=$MAIN@/tmp/libs36/main_tree,new=$NEW --rounds 1 --out $R/ab_row \
      -- --quant fp8 --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 4096 \
      --variants ours --iters 5 --input-sets 2 > $R/ab_row.txt 2>&1; echo "ab row rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = ab2 ]; then  # the two points of ab furthest from 1, again, two rounds alternated
    PYTHONPATH= timeout 250 python3 bench/lib_ab.py --libs main=$MAIN@/tmp/libs36/main_tree,new=$NEW --rounds 2 \
      --out $R/ab2_block -- --quant fp8_block --shapes mixtral-8x7b --tokens 1 --variants ours --iters 5 \
      --input-sets 2 > $R/ab2_block.txt 2>&1; echo "ab2 block rc=$?" | tee -a $R/phases.txt
    PYTHONPATH= timeout 300 python3 bench/lib_ab.py --libs main=$MAIN@/tmp/libs36/main_tree,new=$NEW --rounds 2 \
      --out $R/ab2_row -- --quant fp8 --shapes mixtral-8x7b --tokens 4096 --variants ours --iters 5 \
      --input-sets 2 > $R/ab2_row.txt 2>&1; echo "ab2 row rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = c4test ]; then  # the weight-only GEMM tests (every tile, stagedc4 among them), 4 shards
    for i in 0 1 2 3; do
      timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --shard $i/4 tests/gpu/test_woq_gemm.py \
        > $R/c4test_$i.log 2>&1 &
    done
    wait
    for i in 0 1 2 3; do echo "c4test $i: $(tail -n 1 $R/c4test_$i.log)" | tee -a $R/phases.txt; done
  elif [ "$ph" = c4bench ]; then  # Mixtral-8x7B's GEMM2 on the staged kernel in clusters of four, against the plan
    V="ours,ours:gemm2_tactic=decode:stagedc4_ksplit1:after_trigger:plain"
    for q in w4a16_awq w4afp8; do
      timeout 200 python3 -m moe_build bench --quant $q --shapes mixtral-8x7b --tokens ${C4_TOKENS:-2,4,8,16,32} \
        --variants "$V" --iters 5 --input-sets 2 --json $R/c4bench_${q}_r${ROUND:-1}.json \
        > $R/c4bench_${q}_r${ROUND:-1}.log 2>&1; echo "c4bench $q rc=$?" | tee -a $R/phases.txt
    done
  elif [ "$ph" = c4plan ]; then  # the plan with stagedc4 (GEMM2 of Mixtral-8x7B at 2-32 tokens): runner tests, bench
    T="tests/gpu/test_runner_woq.py tests/gpu/test_runner_w4afp8.py"
    for i in 0 1 2 3; do
      timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --shard $i/4 $T > $R/c4plan_$i.log 2>&1 &
    done
    wait
    for i in 0 1 2 3; do echo "c4plan $i: $(tail -n 1 $R/c4plan_$i.log)" | tee -a $R/phases.txt; done
    timeout 200 python3 -m moe_build bench --quant w4a16_awq,w4afp8 --shapes mixtral-8x7b --tokens 1,16 \
      --variants ours --iters 5 --input-sets 2 --json $R/c4plan_bench.json > $R/c4plan_bench.log 2>&1
    echo "c4plan bench rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = band ]; then
    timeout 150 python3 -m moe_build bench --quant fp8 --shapes gpt-oss-20b,deepseek-v3 --tokens 448,640,896 \
      --variants "ours,ours:fc2_input_quant_tactic=warp_rows" --iters 5 --input-sets 2 --json $R/band_row.json \
      > $R/band_row.log 2>&1; echo "band row rc=$?" | tee -a $R/phases.txt
    timeout 120 python3 -m moe_build bench --quant fp8_block --shapes deepseek-v2-lite --tokens 576,640 \
      --variants "ours,ours:fc1_activation_tactic=warp_rows" --iters 5 --input-sets 2 --json $R/band_dsv2.json \
      > $R/band_dsv2.log 2>&1; echo "band dsv2 rc=$?" | tee -a $R/phases.txt
    timeout 150 python3 -m moe_build bench --quant fp8_block --shapes deepseek-v3,qwen3-30b-a3b --tokens 300,448 \
      --variants "ours,ours:fc2_input_quant_tactic=warp_rows" --iters 5 --input-sets 2 --json $R/band_q.json \
      > $R/band_q.log 2>&1; echo "band q rc=$?" | tee -a $R/phases.txt
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s36.tar.xz -C $R .
done
