#!/usr/bin/env bash
# Static instruction counts of CUDA kernels, from the SASS of an object file that is
# already built (this script builds nothing). For every kernel whose demangled name
# matches PATTERN (grep -E) it prints:
#   total  every instruction of the kernel (the NOP padding and the final self-branch not
#          counted);
#   routes the instruction counts of every path through the code (branches taken or not,
#          loops left out) from just after a 128-bit global load to the end of the block of
#          the next 128-bit global store. For the flat pack kernels of ops/ these are the
#          paths of one vectorised pack (disabled, fast, exact element path, ...), from the
#          loaded registers to the stored result; divided by ELEMENTS (8 for one pack) they
#          are instructions per element. Predicated instructions count whether or not they
#          run (they issue);
#   loop   each backward branch (a loop) with the instructions of its body, if any.
# With -v, the opcodes of one route of each length are listed by count, so a change can be
# attributed.
#
#   scripts/sass_per_element.sh [-v] OBJECT PATTERN [ELEMENTS]
#   e.g. scripts/sass_per_element.sh \
#          build/CMakeFiles/qatgraph.dir/ops/fake_quantize/fake_quantize_cuda.cu.o \
#          'fake_quantize_kernel<__nv_bfloat16, float, int, unsigned int, .*0>' 8
#
# Needs cuobjdump and nvdisasm: taken from $CUOBJDUMP, PATH or /usr/local/cuda/bin; when
# none is there (the CUDA toolkit packages of some images lack them) the PyPI packages
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm are installed once into .venv-sass.
set -euo pipefail
verbose=0
if [ "${1:-}" = "-v" ]; then
  verbose=1
  shift
fi
if [ $# -lt 2 ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
object=$1
[ -f "$object" ] || { echo "sass_per_element: no object file $object" >&2; exit 1; }
object=$(realpath "$object")
cd "$(dirname "$0")/.."  # the repository root, where .venv-sass lives
pattern=$2
elements=${3:-0}

find_cuobjdump() {
  if [ -n "${CUOBJDUMP:-}" ]; then echo "$CUOBJDUMP"; return; fi
  local c
  for c in "$(command -v cuobjdump || true)" /usr/local/cuda/bin/cuobjdump; do
    if [ -n "$c" ] && [ -x "$c" ] && [ -x "$(dirname "$c")/nvdisasm" ]; then
      echo "$c"
      return
    fi
  done
  local venv=.venv-sass
  local bin
  bin=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu*/bin 2>/dev/null | head -1 || true)
  if [ -z "$bin" ] || [ ! -x "$bin/cuobjdump" ]; then
    echo "sass_per_element: installing cuobjdump and nvdisasm into $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "nvidia-cuda-cuobjdump==13.2.86" "nvidia-cuda-nvdisasm==13.2.78" >&2
    bin=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu*/bin | head -1)
  fi
  echo "$bin/cuobjdump"
}

cuobjdump=$(find_cuobjdump)
# cuobjdump looks for nvdisasm beside itself only through PATH.
sass=$(mktemp)
trap 'rm -f "$sass"' EXIT
PATH="$(dirname "$cuobjdump"):$PATH" "$cuobjdump" -sass "$object" > "$sass"
names=$(grep -o 'Function : [^ ]*' "$sass" | cut -d' ' -f3 | sort -u)
[ -n "$names" ] || { echo "sass_per_element: no kernels in $object" >&2; exit 1; }
# Demangled names, one a line, in the order of $names.
demangled=$(c++filt <<<"$names")

SASS_FILE="$sass" NAMES="$names" DEMANGLED="$demangled" PATTERN="$pattern" ELEMENTS="$elements" \
  VERBOSE="$verbose" python3 - <<'EOF'
import os, re, sys
from collections import Counter

names = os.environ["NAMES"].split("\n")
demangled = dict(zip(names, os.environ["DEMANGLED"].split("\n")))
pattern = re.compile(os.environ["PATTERN"])
elements = int(os.environ["ELEMENTS"])
verbose = os.environ["VERBOSE"] == "1"

