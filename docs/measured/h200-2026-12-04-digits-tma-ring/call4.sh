# s10 call 4 (H200): Nsight Compute's full set on main's digits GEMMs of Qwen3-30B-A3B at 16 tokens (GEMM1 and GEMM2,
# K split 1, the third call of each), for where their time goes.
source .device_carry/s10/go.sh
mkdir -p $OUT/r
which ncu; ncu --version | tail -1
for S in qwen3_g1 qwen3_g2; do
  timeout 200 ncu --set full --clock-control none -k regex:woq_decode_digits --launch-skip 2 -c 1 \
    python3 docs/measured/h200-2026-12-01-digits-wait/ncu_one.py digits $S 16 1 > $OUT/r/ncu_full_${S}_16tok.txt 2>&1; echo "$S rc=$?"
done
grep -E "Duration|DRAM Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth|Issue Slots Busy|Achieved Occupancy|Registers Per|dram__bytes" $OUT/r/ncu_full_qwen3_g1_16tok.txt | head -20
