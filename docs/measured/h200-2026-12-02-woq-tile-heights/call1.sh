# s31 call 1: every mixed-input tile's time on the bench shapes' W4A16 GEMMs at 96-1024 average rows; the W4A16
# layers at 2048 / 4096 tokens with both GEMMs forced onto 160 / 192 / 224 beside the plan and bf16; the 160-, 192-
# and 224-row tiles (and the 320-row one on wgmma N 160) against fp64; the old library's 256 / 320c2 beside.
cd bench
timeout 150 python woq_tile_rows_probe.py > $OUT/probe.log 2>&1; echo "probe rc=$?"
cd ..
T=wgmma:woq128x
f() { echo "ours:gemm1_tactic=${T}$1:plain:plain+gemm2_tactic=${T}$1:plain:plain"; }
timeout 240 python -m moe_build bench --quant w4a16_awq --tokens 2048,4096 --iters 5 --input-sets 2 \
  --variants "ours,$(f 160),$(f 192),$(f 224),ours_bf16" --json $OUT/layers_r1.json > $OUT/layers.txt 2> $OUT/layers.log
echo "layers rc=$?"
timeout 120 python -m pytest -q tests/gpu/test_woq_wgmma.py -k "woq128x160 or woq128x192 or woq128x224 or woq128x320c2" \
  -p no:cacheprovider > $OUT/wgmma.log 2>&1
echo "wgmma rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/wgmma.log | tail -5
cd bench
PROBE_TILES=woq128x256,woq128x320c2 PROBE_JSON=old_probe.json MOE_BUILD_KERNELS_LIB=/tmp/old/libmoe_build_kernels.so \
  timeout 50 python woq_tile_rows_probe.py 256,288,320,384,512,576 > $OUT/old_probe.log 2>&1; echo "old probe rc=$?"
cd ..
cat $OUT/layers.txt | tail -30
sed -n '/time \/ the point/,$p' $OUT/probe.log
sed -n '/time \/ the point/,$p' $OUT/old_probe.log
