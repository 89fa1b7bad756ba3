#!/usr/bin/env bash
# s23 call 7 (one GPU): the finalize kernel launched after a trigger (its launch and setup under GEMM2's tail; branch
# s23-finalize-pdl, library lib_pdl) against HEAD's library (lib_head): first the finalize GPU tests, then WFP4A16
# layers (three-step prologue, separate finalize) at 1 / 4 / 16 / 256 tokens, lib_ab two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s23
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs7.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LH=/tmp/lib_head/libmoe_build_kernels.so; LP=/tmp/lib_pdl/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LP timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_stage_kernels.py \
  tests/gpu/test_runner.py -k "finalize" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
t0=$SECONDS; timeout 260 python3 bench/lib_ab.py --libs head=$LH,pdl=$LP --rounds 2 --out $OUT/r/ab --timeout 60 -- \
  --quant wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4,16,256 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab.err
cat $OUT/r/ab.txt
tar cJf $OUT/r.tar.xz -C $OUT r
