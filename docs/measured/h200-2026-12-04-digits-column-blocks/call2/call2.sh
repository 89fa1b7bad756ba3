# s09 call 2 (H200): the digits tile at 2 or 4 column blocks a CTA, second form (the next block's first big batch
# requested before the block's store). GPU tests of the digits kernel on each build; the GEMMs alone
# (woq_digits_probe, K split 1) per library; W4A16 layers side by side (lib_ab).
source .device_carry/s09/go.sh
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for L in c2 c4; do
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_$L.log 2>&1; echo "gpu $L rc=$?"; tail -1 $OUT/r/gpu_$L.log
done
for L in head c2 c4; do mkdir -p $OUT/r/probe_$L
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,4,16,32 OUT=$OUT/r/probe_$L \
    timeout 100 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$?"
done
timeout 280 python3 bench/lib_ab.py --libs head=/tmp/head/libmoe_build_kernels.so,c2=/tmp/c2/libmoe_build_kernels.so,c4=/tmp/c4/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab -- --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16,32 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.log 2>&1; echo "ab rc=$?"
tar czf $OUT/results.tgz -C $OUT r
for L in head c2 c4; do echo "== $L"; tail -25 $OUT/r/probe_$L.log | cut -c1-160; done
cat $OUT/r/ab.log | tail -20 | cut -c1-200
