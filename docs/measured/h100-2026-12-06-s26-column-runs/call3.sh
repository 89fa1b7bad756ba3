#!/usr/bin/env bash
# s26 call 3 (one GPU): the digits tile with column runs (branch s26-digits-column-runs: a CTA runs several column
# blocks of its chunk, each next block's first weights requested under the last one's end; one block a CTA keeps the
# old schedule), the blocks a CTA runs set for about 2 waves of CTAs at two an SM (lib_r2): (T) the digits GEMM tests
# on lib_r2, the new column-run cases with them, eight processes; (B) W4A16 layers at 1 / 16 / 32 tokens against main's 46d7414 library (lib_main), lib_ab two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s26
mkdir -p "$OUT/r"
for t in lib_main lib_r; do [ -f $C/$t.tar.xz ] || continue
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/$t.tar.xz /tmp
done
cp $C/test_woq_gemm.py tests/gpu/test_woq_gemm.py
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
cp $C/build_r2.json /tmp/lib_r/2/build.json
LM=/tmp/lib_s26/libmoe_build_kernels.so; R2=/tmp/lib_r/2/libmoe_build_kernels.so
ls -la $LM $R2
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$R2 timeout 90 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_woq_gemm.py -k "digits or column_runs" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
grep -h "^FAILED\|Error:" $OUT/r/t_*.log | head -10
t0=$SECONDS; timeout 210 python3 bench/lib_ab.py --libs main=$LM,r2=$R2 --rounds 2 --out $OUT/r/ab --timeout 50 -- \
  --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16,32 --variants ours \
  --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/ab.err
cat $OUT/r/ab.txt
python3 - $OUT/r/ab <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    if f.name == "summary.json": continue
    errs = [v.get("graph_rel_err") for p in json.loads(f.read_text())["points"] for v in p["variants"].values()]
    print(f.name, "largest graph_rel_err", max(e for e in errs if e is not None))
PY
tar cJf $OUT/r.tar.xz -C $OUT r
