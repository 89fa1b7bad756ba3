#!/usr/bin/env bash
# s23 call 5 (one GPU): MXFP4's one-mma body at 3 groups a wait in sparse calls (rows at most a seventh of the
# experts), else 4 (rule: branch s23-mxfp4-nb4, mxfp4_groups_per_wait) against main's library (3 at NM_MAX 2-4, 4 at
# NM_MAX 1), WFP4A16 layers at 1-8 tokens, two rounds; Mixtral-8x7B at 1 token, one round; then the MXFP4 digits
# GPU tests with the rule's library.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s23
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs5.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LR=/tmp/lib_rule/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS; timeout 300 python3 bench/lib_ab.py --libs main=$LM,rule=$LR --rounds 2 --out $OUT/r/ab --timeout 90 -- \
  --quant wfp4a16 --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,8 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab.err
t0=$SECONDS; timeout 100 python3 bench/lib_ab.py --libs main=$LM,rule=$LR --rounds 1 --out $OUT/r/ab_mixtral --timeout 45 -- \
  --quant wfp4a16 --shapes mixtral-8x7b --tokens 1 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab_mixtral.txt 2> $OUT/r/ab_mixtral.err; echo "ab mixtral rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab_mixtral.err
cat $OUT/r/ab.txt $OUT/r/ab_mixtral.txt
tar cJf $OUT/r.tar.xz -C $OUT r
cp $C/test_woq_gemm.py tests/gpu/test_woq_gemm.py
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LR timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_woq_gemm.py \
  -k "mxfp4 and digits" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do tail -1 $OUT/r/t_$p.log; done
tar cJf $OUT/r.tar.xz -C $OUT r
