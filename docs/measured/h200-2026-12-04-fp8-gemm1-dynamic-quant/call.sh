# s10 call 3 (H200): the gated decode GEMM1 writing GEMM2's FP8 input with dynamic row scales (branch
# fp8-gemm1-dynamic-quant-experiment, its tree carried as exp2tree): its tests, then the FP8 rowwise layers with
# fc2_input_quant=gemm1 forced beside the plan, two rounds (two processes).
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/dyn /tmp/exp2 $OUT/r
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s10/dyn.tar.xz /tmp/dyn
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s10/exp2tree.tar.xz /tmp/exp2
cd /tmp/exp2
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/dyn/libmoe_build_kernels.so PYTHONPATH=/tmp/exp2:/tmp/exp2/bench
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_exp_fp8_gated_dynamic.py > $OUT/r/gpu_dyn.log 2>&1; echo "gpu dyn rc=$?"; tail -3 $OUT/r/gpu_dyn.log | cut -c1-400
for R in 1 2; do
  timeout 150 python3 -m moe_build bench --quant fp8 --shapes qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite --tokens 1,4,8,16,24 \
    --variants "ours,ours:fc2_input_quant=gemm1" --iters 10 --input-sets 2 --json $OUT/r/bench_r$R.json > $OUT/r/bench_r$R.log 2>&1; echo "bench r$R rc=$?"
done
tar czf $OUT/results.tgz -C $OUT r
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
rows = {}
for r in (1, 2):
    try: d = json.load(open(f"{out}/r/bench_r{r}.json"))
    except Exception as e: print("no", r, e); continue
    for p in d["points"]:
        for v, x in p["variants"].items():
            rows.setdefault((p["shape"], p["tokens"]), {}).setdefault(v, []).append(x.get("graph_us"))
for (s, t), vs in sorted(rows.items()):
    print(f"{s:18s} {t:4d} " + "  ".join(f"{v.split(':')[-1][:20]:>20s} {' '.join(f'{u:.1f}' for u in us if u)}" for v, us in vs.items()))
PY
