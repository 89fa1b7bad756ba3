# Dynamic FP8 layers (the gated epilogue's unquantized path) on HEAD~1's tree and library against this change's, alternated.
run() { # $1: tree, $2: library, $3: json
  ( cd $1 && MOE_BUILD_KERNELS_LIB=$2 python -m moe_build bench --quant fp8 --iters 10 --input-sets 2 --variants ours \
      --shapes mixtral-8x7b,qwen3-30b-a3b,gpt-oss-20b --tokens 16,256,4096 --json $3 2>&1 | grep "^fp8 " ) ; }
for r in 1 2; do
  run .device_carry/s11/old_tree /tmp/old/libmoe_build_kernels.so $OUT/dyn_old_r$r.json
  run . /tmp/new/libmoe_build_kernels.so $OUT/dyn_new_r$r.json
done
