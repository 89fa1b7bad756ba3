#!/usr/bin/env bash
# s37 (one H100): int4 codes in 16-row tiles (weight_layout=int4_tiles). lib.tar.xz: this change's library. Phases:
#   probe    bench/int4_layout_probe.cu (the decode loop on rows and on tiles)
#   gemmtest tests/gpu/test_woq_gemm.py (every int4 kernel on both forms; pairs), 4 shards
#   runtest  the weight-only and W4AFP8 runner tests (the plan's tiles at decode-sized runners), 4 shards
#   bench    W4A16 / W4AFP8, four shapes, 1-32 tokens: the plan (tiles) beside weight_layout=row_major, one process
# Run from the repository root as .device_carry/s37/run.sh PHASE...; results under $OUT/r.
set -u
C=$PWD/.device_carry/s37
R=$OUT/r; mkdir -p $R /tmp/l37
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/l37
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=$(ls /tmp/l37/*/libmoe_build_kernels.so | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-540} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = probe ]; then
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/int4_layout_probe.cu -o /tmp/probe && \
      /tmp/probe > $R/layout_probe.txt 2>&1; echo "probe rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = gemmtest ] || [ "$ph" = runtest ]; then
    T="tests/gpu/test_woq_gemm.py"
    [ "$ph" = runtest ] && T="tests/gpu/test_runner_woq.py tests/gpu/test_runner_w4afp8.py tests/gpu/test_plugin_enqueue.py"
    for i in 0 1 2 3; do
      timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider --shard $i/4 $T > $R/${ph}_$i.log 2>&1 &
    done
    wait
    for i in 0 1 2 3; do echo "$ph $i: $(tail -n 1 $R/${ph}_$i.log)" | tee -a $R/phases.txt; done
  elif [ "$ph" = bench ]; then
    for q in ${QUANTS:-w4a16_awq w4afp8}; do
      timeout 240 python3 -m moe_build bench --quant $q --shapes ${SHAPES:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b} \
        --tokens ${TOKENS:-1,2,4,8,16,32} --variants "${VARIANTS:-ours,ours:weight_layout=row_major}" --iters 5 --input-sets 2 \
        --json $R/bench_${q}_r${ROUND:-1}.json > $R/bench_${q}_r${ROUND:-1}.log 2>&1
      echo "bench $q rc=$?" | tee -a $R/phases.txt
    done
  fi
  echo "$ph $((SECONDS - t0))s" | tee -a $R/phases.txt
done
cd $OUT && tar cJf s37.tar.xz r && rm -rf r
