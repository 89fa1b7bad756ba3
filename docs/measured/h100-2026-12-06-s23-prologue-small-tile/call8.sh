#!/usr/bin/env bash
# s23 call 8 (one GPU): the three-step prologue's scatter block sized to the rows below 1024 (one tile of the next
# power of two times 32 rows, the warps it fills; branch s23-prologue-small-tile, lib_small) against HEAD's library
# (lib_head, bb12619): the prologue GPU tests, then WFP4A16 layers (three-step prologue) at 1 / 4 / 16 / 64 tokens,
# lib_ab two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s23
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs8.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LH=/tmp/lib_head/libmoe_build_kernels.so; LS=/tmp/lib_small/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
cp $C/test_stage_kernels.py tests/gpu/test_stage_kernels.py
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LS timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_stage_kernels.py \
  -k "three_step or prologue" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
t0=$SECONDS; timeout 150 python3 bench/lib_ab.py --libs head=$LH,small=$LS --rounds 2 --out $OUT/r/ab --timeout 36 -- \
  --quant wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4,16,64 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab.err
cat $OUT/r/ab.txt
tar cJf $OUT/r.tar.xz -C $OUT r
