#!/usr/bin/env bash
# s28 call 2 (one GPU), main's library (013b41b's kernels): (B) FP8 block-128 at 1 / 16 / 256 tokens, the five FP8
# bench shapes (its floor misses on 2026-12-05); W4AFP8 (static) at 4096 tokens on Mixtral-8x7B and DeepSeek-V2-Lite
# beside our bf16 layer; (AB) the staged int4 decode kernel's big batches at group 64 in pairs of 2 (branch
# s28-g64-pairs) against main's 3 a wait: GPT-OSS-20B W4A16 at 24-64 tokens (the staged band there), two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s28
mkdir -p "$OUT/r" /tmp/libs
for t in lib_main lib_g64; do
  [ -f $C/$t.tar.xz ] && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/$t.tar.xz /tmp/libs
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD
LM=/tmp/libs/lib_main/libmoe_build_kernels.so; LG=/tmp/libs/lib_g64/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv; cat $OUT/r/gpu.csv
t0=$SECONDS
MOE_BUILD_KERNELS_LIB=$LM timeout 200 python3 -m moe_build bench --quant fp8_block --tokens 1,16,256 --variants ours \
  --iters 5 --input-sets 2 --json $OUT/r/bench_fp8_block.json > $OUT/r/bench_fp8_block.log 2>&1
echo "fp8_block rc=$? $((SECONDS-t0))s"; t0=$SECONDS
MOE_BUILD_KERNELS_LIB=$LM timeout 150 python3 -m moe_build bench --quant w4afp8,w4a16_awq --shapes mixtral-8x7b,deepseek-v2-lite \
  --tokens 4096 --variants ours,ours_bf16 --iters 5 --input-sets 2 --json $OUT/r/bench_w4afp8.json > $OUT/r/bench_w4afp8.log 2>&1
echo "w4afp8 rc=$? $((SECONDS-t0))s"; t0=$SECONDS
tar cJf $OUT/r.tar.xz -C $OUT r
if [ -f $LG ]; then
  timeout 150 python3 bench/lib_ab.py --libs main=$LM,g64=$LG --rounds 2 --out $OUT/r/ab --timeout 36 -- \
    --quant w4a16_awq --shapes gpt-oss-20b --tokens 24,32,48,64 --variants ours --iters 10 --input-sets 2 \
    > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/ab.err
fi
tar cJf $OUT/r.tar.xz -C $OUT r
grep -A30 "^quant " $OUT/r/bench_fp8_block.log | cut -c1-180
grep -A12 "^quant " $OUT/r/bench_w4afp8.log | cut -c1-180
cat $OUT/r/ab.txt 2>/dev/null
