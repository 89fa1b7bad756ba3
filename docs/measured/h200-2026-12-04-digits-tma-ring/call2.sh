# s10 call 2 (H200): the ring with 4 groups a slot (boxes of 16 rows x 256 bytes, 4 KB slots), against head.
source .device_carry/s10/go.sh
mkdir -p $OUT/r
R=/tmp/ring4/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$R timeout 170 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_ring4.log 2>&1; echo "gpu ring4 rc=$?"; tail -2 $OUT/r/gpu_ring4.log | cut -c1-300
for L in head ring4; do mkdir -p $OUT/r/probe_$L
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,16,32 WOQ_DIGITS_GEMMS=mixtral_g1,qwen3_g1,qwen3_g2,dsv2_g1,dsv2_g2 OUT=$OUT/r/probe_$L \
    timeout 80 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$?"
done
timeout 120 python3 bench/lib_ab.py --libs head=/tmp/head/libmoe_build_kernels.so,ring4=$R \
  --rounds 2 --out $OUT/r/ab -- --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.log 2>&1; echo "ab rc=$?"
tar czf $OUT/results.tgz -C $OUT r
for L in head ring4; do echo "== $L"; tail -16 $OUT/r/probe_$L.log | cut -c1-50; done
tail -5 $OUT/r/ab.log | cut -c1-200
