"""s32: static opcode mix of the int4 bf16 mixed-input kernels (cuobjdump -sass of the library on stdin)."""
import collections, re, sys
funcs, cur = {}, None
for line in sys.stdin:
    if "Function :" in line:
        cur = line.split("Function :")[1].strip(); funcs[cur] = collections.Counter(); continue
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
    if cur and m:
        funcs[cur][m.group(1) + (m.group(2) or "")] += 1
for name, c in funcs.items():
    if "Uint4Minus8" in name and "bfloat16" in name and ("Li256E" in name or "ILi256E" in name):
        print(name[:160], sum(c.values()))
        print("  ", ", ".join(f"{k} {v}" for k, v in c.most_common(40)))
