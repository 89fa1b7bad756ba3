"""Graph-replay us of every variant at every point of DIR's fin_r*.json / dig_r*.json, rounds side by side."""
import glob, json, os, sys
d = sys.argv[1]
for kind in sorted({os.path.basename(f).rsplit("_r", 1)[0] for f in glob.glob(os.path.join(d, "band4_*_r*.json"))}):
    rows, plans = {}, {}
    for f in sorted(glob.glob(os.path.join(d, f"{kind}_r*.json"))):
        for p in json.load(open(f))["points"]:
            plans[(p["shape"], p["tokens"])] = [p["variants"]["ours"]["plan"][g] for g in ("gemm1_tactic", "gemm2_tactic")]
            for v, rec in p["variants"].items():
                rows.setdefault((p["shape"], p["tokens"]), {}).setdefault(v, []).append(rec.get("graph_us", float("nan")))
    for (shape, tok), vs in sorted(rows.items()):
        print(f"{kind} {shape:<17} {tok:>3}  " + "  ".join(f"{v.replace('decode:digits_ksplit1:after_trigger:plain', 'D').replace('decode:staged_ksplit1:after_trigger:plain', 'S').replace('decode:ksplit1:after_trigger:plain', 'D').replace('mma:64x128:plain:plain', 'M')}: "
                                                            + "/".join(f"{x:.1f}" for x in t) for v, t in vs.items())
              + "   plan " + "/".join(t.split(":")[1] for t in plans[(shape, tok)]))