# Split the dump into functions: {mangled name: [(address, text)]}.
functions, current = {}, None
line_re = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*(/\*.*)?$")
for line in open(os.environ["SASS_FILE"]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        current = functions.setdefault(m.group(1), [])
        continue
    m = line_re.match(line)
    if current is not None and m:
        current.append((int(m.group(1), 16), m.group(2).rstrip(" ;")))

def opcode(text):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
    return t.split()[0] if t.split() else ""

def branch_target(text):
    m = re.search(r"\b(?:BRA|BRX|CALL\.REL(?:\.NOINC)?|BSSY\s+B\d+,)\s.*?(0x[0-9a-f]+)\s*$", text)
    if not m:
        return None
    return int(m.group(1), 16)

def predicated(text):
    return text.startswith("@") and not text.startswith("@PT ")

def analyse(instrs):
    # Drop the trailing self-branch and NOP padding.
    body = [(a, t) for a, t in instrs if opcode(t) != "NOP"]
    while body and opcode(body[-1][1]) == "BRA" and branch_target(body[-1][1]) == body[-1][0]:
        body.pop()
    targets = set()
    for a, t in body:
        op = opcode(t)
        if op in ("BRA", "BRX", "CALL.REL", "CALL.REL.NOINC"):
            tgt = branch_target(t)
            if tgt is not None:
                targets.add(tgt)
    # Basic blocks: a new block starts at a branch target and after a branch, EXIT or RET.
    blocks, cur = [], []
    for a, t in body:
        if a in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append((a, t))
        if opcode(t) in ("BRA", "BRX", "EXIT", "RET.REL", "RET.ABS", "CALL.REL",
                         "CALL.REL.NOINC"):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    # Routes: paths through the blocks (no backward edge) from just after a 128-bit global
    # load to the end of the block of the first 128-bit global store, each branch taken or
    # not.
    def is_load(t):
        return opcode(t).startswith("LDG.E.128")
    def successors(k):
        a, t = blocks[k][-1]
        op = opcode(t)
        nxt = [k + 1] if k + 1 < len(blocks) else []
        if op in ("EXIT", "RET.REL", "RET.ABS"):
            return [] if not predicated(t) else nxt
        if op in ("BRA", "BRX"):
            tgt = branch_target(t)
            if tgt is None or tgt <= a:
                return nxt if predicated(t) else []
            taken = [i for i, bl in enumerate(blocks) if bl[0][0] == tgt]
            conditional = predicated(t) or re.search(r"BRA\s+!?U?P\d", t)
            return (nxt if conditional else []) + taken
        return nxt
    # suffixes[k]: {length: one route} of the routes from the start of block k to the store,
    # memoised (the number of paths can grow exponentially, the number of lengths cannot).
    memo = {}
    def suffixes(k, start=0):
        key = (k, start)
        if key in memo:
            return memo[key]
        part = blocks[k][start:]
        out = {}
        if start == 0 and any(is_load(t) for _, t in part):
            pass  # counted from its own last load
        elif any(opcode(t).startswith("STG.E.128") for _, t in part):
            out[len(part)] = part
        else:
            for n in successors(k):
                if n > k:
                    for length, route in suffixes(n).items():
                        out.setdefault(len(part) + length, part + route)
        memo[key] = out
        return out
    found = {}
    for k, bl in enumerate(blocks):
        loads = [i for i, (_, t) in enumerate(bl) if is_load(t)]
        if not loads:
            continue
        if loads[-1] + 1 < len(bl):
            found.update(suffixes(k, loads[-1] + 1))
        else:
            for n in successors(k):
                if n > k:
                    found.update(suffixes(n))
    routes = list(found.values())
    loops = [(branch_target(t), a) for a, t in body
             if opcode(t) == "BRA" and branch_target(t) is not None and branch_target(t) <= a]
    return body, sorted(routes, key=len), loops

matched = 0
for name in names:
    if name not in functions or not pattern.search(demangled[name]):
        continue
    matched += 1
    body, routes, loops = analyse(functions[name])
    short = re.sub(r"qg::\(anonymous namespace\)::|\(anonymous namespace\)::", "",
                   demangled[name])
    depth = 0  # drop the parameter list: the last top-level parentheses
    for k in range(len(short) - 1, -1, -1):
        depth += short[k] == ")"
        depth -= short[k] == "("
        if depth == 0:
            short = short[:k]
            break
    short = short.replace("void ", "")
    print(short)
    print(f"  total {len(body)}")
    lengths = sorted({len(r) for r in routes})
    shown = [str(n) + (f" ({n / elements:.2f}/element)" if elements else "") for n in lengths]
    if len(shown) > 12:
        shown = shown[:12] + [f"... {len(shown) - 12} more, up to {lengths[-1]}"]
    print("  routes from a 128-bit load to the next 128-bit store: " +
          (", ".join(shown) if shown else "none"))
    for start, end in loops:
        n = sum(1 for a, _ in body if start <= a <= end)
        print(f"  loop 0x{start:04x}..0x{end:04x}: {n} instructions")
    if verbose:
        seen = set()
        for r in routes:
            if len(r) in seen:
                continue
            seen.add(len(r))
            counts = Counter(opcode(t).split(".")[0] for _, t in r)
            print(f"    {len(r)}: " + ", ".join(f"{op} {n}" for op, n in counts.most_common()))
if matched == 0:
    sys.exit(f"sass_per_element: no kernel matches {os.environ['PATTERN']}")
EOF
