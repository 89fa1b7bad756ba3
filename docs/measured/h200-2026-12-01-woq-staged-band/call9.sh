# s23 call 9 (MXFP4's decode band to 12 rows; library of 83ea923): WFP4A16 layers, the plan beside both GEMMs forced
# onto the mma 64x128 tile (the plan before past 8 rows), 9 / 12 / 16 rows, GPT-OSS-20B in its own MXFP4 too.
M=mma:64x128:plain:plain
V="ours,ours:gemm1_tactic=$M+gemm2_tactic=$M"
b() { timeout 150 python -m moe_build bench --quant wfp4a16 --iters 20 --shapes $1 --tokens $2 --variants "$V" --json $OUT/band4_$1_r1.json > $OUT/band4_$1_r1.log 2>&1; echo "$1 rc=$?"; }
b gpt-oss-20b 72,96,128
b qwen3-30b-a3b 144,192,256
b deepseek-v2-lite 96,128,171
python .device_carry/s23/ab9.py $OUT
