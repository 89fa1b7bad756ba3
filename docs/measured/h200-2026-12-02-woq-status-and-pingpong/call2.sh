# s32 call 2: W4A16 and WFP4A16 at the bench points beside bf16 and the floor (the targets table lacks a WFP4A16 row;
# its figures were from 2026-11-28); the W4A16 layers between the bench points beside bf16.
t0=$SECONDS
timeout 240 python -m moe_build bench --quant w4a16_awq,wfp4a16 --tokens 1,16,256,4096 --variants ours,ours_bf16 \
  --iters 5 --input-sets 2 --json $OUT/woq_points.json > $OUT/woq_points.txt 2> $OUT/woq_points.log
echo "woq points rc=$? $((SECONDS-t0))s"
t0=$SECONDS
timeout 240 python -m moe_build bench --quant w4a16_awq --tokens 8,64,512,1536,3072,6144 \
  --variants ours,ours_bf16 --iters 3 --input-sets 2 --json $OUT/w4a16_sweep.json > $OUT/w4a16_sweep.txt 2> $OUT/w4a16_sweep.log
echo "w4a16 sweep rc=$? $((SECONDS-t0))s"
tail -45 $OUT/woq_points.txt
tail -30 $OUT/w4a16_sweep.txt
