#!/usr/bin/env bash
# s24 call 2 (one GPU): (A) the digits expansion reading its first group before its wait (lib_early, landed as
# f7f4c4d) against main's 3f575ce library (lib_main) on W8A16 and W4AFP8 (static and per-row) layers at 1 token, two
# rounds; its W4AFP8 runner tests. (B) probe: the digits kernels' chunk rows capped at 2 (NM_MAX 1's kernel) where no
# expert has more than 2 rows (1 and 2 tokens), MB_EXP_ROWS_CAP on lib_cap (branch s24-rows-cap-probe, lib_early plus
# the switch), off and on alternated, two rounds. (C) timelines at 1 token with lib_early (W4A16, W8A16).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s24
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs2.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LE=/tmp/lib_early/libmoe_build_kernels.so; LC=/tmp/lib_cap/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LE timeout 120 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_runner_w4afp8.py -k "digits or fusions or prequant" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for p in 0 1 2 3 4 5 6 7; do echo "$p $(tail -1 $OUT/r/t_$p.log)"; done
t0=$SECONDS; timeout 170 python3 bench/lib_ab.py --libs main=$LM,early=$LE --rounds 2 --out $OUT/r/ab --timeout 60 -- \
  --quant w8a16,w4afp8,w4afp8_dynamic --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1 \
  --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tar cJf $OUT/r.tar.xz -C $OUT r
t0=$SECONDS; mkdir -p $OUT/r/cap
for r in 1 2; do for c in off on; do
  if [ $c = on ]; then export MB_EXP_ROWS_CAP=2; else unset MB_EXP_ROWS_CAP; fi
  MOE_BUILD_KERNELS_LIB=$LC timeout 75 python3 -m moe_build bench --quant w4a16_awq,wfp4a16,w8a16 \
    --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1,2 --variants ours --iters 10 \
    --input-sets 2 --json $OUT/r/cap/${c}_$r.json > $OUT/r/cap/${c}_$r.log 2>&1; echo "cap $c $r rc=$?"
done; done; unset MB_EXP_ROWS_CAP; echo "cap $((SECONDS-t0))s"; tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $OUT/r/cap <<'PY' > $OUT/r/cap.txt
import json, sys, pathlib
sys.path.insert(0, "bench"); from lib_ab import graph_times, compare, table
d = pathlib.Path(sys.argv[1])
runs = {c: [graph_times(json.loads((d / f"{c}_{r}.json").read_text())) for r in (1, 2) if (d / f"{c}_{r}.json").exists()]
        for c in ("off", "on")}
print(table(compare(runs)))
PY
R=$PWD; for q in w4a16_awq w8a16; do
  (cd bench; PYTHONPATH=$R MOE_BUILD_KERNELS_LIB=$LE LAYER_TIMELINE_QUANT=$q LAYER_TIMELINE_POINTS=gpt-oss-20b:1,qwen3-30b-a3b:1 \
    timeout 60 python3 layer_timeline_probe.py $OUT/r/timeline_$q.json > $OUT/r/timeline_$q.log 2>&1; echo "timeline $q rc=$?")
done
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/ab.txt; cat $OUT/r/cap.txt; grep -hv Warn $OUT/r/timeline_*.log | grep -v _warn
