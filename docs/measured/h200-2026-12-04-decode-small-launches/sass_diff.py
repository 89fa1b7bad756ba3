"""Compare two kernel libraries' SASS function by function (cuobjdump -sass): the functions whose bodies differ, and
those in one library only. The old library's digits kernels are matched to the new ones of 8 warps (a template
argument inserted after the type)."""
import re, subprocess, sys

def functions(lib):
    out = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True, check=True).stdout
    funcs, name, body = {}, None, []
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name: funcs[name] = "\n".join(body)
            name, body = m.group(1), []
        elif name is not None:
            body.append(line.strip())
    if name: funcs[name] = "\n".join(body)
    return funcs

old, new = functions(sys.argv[1]), functions(sys.argv[2])
old = {re.sub(r"(woq_decode_digits_kernelI(?:13__nv_bfloat16|6__half))", r"\1Li8E", k): v for k, v in old.items()}
same = [k for k in old if k in new and old[k] == new[k]]
diff = [k for k in old if k in new and old[k] != new[k]]
only_old = [k for k in old if k not in new]
only_new = [k for k in new if k not in old]
print(f"functions: old {len(old)}, new {len(new)}; identical {len(same)}, differing {len(diff)}, "
      f"only old {len(only_old)}, only new {len(only_new)}")
for k in diff[:20]: print("DIFF", k)
for k in only_old[:10]: print("ONLY_OLD", k)
kinds = {}
for k in only_new: kinds[re.sub(r"I.*", "", k)] = kinds.get(re.sub(r"I.*", "", k), 0) + 1
print("only new by name:", kinds)
