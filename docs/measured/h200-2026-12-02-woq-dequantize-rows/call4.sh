# s33 call 4: the product's library and plan (the dequantize pass a block per row, 16-bit GEMMs on the dequantized
# weights from 192 average rows an expert): the weight-only runner's GPU tests where that pass runs (MXFP4, int4 in
# groups of 32), then WFP4A16 at the bench points and between them beside the bf16 layer.
t0=$SECONDS
timeout 200 python -m pytest -q tests/gpu/test_runner_woq.py -k "mxfp4 or g32" -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests.txt)"
t0=$SECONDS
timeout 300 python -m moe_build bench --quant wfp4a16 --tokens 1,16,256,1024,2048,4096 --variants ours,ours_bf16 \
  --iters 5 --input-sets 2 --json $OUT/wfp4.json > $OUT/wfp4.txt 2> $OUT/wfp4.log
echo "bench rc=$? $((SECONDS-t0))s"
grep -E "^(quant|w)" $OUT/wfp4.txt | cut -c1-100
