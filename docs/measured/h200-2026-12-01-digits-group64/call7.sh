# s24 call 7 (library lib_c, HEAD's): W4A16 at 1 and 16 tokens on the four bench shapes, the plan, for the targets.
timeout 400 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16 --variants ours --json $OUT/w4a16_head.json > $OUT/w4a16_head.log 2>&1; echo "bench rc=$?"
grep -E "T=" $OUT/w4a16_head.log | cut -c1-110
sed -n '/^quant  /,$p' $OUT/w4a16_head.log | head -20
