# s29 call 2: the whole W4AFP8 bench (1-4096 tokens, every forced-off fusion, bf16 beside); then W4A16 at 4096 tokens
# with and without zero points (the bench's layer patched to symmetric int4), to size the zero term's cost.
timeout 330 python -m moe_build bench --quant w4afp8 --tokens 1,16,256,4096 --iters 5 --input-sets 2 --json $OUT/w4afp8full_r1.json > $OUT/w4afp8full_r1.log 2>&1; echo "full rc=$?"
timeout 110 python -m moe_build bench --quant w4a16_awq --tokens 4096 --iters 5 --input-sets 2 --variants "ours,ours_bf16" --json $OUT/w4a16zeros_r1.json > $OUT/w4a16zeros_r1.log 2>&1; echo "zeros rc=$?"
timeout 110 python - > $OUT/w4a16sym_r1.log 2>&1 <<PY
import sys
from moe_build.spec import Quant
from moe_build.weights.woq import WoqKind
import moe_build.bench.woq_layer as w
w.WOQ_LAYERS[Quant.W4A16_AWQ] = (WoqKind.INT4, 128, False, True)
from moe_build.cli import main
sys.argv = ["moe-build", "bench", "--quant", "w4a16_awq", "--tokens", "4096", "--iters", "5", "--input-sets", "2",
            "--variants", "ours,ours_bf16", "--json", "$OUT/w4a16sym_r1.json"]
main()
PY
echo "sym rc=$?"
python .device_carry/s29/ab.py $OUT
