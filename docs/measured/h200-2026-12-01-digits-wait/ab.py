"""Graph-replay times of the bench runs in DIR (bench_new_rN.json, bench_main_rN.json) side by side, and the two
probes' digits columns."""
import glob, json, os, sys
d = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(d, "bench_*_r*.json"))):
    name = os.path.basename(f)[6:-5]
    for p in json.load(open(f))["points"]:
        v = p["variants"]["ours"]
        runs.setdefault((p["shape"], p["tokens"]), {})[name] = (v["graph_us"], v["plan"]["gemm1_tactic"].split(":")[1],
                                                                  v["plan"]["gemm2_tactic"].split(":")[1])
names = sorted({n for v in runs.values() for n in v})
print(f"{'shape':<18} {'tok':>4} " + " ".join(f"{n:>9}" for n in names) + "   new/main per round   tiles")
for (shape, tok), v in sorted(runs.items()):
    ratios = [v[f"new_r{r}"][0] / v[f"main_r{r}"][0] for r in (1, 2) if f"new_r{r}" in v and f"main_r{r}" in v]
    t = next(iter(v.values()))
    print(f"{shape:<18} {tok:>4} " + " ".join(f"{v[n][0]:>9.1f}" if n in v else f"{'-':>9}" for n in names) +
          "   " + " ".join(f"{r:.3f}" for r in ratios) + f"   {t[1]} / {t[2]}")
probes = {}
for lib in ("new", "main"):
    f = os.path.join(d, f"probe_{lib}", "woq_digits_probe.json")
    if os.path.exists(f):
        for r in json.load(open(f)):
            probes.setdefault((r["gemm"], r["tokens"]), {})[lib] = r
print(f"\n{'gemm':<11} {'tok':>4} {'staged':>7} {'dig main':>8} {'dig new':>8} {'ks1 m/n':>13} {'ks2 m/n':>13} {'ks4 m/n':>13}")
for (g, t), v in sorted(probes.items()):
    m, n = v.get("main", {}), v.get("new", {})
    f = lambda r, k: f"{r.get(k, float('nan')):.1f}"
    print(f"{g:<11} {t:>4} {f(m, 'staged_us'):>7} {f(m, 'digits_us'):>8} {f(n, 'digits_us'):>8} "
          + " ".join(f"{f(m, f'digits_ks{k}_us') + '/' + f(n, f'digits_ks{k}_us'):>13}" for k in (1, 2, 4)))
