#!/usr/bin/env bash
# s24 call 4 (one GPU): the digits activation letting GEMM2 start before it waits for GEMM1 (branch
# s24-activation-trigger-first, lib_trig) against main's f7f4c4d library (lib_early): its GPU tests (the digits
# activation, the weight-only and W4AFP8 runners on the digits tile), then W4A16, W8A16, WFP4A16 and W4AFP8 layers
# at 1 and 16 tokens on the four bench shapes, two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s24
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs4.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LE=/tmp/lib_early/libmoe_build_kernels.so; LT=/tmp/lib_trig/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LT timeout 110 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_token_digits.py tests/gpu/test_runner_woq.py tests/gpu/test_runner_w4afp8.py -k "digits" \
  --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
grep -h "FAILED\|Error" $OUT/r/t_*.log | head -5
t0=$SECONDS; timeout 330 python3 bench/lib_ab.py --libs early=$LE,trig=$LT --rounds 2 --out $OUT/r/ab --timeout 80 -- \
  --quant w4a16_awq,w8a16,wfp4a16,w4afp8 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1,16 \
  --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"
tail -2 $OUT/r/ab.err
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/ab.txt
