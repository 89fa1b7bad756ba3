cd bench
for q in fp8 fp8_block; do LAYER_TIMELINE_QUANT=$q LAYER_TIMELINE_POINTS=gpt-oss-20b:1,qwen3-30b-a3b:1 timeout 200 python layer_timeline_probe.py $OUT/timeline_$q.json; done
