#!/usr/bin/env bash
# s29 call 3: the FP8 floor targets on the same warm H200 with main's plans (the call1.sh library: main's kernels plus
# the FP8 pingpong 64x256 tiles, which no plan takes), rowwise then block-128, at 1 / 16 / 256 tokens.
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
for q in fp8 fp8_block; do
  timeout 150 python3 -m moe_build bench --quant $q --tokens 1,16,256 --variants ours --iters 5 --input-sets 2 \
    --json $OUT/bench_$q.json > $OUT/bench_$q.log 2>&1
  echo "$q rc=$?"
done
