# s10 call 1 (H200): the digits tile's weights by TMA tensor copies into per-warp shared-memory rings (group 128).
# GPU tests of the digits kernel and runner on the ring build; the GEMMs alone per library; W4A16 layers side by side.
source .device_carry/s10/go.sh
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
R=/tmp/ring/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$R timeout 170 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_ring.log 2>&1; echo "gpu ring rc=$?"; tail -3 $OUT/r/gpu_ring.log | cut -c1-300
MOE_BUILD_KERNELS_LIB=$R timeout 90 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_runner_woq.py -k "digits or top_k" > $OUT/r/gpu_runner_ring.log 2>&1; echo "runner ring rc=$?"; tail -3 $OUT/r/gpu_runner_ring.log | cut -c1-300
for L in head ring; do mkdir -p $OUT/r/probe_$L
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,16,32 WOQ_DIGITS_GEMMS=mixtral_g1,qwen3_g1,qwen3_g2,dsv2_g1,dsv2_g2 OUT=$OUT/r/probe_$L \
    timeout 80 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$?"
done
timeout 200 python3 bench/lib_ab.py --libs head=/tmp/head/libmoe_build_kernels.so,ring=$R \
  --rounds 2 --out $OUT/r/ab -- --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1,16,32 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.log 2>&1; echo "ab rc=$?"
tar czf $OUT/results.tgz -C $OUT r
for L in head ring; do echo "== $L"; tail -22 $OUT/r/probe_$L.log | cut -c1-170; done
tail -16 $OUT/r/ab.log | cut -c1-200
