# s29 call 4: W4AFP8 (static scale, W4A16's GEMMs on dequantized rows) at 1 token on the narrow-expert layers, where the
# plan keeps the FC2 pre-quant scale and quantization out of the activation (measured on the e4m3 kernels): the plan
# beside the fusion forced at every count, two rounds.
for r in 1 2; do
timeout 100 python -m moe_build bench --quant w4afp8 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2 --iters 10 --input-sets 2 --variants "ours,ours:fc2_prequant=fused" --json $OUT/fc2one_r$r.json > $OUT/fc2one_r$r.log 2>&1; echo "r$r rc=$?"
done
python .device_carry/s29/ab.py $OUT
