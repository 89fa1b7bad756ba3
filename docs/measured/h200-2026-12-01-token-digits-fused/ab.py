"""Graph-replay times of the bench runs in DIR (bench_rN.json): the default plan (token_digits=fused) beside
token_digits=separate, per round."""
import glob, json, os, sys
d = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(d, "bench_r*.json"))):
    r = os.path.basename(f)[7:-5]
    for p in json.load(open(f))["points"]:
        v = p["variants"]
        fused, sep = v.get("ours", {}), v.get("ours:token_digits=separate", {})
        rows.setdefault((p["shape"], p["tokens"]), []).append(
            (r, fused.get("graph_us", float("nan")), sep.get("graph_us", float("nan")),
             fused.get("plan", {}).get("token_digits", "?")))
print(f"{'shape':<18} {'tok':>4}  round: fused / separate (fused/separate)   plan")
for (shape, tok), v in sorted(rows.items()):
    print(f"{shape:<18} {tok:>4}  " + "  ".join(f"r{r}: {a:.1f} / {b:.1f} ({a / b:.3f})" for r, a, b, _ in v)
          + f"   {v[0][3]}")
