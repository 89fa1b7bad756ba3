#!/usr/bin/env bash
# s25 call 1 (one GPU). (A) main's library (lib_main: the digits expansion's early reads and the digits activation
# letting GEMM2 start first, landed in s24 with part of their GPU tests run): the whole weight-only runner suite and
# W4AFP8's digits cases. (B) branch s24-scan-scatter-early (lib_scan: the three-step scatter zeroes its counters and
# reads its first round of ids before its wait): the three-step prologue's kernel and runner tests, then WFP4A16 layers
# (the three-step prologue's users) at 1 / 4 / 16 / 256 tokens on the four bench shapes, main against it, two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s25
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LS=/tmp/lib_scan/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LM timeout 150 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_runner_woq.py --shard=$p/8 > $OUT/r/ta_$p.log 2>&1 & done; wait
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LM timeout 70 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_runner_w4afp8.py -k digits --shard=$p/8 > $OUT/r/tw_$p.log 2>&1 & done; wait
echo "tests A $((SECONDS-t0))s"; for f in $OUT/r/ta_*.log $OUT/r/tw_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LS timeout 90 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_stage_kernels.py tests/gpu/test_runner.py tests/gpu/test_runner_woq.py -k "three_step or wfp4a16" \
  --shard=$p/8 > $OUT/r/tb_$p.log 2>&1 & done; wait
echo "tests B $((SECONDS-t0))s"; for f in $OUT/r/tb_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
grep -h "FAILED\|Error" $OUT/r/t*.log | head -5
tar cJf $OUT/r.tar.xz -C $OUT r
t0=$SECONDS; timeout 260 python3 bench/lib_ab.py --libs main=$LM,scan=$LS --rounds 2 --out $OUT/r/ab --timeout 140 -- \
  --quant wfp4a16 --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b --tokens 1,4,16,256 --variants ours \
  --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab.err
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/ab.txt
