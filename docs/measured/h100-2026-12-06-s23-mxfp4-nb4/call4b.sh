#!/usr/bin/env bash
# s23 call 4b (one GPU, the machine of call 4): call 2's A/B at 1 token (main's library against nb4's), two rounds.
C=.device_carry/s23
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p $OUT/r
timeout 280 python3 bench/lib_ab.py --libs main=/tmp/lib_main/libmoe_build_kernels.so,nb4=/tmp/lib_nb4/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab --timeout 65 -- --quant wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1 \
  --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err
tar cJf $OUT/r.tar.xz -C $OUT r
