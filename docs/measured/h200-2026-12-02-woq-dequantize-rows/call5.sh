# s33 call 5: the dequantize pass one step at a time (call 2's kernel; call 3's four loads ahead ran slower) as the
# product's: its GPU tests and the runner's where it runs, the pass alone, then WFP4A16 at 128 / 160 / 192 / 224
# average rows an expert and at 256 / 4096 tokens: the plan, both GEMMs forced dense (the weights dequantized for the
# 16-bit GEMM) and forced onto mma 64x128, and the bf16 layer.
t0=$SECONDS
timeout 120 python -m pytest -q tests/gpu/test_woq_gemm.py -k dequantize -p no:cacheprovider > $OUT/tests_dq.txt 2>&1
echo "tests dq rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests_dq.txt)"
t0=$SECONDS
timeout 150 python -m pytest -q tests/gpu/test_runner_woq.py -k "mxfp4 or g32" -p no:cacheprovider > $OUT/tests_runner.txt 2>&1
echo "tests runner rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/tests_runner.txt)"
timeout 80 python .device_carry/s33/dq_probe.py $OUT/dq_main.json > $OUT/dq_main.txt 2>&1; echo "dq rc=$?"
cat $OUT/dq_main.txt | grep mxfp4
MMA="ours:gemm1_tactic=mma:64x128:plain:plain+gemm2_tactic=mma:64x128:plain:plain"
DENSE="ours:gemm1_tactic=wgmma:pingpong64x256c2:plain:plain+gemm2_tactic=wgmma:pingpong64x256c2:plain:plain"
for st in gpt-oss-20b:256,1024,1280,1536,1792,4096 mixtral-8x7b:256,512,640,768,896,4096 qwen3-30b-a3b:256,2048,2560,3072,3584,4096 deepseek-v2-lite:256,1366,1707,2048,2390,4096; do
  s=${st%%:*}; t=${st#*:}
  t0=$SECONDS
  timeout 110 python -m moe_build bench --quant wfp4a16 --shapes $s --tokens $t --variants "ours,$DENSE,$MMA,ours_bf16" \
    --iters 5 --input-sets 2 --json $OUT/cross_$s.json > $OUT/cross_$s.txt 2> $OUT/cross_$s.log
  echo "cross $s rc=$? $((SECONDS-t0))s"
done
for f in $OUT/cross_*.txt; do grep -E "^w" $f | cut -c1-100; done
