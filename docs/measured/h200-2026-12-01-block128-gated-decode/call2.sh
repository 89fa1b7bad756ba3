# s26 call 2: where the block-128 gated chain's time goes (timelines, both forms), then the A/B at 1-4 tokens again
cd bench
P=gpt-oss-20b:1,gpt-oss-20b:4,mixtral-8x7b:1,mixtral-8x7b:4,deepseek-v3:2,qwen3-30b-a3b:1
LAYER_TIMELINE_QUANT=fp8_block LAYER_TIMELINE_POINTS=$P timeout 150 python layer_timeline_probe.py $OUT/timeline_gated.json
LAYER_TIMELINE_QUANT=fp8_block LAYER_TIMELINE_FORCE=fc1_activation=separate LAYER_TIMELINE_POINTS=$P timeout 150 python layer_timeline_probe.py $OUT/timeline_separate.json
cd ..
for r in 3 4; do
timeout 120 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,deepseek-v3 --tokens 1,2,3 --iters 20 --variants "ours,ours:fc1_activation=separate" --json $OUT/blk_r$r.json 2>&1 | tail -1
done
python .device_carry/s26/ab.py $OUT
