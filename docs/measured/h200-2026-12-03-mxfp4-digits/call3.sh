for round in 2 3; do
  step ab_new_$round 120 python3 -m moe_build bench --quant wfp4a16 --shapes deepseek-v2-lite,gpt-oss-20b --variants ours --tokens 1,2,4,8,12,16,24,32 --input-sets 2 --json "$R/ab_new_$round.json"
  step ab_old_$round 120 env -C /tmp/base PYTHONPATH=. MOE_BUILD_KERNELS_LIB=/tmp/base/libmoe_build_kernels.so python3 -m moe_build bench --quant wfp4a16 --shapes deepseek-v2-lite,gpt-oss-20b --variants ours --tokens 1,2,4,8,12,16,24,32 --input-sets 2 --json "$R/ab_old_$round.json"
done
for f in "$R"/ab_*.log; do echo "== $f"; grep "T=" "$f" | awk '{print $2, $3, $NF}' | tr '\n' ';'; echo; done
