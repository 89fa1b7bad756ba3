"""Graph-replay times of two bench runs per round, side by side: python ab_table.py DIR (files new_R.json, old_R.json)."""
import glob, json, os, sys
d = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(d, "*_r*.json"))):
    name = os.path.basename(f)[:-5]
    for p in json.load(open(f))["points"]:
        runs.setdefault((p["shape"], p["tokens"]), {})[name] = (p["variants"]["ours"]["graph_us"], p["floor_us"],
                                                                  p["variants"]["ours"]["plan"]["gemm1_tactic"].split(":")[1])
names = sorted({n for v in runs.values() for n in v})
print(f"{'shape':<18} {'tok':>4} " + " ".join(f"{n:>9}" for n in names) + "   new/old (per round)   gemm1 tile new")
for (shape, tok), v in sorted(runs.items()):
    ratios = [v[f"new_r{r}"][0] / v[f"old_r{r}"][0] for r in (1, 2) if f"new_r{r}" in v and f"old_r{r}" in v]
    print(f"{shape:<18} {tok:>4} " + " ".join(f"{v[n][0]:>9.1f}" if n in v else f"{'-':>9}" for n in names) +
          "   " + " ".join(f"{r:.3f}" for r in ratios) + f"   {v.get('new_r1', (0, 0, '?'))[2]}")
