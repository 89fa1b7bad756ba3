#!/usr/bin/env bash
# s23 call 2 (one GPU): call 1's A/B (main's library against nb4's) on three many-expert WFP4A16 layers at 2-16 tokens,
# two rounds (call 1's bench over all four layers at 1-16 tokens ran past its 70 s a run).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s23
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LN=/tmp/lib_nb4/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS; timeout 480 python3 bench/lib_ab.py --libs main=$LM,nb4=$LN --rounds 2 --out $OUT/r/ab --timeout 115 -- \
  --quant wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 2,4,8,16 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/ab.err
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/ab.txt
