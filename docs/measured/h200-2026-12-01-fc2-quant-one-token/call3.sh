# s20 call 3 (HEAD's library): which pipe bounds the staged int4 decode kernel (ncu on Mixtral's GEMM1 at 1 token);
# a second round of the FC2 quantization at 1 token (block-128, W4AFP8).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
M=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fp16_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.per_cycle_active
timeout 120 $NCU --clock-control none -k regex:woq_decode --launch-skip 2 --launch-count 1 --metrics $M \
  python .device_carry/s20/ncu_woq.py > $OUT/ncu_woq_metrics.txt 2>&1; echo "ncu metrics rc=$?"
grep -E "pipe|issue|dram|duration|inst_executed.avg|warps_active|ERR|rror" $OUT/ncu_woq_metrics.txt | head -30
timeout 120 $NCU --clock-control none -k regex:woq_decode --launch-skip 2 --launch-count 1 --section ComputeWorkloadAnalysis \
  --section InstructionStats --print-details all python .device_carry/s20/ncu_woq.py > $OUT/ncu_woq_sections.txt 2>&1; echo "ncu sections rc=$?"
grep -vE "^==PROF==|^\s*$" $OUT/ncu_woq_sections.txt | tail -45
timeout 150 python -m moe_build bench --quant fp8_block --shapes mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1 \
  --variants ours:fc2_input_quant=fc1_activation,ours --iters 10 --json $OUT/bench_block_1tok_r2.json > $OUT/bench_block_1tok_r2.log 2>&1
timeout 150 python -m moe_build bench --quant w4afp8 --shapes mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1 \
  --variants ours:fc2_prequant=fused,ours --iters 10 --json $OUT/bench_w4afp8_1tok_r2.json > $OUT/bench_w4afp8_1tok_r2.log 2>&1
for f in bench_block_1tok_r2 bench_w4afp8_1tok_r2; do grep -E "@graph|rror" $OUT/$f.log | head; done
