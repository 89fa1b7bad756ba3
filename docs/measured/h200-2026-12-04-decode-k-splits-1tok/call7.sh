# s08 call 7 (H200, the product library of b475d34): Mixtral-8x7B's FP8 GEMM2 (K 14336) on the decode kernel's K split
# 4 beside the plan's 8 at 1, 2 and 4 tokens, rowwise with dynamic and static scales, four rounds in four processes.
set -u
cd "$(dirname "$0")/../.."
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_head.tar.xz')).extractall('/tmp/lib')"
export MOE_BUILD_KERNELS_LIB=/tmp/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
S=:after_trigger:plain
for i in 1 2 3 4; do
  timeout 110 python3 -m moe_build bench --quant fp8,fp8_static --shapes mixtral-8x7b --tokens 1,2,4 --iters 10 --input-sets 2 --json $OUT/r/g2_$i.json \
    --variants "ours,ours:gemm2_tactic=decode:ksplit4$S" > $OUT/r/g2_$i.log 2>&1; echo "round $i rc=$?"
done
tar czf $OUT/results.tgz -C $OUT r
for f in $OUT/r/g2_*.log; do grep -E "T=" $f | sed 's/  ours/\n   ours/g' | grep -E "T=|@graph" | tr '\n' ' ' | sed 's/fp8/\nfp8/g'; echo; done
