# s23 call 6 (the staged int4 tile's decode band to 12 rows; library of 83ea923): the plan against both GEMMs forced
# onto the mixed-input 128x32 tile (the plan before past 8 rows; finalize separate as it is there), 9-13 rows.
ARGS="--quant w4a16_awq --iters 20"
W=wgmma:woq128x32:plain:plain
V="ours,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W"
b() { timeout 150 python -m moe_build bench $ARGS --shapes $1 --tokens $2 --variants "$V" --json $OUT/band2_$1_r$3.json > $OUT/band2_$1_r$3.log 2>&1; echo "$1 r$3 rc=$?"; }
b gpt-oss-20b 72,88,96,104 1
b qwen3-30b-a3b 144,176,192,208 1
b deepseek-v2-lite 96,117,128,139 1
b mixtral-8x7b 36,44,48,52 1
b gpt-oss-20b 72,88,96,104 2
python .device_carry/s23/ab6.py $OUT
