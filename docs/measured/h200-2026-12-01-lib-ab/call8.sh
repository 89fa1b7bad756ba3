# s20 call 8: bench/lib_ab.py's first run (HEAD's library against the chunk-bound experiment's).
python bench/lib_ab.py --libs main=/tmp/main/libmoe_build_kernels.so,bound=/tmp/new/libmoe_build_kernels.so --rounds 2 \
  --out $OUT/ab -- --quant w4a16_awq --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 1,16 --variants ours,ours:finalize=separate --iters 10
echo "rc=$?"; ls $OUT/ab
