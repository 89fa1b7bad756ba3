#!/usr/bin/env bash
# s23 call 8b (one GPU, the machine of call 8, whose bench ran past its 36 s a run): the A/B on two layers at
# 1 / 4 / 64 tokens, two rounds.
C=.device_carry/s23
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs8.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p $OUT/r
timeout 150 python3 bench/lib_ab.py --libs head=/tmp/lib_head/libmoe_build_kernels.so,small=/tmp/lib_small/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab --timeout 37 -- --quant wfp4a16 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4,64 \
  --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err
tar cJf $OUT/r.tar.xz -C $OUT r
