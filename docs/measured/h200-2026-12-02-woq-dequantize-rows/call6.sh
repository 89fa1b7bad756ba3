# s33 call 6: the final plan (mma 64x128 on sm90 below the dequantized band, dense from 160 average rows): at 96 /
# 128 / 160 rows beside both GEMMs forced onto mma 128x128 (the rule before) and the bf16 layer; then WFP4A16 at
# 256 / 1024 / 2048 / 4096 tokens beside the bf16 layer.
M128="ours:gemm1_tactic=mma:128x128:plain:plain+gemm2_tactic=mma:128x128:plain:plain"
for st in gpt-oss-20b:768,1024,1280 mixtral-8x7b:384,512,640 qwen3-30b-a3b:1536,2048,2560 deepseek-v2-lite:1024,1366,1707; do
  s=${st%%:*}; t=${st#*:}
  t0=$SECONDS
  timeout 90 python -m moe_build bench --quant wfp4a16 --shapes $s --tokens $t --variants "ours,$M128,ours_bf16" \
    --iters 5 --input-sets 2 --json $OUT/band_$s.json > $OUT/band_$s.txt 2> $OUT/band_$s.log
  echo "band $s rc=$? $((SECONDS-t0))s"
done
t0=$SECONDS
timeout 200 python -m moe_build bench --quant wfp4a16 --tokens 256,1024,2048,4096 --variants ours,ours_bf16 \
  --iters 5 --input-sets 2 --json $OUT/points.json > $OUT/points.txt 2> $OUT/points.log
echo "points rc=$? $((SECONDS-t0))s"
for f in $OUT/band_*.txt $OUT/points.txt; do grep -E "^w" $f | awk '{print $2,$3,$5,$8,$NF}'; done
