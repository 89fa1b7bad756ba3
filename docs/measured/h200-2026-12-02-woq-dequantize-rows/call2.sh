# s33 call 2: the dequantize pass a block per weight row (new) against the one before (old): GPU tests, the pass
# alone on the bench shapes, and WFP4A16 layers (which run it from 128 average rows an expert) with each library.
t0=$SECONDS
timeout 150 python -m pytest -q tests/gpu/test_woq_gemm.py -k dequantize -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests.txt)"
for lib in main old; do
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 100 python .device_carry/s33/dq_probe.py $OUT/dq_$lib.json > $OUT/dq_$lib.txt 2>&1
  echo "dq $lib rc=$?"
done
paste <(cut -c1-50 $OUT/dq_old.txt) <(cut -c27-50 $OUT/dq_main.txt)
MMA="ours:gemm1_tactic=mma:64x128:plain:plain+gemm2_tactic=mma:64x128:plain:plain"
for lib in main old; do
  t0=$SECONDS
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 150 python -m moe_build bench --quant wfp4a16 \
    --tokens 1024,4096 --variants "ours,$MMA,ours_bf16" --iters 5 --input-sets 2 --json $OUT/wfp4_$lib.json > $OUT/wfp4_$lib.txt 2> $OUT/wfp4_$lib.log
  echo "wfp4 $lib rc=$? $((SECONDS-t0))s"
done
for lib in old main; do echo "== $lib"; grep -E "^w" $OUT/wfp4_$lib.txt | cut -c1-110; done
