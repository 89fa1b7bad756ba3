"""Graph-replay us of every variant at every point of DIR's *_r*.json, rounds (and libraries) side by side."""
import glob, json, os, re, sys
d = sys.argv[1]
abbrev = lambda v: re.sub(r"decode:(digits|staged|twocta)_ksplit(\d):after_trigger:plain", lambda m: m.group(1)[0].upper() + m.group(2), v).replace("wgmma:woq128x320c2:plain:plain", "W320").replace("wgmma:woq128x256:plain:plain", "W256").replace("finalize=separate+", "").replace("decode:ksplit1:after_trigger:plain", "one").replace("gemm1_tactic=", "").replace("gemm2_tactic=", "")
rows, plans = {}, {}
for f in sorted(glob.glob(os.path.join(d, "*_r*.json"))):
    tag = os.path.basename(f).rsplit("_r", 1)[0]
    for p in json.load(open(f))["points"]:
        key = (tag.split("_")[0], p["shape"], p["tokens"])
        plans[key] = "/".join(p["variants"]["ours"].get("plan", {}).get(g, "?").split(":")[1] for g in ("gemm1_tactic", "gemm2_tactic"))
        for v, rec in p["variants"].items():
            rows.setdefault(key, {}).setdefault(f"{tag.split('_', 1)[-1] if '_' in tag else ''}{abbrev(v)}", []).append(rec.get("graph_us") or float("nan"))
for key, vs in sorted(rows.items()):
    print(f"{key[0]} {key[1]:<17} {key[2]:>3}  " + "  ".join(f"{v}: " + "/".join(f"{x:.1f}" for x in t) for v, t in vs.items()) + f"   plan {plans[key]}")
