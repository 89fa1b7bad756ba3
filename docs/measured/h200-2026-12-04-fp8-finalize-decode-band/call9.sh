# s07 call 9 (H200): the rowwise FP8 bench points (dynamic and static input scales) on bdd00ef's plans, 1 / 16 / 256
# tokens, five shapes, ours and its floor, one run.
source .device_carry/s07/go.sh
mkdir -p $OUT/r
timeout 200 python3 -m moe_build bench --quant fp8,fp8_static --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,deepseek-v3 --tokens 1,16,256 --iters 10 --input-sets 2 --variants ours --json $OUT/r/bench_fp8_rowwise.json > $OUT/r/bench_fp8_rowwise.log 2>&1; echo "bench rc=$?"
grep -E "^(fp8|targets)" $OUT/r/bench_fp8_rowwise.log | cut -c1-60
