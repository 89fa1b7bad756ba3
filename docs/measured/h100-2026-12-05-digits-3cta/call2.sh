# s18 call 2: head against lean (the digits tile's zero points packed, row g + 8's pointers derived) on W4A16 layers
source .device_carry/s17/go.sh
rm -f /tmp/d3b -r; mkdir -p $OUT/r
H=/tmp/head/libmoe_build_kernels.so; LEAN=/tmp/lean/libmoe_build_kernels.so
t0=$SECONDS; timeout 400 python3 bench/lib_ab.py --libs head=$H,lean=$LEAN --rounds 2 --out $OUT/r/ab2 -- --quant w4a16_awq,w4afp8 \
  --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b --tokens 1,16,32 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab2.log 2>&1; echo "ab2 rc=$? $((SECONDS-t0))s"
tar czf $OUT/results2.tgz -C $OUT/r ab2 ab2.log; rm -rf $OUT/r/ab2
tail -20 $OUT/r/ab2.log | cut -c1-220
