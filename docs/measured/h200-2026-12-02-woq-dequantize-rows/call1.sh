# s33 call 1: the review commit b212ade's library on the GPU (weight-only wgmma tests), then the tile rule from 96
# average rows (160-row tiles from about 118) beside the old rule's 128-row tiles at about 120 and 128 rows.
t0=$SECONDS
timeout 200 python -m pytest -q -x tests/gpu/test_runner_woq.py -k "many_tokens or 320 or sizes" -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests.txt)"
OLD="ours:finalize=separate+gemm1_tactic=wgmma:woq128x128:plain:plain+gemm2_tactic=wgmma:woq128x128:plain:plain"
for st in mixtral-8x7b:480,512 qwen3-30b-a3b:1920,2048 deepseek-v2-lite:1280,1366 gpt-oss-20b:960,1024; do
  s=${st%%:*}; t=${st#*:}
  t0=$SECONDS
  timeout 80 python -m moe_build bench --quant w4a16_awq,w8a16 --shapes $s --tokens $t --variants "ours,$OLD,ours_bf16" \
    --iters 5 --input-sets 2 --json $OUT/band_$s.json > $OUT/band_$s.txt 2> $OUT/band_$s.log
  echo "band $s rc=$? $((SECONDS-t0))s"
done
for f in $OUT/band_*.txt; do grep -E "^w" $f; done
