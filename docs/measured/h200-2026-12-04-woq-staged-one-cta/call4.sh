# s09 call 4 (H200): the staged int4 decode kernel at 16 warps, one CTA an SM, where a chunk's token rows pass
# 104 KB (Mixtral-8x7B's GEMM2, k 14336: 8 rows in 230 KB), against fp64; then the W4A16 / W4AFP8 Mixtral-8x7B layers
# with the planner's staged rows counted against that budget (patched here, on the device's copy), beside the plan's
# ring kernel for GEMM2 (decode:ksplit1) and the staged kernel's other K splits, two rounds.
source .device_carry/s09/go.sh
export MOE_BUILD_KERNELS_LIB=/tmp/s1/libmoe_build_kernels.so
sed -i 's/    return max(0, min(DECODE_TOKENS, (STAGED_TOKEN_BUDGET - STAGED_TOKEN_ZEROS) \/\/ per_row))/    return max(0, min(DECODE_TOKENS, (227 * 1024 - 64 - STAGED_TOKEN_ZEROS) \/\/ per_row))/' moe_build/planner/tactics.py
grep -n "227 \* 1024" moe_build/planner/tactics.py
mkdir -p $OUT/r
timeout 150 python3 .device_carry/s09/check_one_cta.py > $OUT/r/check_one_cta.log 2>&1; echo "check rc=$?"; tail -3 $OUT/r/check_one_cta.log
S=:after_trigger:plain
for i in 1 2; do
  timeout 150 python3 -m moe_build bench --quant w4a16_awq,w4afp8 --shapes mixtral-8x7b --tokens 4,8,16,32 --iters 10 --input-sets 2 --json $OUT/r/mixtral_$i.json \
    --variants "ours,ours:gemm2_tactic=decode:ksplit1$S,ours:gemm2_tactic=decode:staged_ksplit2$S,ours:gemm2_tactic=decode:staged_ksplit4$S" > $OUT/r/mixtral_$i.log 2>&1; echo "bench $i rc=$?"
done
LAYER_STEPS_SHAPES=mixtral-8x7b LAYER_STEPS_TOKENS=16 LAYER_STEPS_QUANTS=w4a16_awq timeout 60 python3 bench/layer_steps_probe.py $OUT/r/layer_steps.json > $OUT/r/layer_steps.log 2>&1; echo "steps rc=$?"
tar czf $OUT/results.tgz -C $OUT r
grep -v Warn $OUT/r/layer_steps.log | grep -v "^ *$" | cut -c1-120
for i in 1 2; do grep -E "T=" $OUT/r/mixtral_$i.log | cut -c1-330; done
