#!/usr/bin/env bash
# s24 call 1 (one GPU): the digits expansion reading its first group before its wait (branch
# s23-digits-expand-early, library lib_early; main's 6108f98 library lib_main), as the FP8 expansion does: first its
# GPU tests (the expansion kernels, the weight-only runner on the digits tile), then W4A16 and WFP4A16 layers at
# 1 / 4 / 16 tokens, lib_ab two rounds. The branch's tree carries its header comment (the contract), which the
# bench does not read: main's tree runs both libraries.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s24
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LE=/tmp/lib_early/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LE timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_token_digits.py \
  tests/gpu/test_runner_woq.py -k "digits or expand" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
t0=$SECONDS; timeout 400 python3 bench/lib_ab.py --libs main=$LM,early=$LE --rounds 2 --out $OUT/r/ab --timeout 95 -- \
  --quant w4a16_awq,wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4,16 --variants ours --iters 10 \
  --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab.err
cat $OUT/r/ab.txt
tar cJf $OUT/r.tar.xz -C $OUT r
