"""Executed warp instructions by SASS opcode from `ncu --page source --print-source sass --csv` (argv[1]), and the
total: the comparison of two builds' instruction mixes."""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next(i for i, r in enumerate(rows) if "Source" in r and any("Instructions Executed" in c for c in r))
h = rows[head]
src = h.index("Source"); ex = next(i for i, c in enumerate(h) if c.startswith("Instructions Executed"))
ops = collections.Counter()
for r in rows[head + 1:]:
    if len(r) <= max(src, ex) or not r[ex].replace(",", "").strip().isdigit():
        continue
    tok = r[src].split()
    op = tok[1] if tok and tok[0].startswith("@") and len(tok) > 1 else (tok[0] if tok else "?")
    ops[op.split(".")[0]] += int(r[ex].replace(",", ""))
total = sum(ops.values())
print("total", total)
for op, n in ops.most_common(30):
    print(f"{op:12s} {n:12d} {n / total:6.3f}")
