# s17 call 1: d3b = branch digits-3cta-b (the group-128 digits tile at three CTAs an SM, 80 registers, chunks in passes
# of two token rows on the one-mma body at two groups a wait; its zero points packed in one word and row g + 8's
# pointers derived from row g's); lean = main's digits tile (two CTAs an SM) with only the packing and the pointers
# (branch digits-lean-experiment). Their digits GEMM tests; the GEMMs alone on head, d3b and lean; W4A16 layers on
# the three at 1-32 tokens.
source .device_carry/s17/go.sh
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
H=/tmp/head/libmoe_build_kernels.so; D3B=/tmp/d3b/libmoe_build_kernels.so; LEAN=/tmp/lean/libmoe_build_kernels.so
t0=$SECONDS; for L in d3b lean; do MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so timeout 100 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_$L.log 2>&1 & done; wait; echo "gpu tests $((SECONDS-t0))s"
for L in d3b lean; do echo "gpu $L: $(tail -1 $OUT/r/gpu_$L.log | cut -c1-200)"; done
for L in head d3b lean; do mkdir -p $OUT/r/probe_$L
  t0=$SECONDS; MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_GEMMS=mixtral_g1,qwen3_g1,qwen3_g2,dsv2_g1,dsv2_g2 OUT=$OUT/r/probe_$L \
    timeout 75 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$? $((SECONDS-t0))s"
done
tar czf $OUT/results.tgz -C $OUT r
t0=$SECONDS; timeout 270 python3 bench/lib_ab.py --libs head=$H,d3b=$D3B,lean=$LEAN --rounds 2 --out $OUT/r/ab_woq -- --quant w4a16_awq \
  --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1,4,16,32 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab_woq.log 2>&1; echo "ab woq rc=$? $((SECONDS-t0))s"
tar czf $OUT/results.tgz -C $OUT r
for L in head d3b lean; do echo "== $L"; tail -11 $OUT/r/probe_$L.log | cut -c1-170; done
tail -13 $OUT/r/ab_woq.log | cut -c1-220
