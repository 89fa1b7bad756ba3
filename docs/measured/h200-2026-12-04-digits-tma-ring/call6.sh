# s10 call 6 (H200): the ring with four-group slots laid out after each CTA's own rows (branch
# digits-tma-ring-experiment), so that it runs where the host's bound on a chunk's rows is 8: which kernel runs,
# its tests, the GEMMs alone per library, the W4A16 layers side by side.
source .device_carry/s10/go.sh
mkdir -p $OUT/r
R=/tmp/ring4b/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$R timeout 60 ncu --clock-control none -k regex:woq_decode_digits --launch-skip 2 -c 1 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 docs/measured/h200-2026-12-01-digits-wait/ncu_one.py digits qwen3_g1 16 1 > $OUT/r/ncu_kernel_ring4b.txt 2>&1; grep -E "woq_decode|duration|dram" $OUT/r/ncu_kernel_ring4b.txt | cut -c1-120
MOE_BUILD_KERNELS_LIB=$R timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_ring4b.log 2>&1; echo "gpu ring4b rc=$?"; tail -2 $OUT/r/gpu_ring4b.log | cut -c1-300
for L in head ring4b; do mkdir -p $OUT/r/probe_$L
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_GEMMS=mixtral_g1,qwen3_g1,qwen3_g2,dsv2_g1,dsv2_g2 OUT=$OUT/r/probe_$L \
    timeout 80 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$?"
done
timeout 150 python3 bench/lib_ab.py --libs head=/tmp/head/libmoe_build_kernels.so,ring4b=$R \
  --rounds 2 --out $OUT/r/ab -- --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.log 2>&1; echo "ab rc=$?"
tar czf $OUT/results.tgz -C $OUT r
for L in head ring4b; do echo "== $L"; grep -v "^{" $OUT/r/probe_$L.log | head -12 | cut -c1-20,60-80; done
tail -5 $OUT/r/ab.log | cut -c1-200
