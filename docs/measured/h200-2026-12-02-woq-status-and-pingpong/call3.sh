# s32 call 3: the pingpong mixed-input probe library (lib_old.tar.xz here = the probe build) against the product's.
t0=$SECONDS
MOE_BUILD_KERNELS_LIB=/tmp/old/libmoe_build_kernels.so timeout 200 python docs/measured/h200-2026-12-02-woq-status-and-pingpong/pp_probe.py > $OUT/pp_probe.txt 2>&1
echo "pp probe rc=$? $((SECONDS-t0))s"
V="ours:finalize=separate+gemm1_tactic=wgmma:woq128x160:plain:plain+gemm2_tactic=wgmma:woq128x160:plain:plain"
t0=$SECONDS
timeout 150 python -m moe_build bench --quant w4a16_awq --tokens 2048,4096 --variants ours,ours_bf16 --iters 5 \
  --input-sets 2 --json $OUT/pp_main.json > $OUT/pp_main.txt 2> $OUT/pp_main.log
echo "main rc=$? $((SECONDS-t0))s"
t0=$SECONDS
MOE_BUILD_KERNELS_LIB=/tmp/old/libmoe_build_kernels.so timeout 150 python -m moe_build bench --quant w4a16_awq \
  --tokens 2048,4096 --variants "ours,$V" --iters 5 --input-sets 2 --json $OUT/pp_layers.json > $OUT/pp_layers.txt 2> $OUT/pp_layers.log
echo "pp layers rc=$? $((SECONDS-t0))s"
cat $OUT/pp_probe.txt | tail -40
tail -12 $OUT/pp_main.txt
tail -12 $OUT/pp_layers.txt
