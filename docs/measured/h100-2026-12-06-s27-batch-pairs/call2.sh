#!/usr/bin/env bash
# s27 call 2 (one GPU, the same warm machine right after call 1, whose libraries it reuses from /tmp): lib_s27f against
# main's library on the staged tile's W4A16 points, and the digits tile's at 4 tokens, bench/lib_ab.py, two rounds.
cd .device_carry/s27 && LM=/tmp/lib_s26/libmoe_build_kernels.so LC=/tmp/lib_s27f/libmoe_build_kernels.so; cd ../.. ; mkdir -p $OUT/r2; timeout 215 python3 bench/lib_ab.py --libs main=$LM,pairs=$LC --rounds 2 --out $OUT/r2/ab --timeout 52 -- --quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,gpt-oss-20b --tokens 4,32,64 --variants ours --iters 10 --input-sets 2 > $OUT/r2/ab.txt 2> $OUT/r2/ab.err; echo rc=$?; tar cJf $OUT/r2.tar.xz -C $OUT r2; cat $OUT/r2/ab.txt; tail -2 $OUT/r2/ab.err
