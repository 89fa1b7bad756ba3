#!/usr/bin/env bash
# s30 (one H100): main's library (d2ecea8's kernels, sm_80 + sm_90a, lib.tar.xz beside this script). Phases by
# argument: "band" (the block-128 wide band's untimed H100 points: DeepSeek-V3 at 24-64 tokens, DeepSeek-V2-Lite at
# 36-42, the plan beside the H200's tactics, two rounds), "dense" (dense_ratio.py) and any bench --quant mode (ours beside our bf16 layer, FP8
# modes also beside the torch._scaled_grouped_mm pipeline, at 1 / 16 / 256 / 4096 tokens). Run from the repository
# root as .device_carry/s30/run.sh PHASE...; everything lands in $OUT/s30.tar.xz, a table printed last.
set -u
C=$PWD/.device_carry/s30
R=/tmp/s30r; mkdir -p $R /tmp/libs
[ -d /tmp/libs/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.csv
OLD1=wgmma:pingpong64x128:plain:plain; OLD2=wgmma:pingpong64x128:after_trigger:evict_last
D1=decode:digits_ksplit1:after_trigger:plain; D2=decode:digits_ksplit2:after_trigger:plain
S1=decode:staged_ksplit1:after_trigger:plain
force() {  # shape tokens variants...: W4A16 layers with tactics forced beside the plan
  local shape=$1 tokens=$2; shift 2; local v=ours; for f in "$@"; do v="$v,ours:$f"; done
  timeout 150 python3 -m moe_build bench --quant w4a16_awq --shapes $shape --tokens $tokens --variants "$v" \
    --iters 5 --input-sets 2 --json $R/force_${shape}_r${ROUND:-1}.json > $R/force_${shape}_r${ROUND:-1}.log 2>&1
  echo "force $shape rc=$?" | tee -a $R/phases.txt
}
for ph in "$@"; do
  t0=$SECONDS
  if [ $SECONDS -gt ${DEADLINE:-560} ]; then echo "skip $ph at ${SECONDS}s" | tee -a $R/phases.txt; continue; fi
  if [ "$ph" = woqforce ]; then
    force mixtral-8x7b 8,16,24 gemm1_tactic=$D1 gemm1_tactic=$D2
    force gpt-oss-20b 12,16,24 "gemm1_tactic=$S1+gemm2_tactic=$S1"
    force qwen3-30b-a3b 16,24 gemm2_tactic=$D2 gemm2_tactic=$S1 gemm1_tactic=$D2
    force deepseek-v2-lite 16,24 gemm2_tactic=$D2 gemm2_tactic=$S1
  elif [ "$ph" = dense ]; then
    timeout 120 python3 $C/dense_ratio.py $R/dense_ratio.json > $R/dense_ratio.log 2>&1; echo "dense rc=$?" | tee -a $R/phases.txt
  elif [ "$ph" = band ]; then
    for round in 1 2; do
      for pt in "deepseek-v3 24,32,48,64 gemm1_tactic=$OLD1+gemm2_tactic=$OLD2" \
                "deepseek-v2-lite 36,40,42 fc1_activation=separate+gemm1_tactic=$OLD1+gemm2_tactic=$OLD2"; do
        set -- $pt
        timeout 80 python3 -m moe_build bench --quant fp8_block --shapes $1 --tokens $2 --variants "ours,ours:$3" \
          --iters 10 --input-sets 2 --json $R/band_$1_r$round.json > $R/band_$1_r$round.log 2>&1
        echo "band $1 r$round rc=$?" | tee -a $R/phases.txt
      done
    done
  else
    case $ph in fp8|fp8_block|fp8_static) V=ours,ours_bf16,scaled_grouped_mm;; *) V=ours,ours_bf16;; esac
    timeout ${Q_S:-170} python3 -m moe_build bench --quant $ph --variants $V --iters 5 --input-sets 2 \
      --json $R/bench_$ph.json > $R/bench_$ph.log 2>&1
    echo "$ph rc=$?" | tee -a $R/phases.txt
  fi
  echo "$ph $((SECONDS-t0))s" | tee -a $R/phases.txt
  tar cJf $OUT/s30.tar.xz -C $R .
done
python3 - $R <<'PY'
import json, pathlib, sys
rows = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("band_*.json")):
    for p in json.loads(f.read_text())["points"]:
        for i, (v, e) in enumerate(p["variants"].items()):
            rows.setdefault((p["shape"], p["tokens"], "plan" if i == 0 else "h200 tactics"), []).append(
                (e.get("graph_us"), e.get("graph_rel_err")))
for f in sorted(pathlib.Path(sys.argv[1]).glob("force_*.json")):
    for p in json.loads(f.read_text())["points"]:
        for v, e in p["variants"].items():
            rows.setdefault((p["shape"], p["tokens"], v.replace("after_trigger:plain", "").replace("gemm", "g")), []).append(
                (e.get("graph_us"), e.get("graph_rel_err")))
for (s, t, v), xs in sorted(rows.items()):
    print(f"{s:18s} {t:4d} {v:13s} " + " ".join(f"{u:.1f}" for u, _ in xs) + "  err " + " ".join(f"{e:.4f}" for _, e in xs))
PY
[ -f $R/dense_ratio.log ] && cat $R/dense_ratio.log
for f in $R/bench_*.log; do echo "== $f"; grep -A26 "^quant " $f | cut -c1-160; done
