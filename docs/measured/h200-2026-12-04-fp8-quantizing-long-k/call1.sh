# s08 call 1 (H200): GEMM2 quantizing its own input at Mixtral-8x7B's k (14336) where a chunk holds 2 or 4 rows.
# GPU tests of the quantizing GEMM (every case) and of the FP8 runner's plans; the Mixtral-8x7B layer with the
# quantize step forced back (the plan before) side by side, two rounds; the 1-2 token layers kernel by kernel;
# DeepSeek-V3 at 1 token with GEMM1 / GEMM2 forced onto other decode K splits.
source .device_carry/s08/go.sh
mkdir -p $OUT/r
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantizing_gemm.py > $OUT/r/gpu_quantizing.log 2>&1; echo "gpu quantizing rc=$?"; tail -2 $OUT/r/gpu_quantizing.log
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_fp8.py -k "long_k or gated_epilogue_where_planned or gemm2_quantizing_its_input" > $OUT/r/gpu_runner.log 2>&1; echo "gpu runner rc=$?"; tail -2 $OUT/r/gpu_runner.log
for i in 1 2; do
  timeout 80 python3 -m moe_build bench --quant fp8 --shapes mixtral-8x7b --tokens 1,2,3 --iters 10 --input-sets 2 --variants "ours,ours:fc2_input_quant=separate" --json $OUT/r/mixtral_$i.json > $OUT/r/mixtral_$i.log 2>&1; echo "bench $i rc=$?"
done
LAYER_STEPS_SHAPES=mixtral-8x7b,deepseek-v3 LAYER_STEPS_TOKENS=1,2 LAYER_STEPS_QUANTS=fp8 \
  timeout 60 python3 bench/layer_steps_probe.py $OUT/r/layer_steps.json > $OUT/r/layer_steps.log 2>&1; echo "steps rc=$?"
S=:after_trigger:plain
timeout 90 python3 -m moe_build bench --quant fp8 --shapes deepseek-v3 --tokens 1 --iters 10 --input-sets 2 --json $OUT/r/dsv3_1.json \
  --variants "ours,ours:gemm1_tactic=decode:ksplit2$S,ours:gemm1_tactic=decode:ksplit8$S,ours:gemm2_tactic=decode:ksplit2$S,ours:gemm2_tactic=decode:ksplit4$S" > $OUT/r/dsv3_1.log 2>&1; echo "dsv3 rc=$?"
tar czf $OUT/results.tgz -C $OUT r
grep -v "^ *$" $OUT/r/layer_steps.log | grep -v Warn | cut -c1-120
for i in 1 2; do grep -E "^fp8|^targets" $OUT/r/mixtral_$i.log | cut -c1-200; done
grep -E "T=" $OUT/r/dsv3_1.log | cut -c1-400
