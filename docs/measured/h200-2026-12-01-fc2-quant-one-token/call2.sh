# s20 call 2 (HEAD's library): block-128 at 1 token with the FC2 quantization in the activation and GEMM1 / GEMM2 K
# splits forced; block-128 at 16 / 32 tokens on the decode kernel against the plan's wgmma tiles; W4AFP8's fused FC2
# pre-quant at 1 token.
D=decode:ksplit
timeout 200 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1 \
  --variants ours,ours:fc2_input_quant=fc1_activation,ours:fc2_input_quant=fc1_activation+gemm1_tactic=${D}2:after_trigger:plain,ours:fc2_input_quant=fc1_activation+gemm2_tactic=${D}2:after_trigger:plain,ours:fc2_input_quant=fc1_activation+gemm1_tactic=${D}2:after_trigger:plain+gemm2_tactic=${D}2:after_trigger:plain \
  --iters 10 --json $OUT/bench_block_1tok.json > $OUT/bench_block_1tok.log 2>&1
timeout 200 python -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 16,32 \
  --variants ours,ours:gemm1_tactic=${D}1:after_trigger:plain+gemm2_tactic=${D}1:after_trigger:plain \
  --iters 10 --json $OUT/bench_block_decode16.json > $OUT/bench_block_decode16.log 2>&1
timeout 150 python -m moe_build bench --quant w4afp8 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1 \
  --variants ours,ours:fc2_prequant=fused --iters 10 --json $OUT/bench_w4afp8_1tok.json > $OUT/bench_w4afp8_1tok.log 2>&1
for f in bench_block_1tok bench_block_decode16 bench_w4afp8_1tok; do grep -E "@graph|error|Error" $OUT/$f.log | sed 's/ours:fc2_input_quant=fc1_activation/Q/g; s/gemm1_tactic=decode:ksplit/g1k/g; s/gemm2_tactic=decode:ksplit/g2k/g; s/:after_trigger:plain//g' | head -30; done
