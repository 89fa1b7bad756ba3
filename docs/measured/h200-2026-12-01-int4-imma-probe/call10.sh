# s20 call 10: bench/int4_imma_probe.py (the int8-mma int4 decode lead beside the staged kernel; HEAD's library).
export PATH=$PATH:/usr/local/cuda/bin
timeout 200 python bench/int4_imma_probe.py $OUT/int4_imma_probe.json 2>&1 | tail -25
