#!/usr/bin/env bash
# s25 call 5 (one GPU), branch s25-three-step-routing's library (lib_r): the three-step prologue's first launch routes
# (mb_routing_prologue_three_step_routing; the plan's routing=prologue now in either prologue, 1-4 tokens).
# (T) its kernel tests and the runner cases that run the three-step prologue; (B) WFP4A16 layers (the matrix keeps them
# on the three-step prologue) at 1 / 2 / 4 / 8 tokens, the plan against routing forced separate (main's sequence: the
# routing kernel, then the three-step prologue), both in each process, two processes.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s25b
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_r.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/lib_s25r/libmoe_build_kernels.so OMP_NUM_THREADS=2
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do timeout 100 python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=60 \
  tests/gpu/test_stage_kernels.py -k "rout" tests/gpu/test_runner.py tests/gpu/test_runner_woq.py \
  tests/gpu/test_runner_fp8.py tests/gpu/test_plugin_enqueue.py -k "rout or three_step or wfp4a16 or mxfp4" \
  --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for f in $OUT/r/t_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
grep -h "FAILED\|Timeout\|Error" $OUT/r/t_*.log | head -8
tar cJf $OUT/r.tar.xz -C $OUT r
V="ours,ours:routing=separate"
for r in 1 2; do
  timeout 110 python3 -m moe_build bench --quant wfp4a16 --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b \
    --tokens 1,2,4,8 --variants "$V" --iters 10 --input-sets 2 --json $OUT/r/b_$r.json > $OUT/r/b_$r.log 2>&1
  echo "round $r rc=$?"
done
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $OUT/r <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(d.glob("b_*.json")):
    for p in json.loads(f.read_text())["points"]:
        v = p["variants"]
        rows.setdefault((p["shape"], p["tokens"]), []).append((v["ours"]["graph_us"], v["ours:routing=separate"]["graph_us"]))
for (shape, t), xs in sorted(rows.items()):
    print(f"{shape:18s} {t:3d}  plan " + " ".join(f"{a:6.1f}" for a, _ in xs) + "  separate "
          + " ".join(f"{b:6.1f}" for _, b in xs) + "  ratio " + " ".join(f"{a / b:.3f}" for a, b in xs))
PY
