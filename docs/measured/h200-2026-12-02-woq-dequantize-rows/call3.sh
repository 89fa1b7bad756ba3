# s33 call 3: the dequantize pass with four steps loaded before any store (main) against one step (old = call 2's
# main); then WFP4A16 between 128 and 256 average rows an expert, the plan (the dequantized weights' 16-bit GEMM from
# 128 rows) against both GEMMs forced onto the mma tiles.
t0=$SECONDS
timeout 100 python -m pytest -q tests/gpu/test_woq_gemm.py -k dequantize -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests.txt)"
for lib in main old; do
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 80 python .device_carry/s33/dq_probe.py $OUT/dq_$lib.json > $OUT/dq_$lib.txt 2>&1
  echo "dq $lib rc=$?"
done
paste <(cut -c1-50 $OUT/dq_old.txt) <(cut -c31-50 $OUT/dq_main.txt)
MMA="ours:gemm1_tactic=mma:64x128:plain:plain+gemm2_tactic=mma:64x128:plain:plain"
for st in gpt-oss-20b:1024,1280,1536,1792,2048 mixtral-8x7b:512,640,768,896 qwen3-30b-a3b:2048,2560,3072,3584 deepseek-v2-lite:1366,1707,2048,2390; do
  s=${st%%:*}; t=${st#*:}
  t0=$SECONDS
  timeout 100 python -m moe_build bench --quant wfp4a16 --shapes $s --tokens $t --variants "ours,$MMA" \
    --iters 5 --input-sets 2 --json $OUT/cross_$s.json > $OUT/cross_$s.txt 2> $OUT/cross_$s.log
  echo "cross $s rc=$? $((SECONDS-t0))s"
done
for f in $OUT/cross_*.txt; do grep -E "^w" $f | awk '{print $2,$3,$5,$NF}'; done
