#!/usr/bin/env bash
# s24 calls 4b, 4c, 4d (one GPU, the same warm machine right after call4.sh, which had extracted lib_early and lib_trig
# to /tmp; call4's layer runs had stopped at their 80 s limit): lib_ab, lib_early (main's f7f4c4d) against lib_trig
# (the digits activation letting GEMM2 start before its wait), each run as below with its own --out.
set -u
LE=/tmp/lib_early/libmoe_build_kernels.so; LT=/tmp/lib_trig/libmoe_build_kernels.so
# 4b: three shapes, four weight-only modes, 1 and 16 tokens, two rounds
python3 bench/lib_ab.py --libs early=$LE,trig=$LT --rounds 2 --out $OUT/r/ab --timeout 140 -- \
  --quant w4a16_awq,w8a16,wfp4a16,w4afp8 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 \
  --variants ours --iters 10 --input-sets 2
# 4c: Mixtral-8x7B and GPT-OSS-20B, W4A16 and WFP4A16, 1 and 4 tokens, two rounds
python3 bench/lib_ab.py --libs early=$LE,trig=$LT --rounds 2 --out $OUT/r/ab --timeout 60 -- \
  --quant w4a16_awq,wfp4a16 --shapes mixtral-8x7b,gpt-oss-20b --tokens 1,4 --variants ours --iters 10 --input-sets 2
# 4d: GPT-OSS-20B at 1 token, W4A16 and W8A16 (both at their targets' lines), three rounds
python3 bench/lib_ab.py --libs early=$LE,trig=$LT --rounds 3 --out $OUT/r/ab --timeout 30 -- \
  --quant w4a16_awq,w8a16 --shapes gpt-oss-20b --tokens 1 --variants ours --iters 10 --input-sets 2
