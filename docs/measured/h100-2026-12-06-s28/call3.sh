#!/usr/bin/env bash
# s28 call 3 (one GPU), main's library: FP8 block-128's three floor misses of call 2 (Qwen3-30B-A3B at 16 tokens,
# DeepSeek-V2-Lite at 256, DeepSeek-V3 at 1) beside the plan's other tactics forced, two rounds, a process a point.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s28
mkdir -p "$OUT/r" /tmp/libs
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_main.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib_main/libmoe_build_kernels.so
D1=decode:twocta_ksplit1:after_trigger:plain
Q="ours,ours:gemm1_tactic=$D1,ours:gemm2_tactic=$D1,ours:gemm1_tactic=$D1+gemm2_tactic=$D1"
V="ours,ours:gemm1_tactic=decode:twocta_ksplit4:after_trigger:plain,ours:gemm1_tactic=decode:ksplit2:after_trigger:plain"
V="$V,ours:gemm2_tactic=decode:twocta_ksplit2:after_trigger:plain,ours:gemm2_tactic=decode:ksplit1:after_trigger:plain"
L="ours,ours:gemm2_tactic=wgmma:coop128x128:after_trigger:evict_last,ours:gemm2_tactic=wgmma:pingpong64x128:after_trigger:plain"
for round in 1 2; do
  for pt in "qwen3-30b-a3b 16 $Q" "deepseek-v3 1 $V" "deepseek-v2-lite 256 $L"; do
    set -- $pt; t0=$SECONDS
    timeout 80 python3 -m moe_build bench --quant fp8_block --shapes $1 --tokens $2 --variants $3 --iters 10 --input-sets 2 \
      --json $OUT/r/fb_${1}_${2}_r$round.json > $OUT/r/fb_${1}_${2}_r$round.log 2>&1
    echo "$1 $2 r$round rc=$? $((SECONDS-t0))s"
  done
  tar cJf $OUT/r.tar.xz -C $OUT r
done
python3 - $OUT/r <<'PY'
import json, pathlib, sys
rows = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("fb_*.json")):
    for p in json.loads(f.read_text())["points"]:
        for v, e in p["variants"].items():
            rows.setdefault((p["shape"], p["tokens"], v), []).append((e.get("graph_us"), e.get("graph_rel_err")))
for (s, t, v), xs in rows.items():
    print(f"{s:18s} {t:4d} {v[:80]:80s} " + " ".join(f"{u:.1f}" if u else "-" for u, _ in xs)
          + "  err " + " ".join(f"{e:.4f}" if e is not None else "-" for _, e in xs))
PY
