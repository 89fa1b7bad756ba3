"""Markdown tables of issue 46's and 47's targets from `moe-build bench --quant Q --json` files (one per mode):
python3 table.py bench_*.json. Per point: the floor and ours (graph replay, us), ours over the floor, the target
(the floor limit at 1-256 / 1-16 tokens, else the bf16 relation the issue asks), met or missed, the bf16 layer."""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    pts = d["points"]
    if not pts:
        continue
    q = pts[0]["quant"]
    fp8 = q.startswith("fp8")
    print(f"\n{q} ({d.get('device', '?')}; read {pts[0]['ceilings']['read_bytes_per_s'] / 1e12:.2f} TB/s)\n")
    print("| layer | tokens | floor | ours (x floor) | bf16 layer | " + ("bf16 / ours | _scaled_grouped_mm / ours |"
                                                                    if fp8 else "ours / bf16 |") + " target |")
    print("|---|---|---|---|---|---|" + ("---|" if fp8 else "") + "---|")
    for p in pts:
        v, t, r = p["variants"], p["targets"], p["ratios"]
        ours = v["ours"]["graph_us"]
        bf16 = v.get("ours_bf16", {}).get("graph_us")
        if "floor" in t:
            lim = t["floor"]["limit_us"]
            tgt = f"<= {lim:.1f}: {'met' if t['floor']['met'] else '**missed**'}"
        elif "vs_bf16" in t and not bf16:
            tgt = "not judged (no bf16 layer)"
        elif "vs_bf16" in t:
            vb = t["vs_bf16"]
            tgt = (f"bf16 / {vb['at_least']}" if fp8 else f"ours <= bf16 x {1 / vb['at_least']:.2f}") + \
                f": {'met' if vb['met'] else '**missed**'}"
        else:
            tgt = ", ".join(f"{k}: {x.get('met')}" for k, x in t.items() if isinstance(x, dict) and "met" in x)
        row = f"| {p['shape']} | {p['tokens']} | {p['floor_us']:.1f} | {ours:.1f} ({ours / p['floor_us']:.2f}) | "
        row += f"{bf16:.1f} | " if bf16 else "- | "
        if fp8:
            sg = r.get("scaled_grouped_mm_over_ours")
            row += f"{bf16 / ours:.2f} | " if bf16 else "- | "
            row += f"{sg:.2f} | " if sg else "- | "
        else:
            row += f"{ours / bf16:.3f} | " if bf16 else "- | "
        print(row + tgt + " |")
