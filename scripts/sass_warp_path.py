#!/usr/bin/env python3
"""Executed instructions of one warp through a one-pass group kernel, from static SASS.

scripts/sass_per_element.sh counts routes between 128-bit loads and 128-bit stores; the
group packers (ops/int4/group_pack.cuh) store 32-bit words, so this walks one path through
the whole kernel instead and counts every instruction issued on it (predicated ones too):
  - forward conditional branches fall through, except one whose fall-through block calls a
    slow-path subroutine (the division / reciprocal fast paths are taken) or holds the
    high_first nibble swap (0xf0f0f0f0: the low_first path is taken);
  - a backward branch closing a loop of under 20 instructions that shuffles (SHFL, the team
    reduction) is taken ITERS - 1 times (2 iterations for a 4-lane team); other backward
    branches are not taken (one round);
  - a branch on the predicate of a VOTE.ANY (kFiniteFastPath: "a lane saw +/-Inf") follows
    "no lane did", or with --inf "one did".
A warp whose lane 0 stores the group's parameters issues those stores too (they fall
through). Divide by the elements of a lane (32 for INT4 g128: 4 packs of 8) for a count per
element.

  scripts/sass_warp_path.py [--inf] [--iters N] OBJECT KERNEL_REGEX
  e.g. scripts/sass_warp_path.py build/CMakeFiles/qatgraph.dir/ops/int4/int4_cuda.cu.o \\
         'group_pack_kernelI13__nv_bfloat16Li4ELb1E.*Int4CodecIfLb1E'
cuobjdump (and nvdisasm beside it) must be on PATH or in $CUOBJDUMP.
"""
import argparse
import os
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--inf", action="store_true")
ap.add_argument("--iters", type=int, default=2)
ap.add_argument("object")
ap.add_argument("kernel")
args = ap.parse_args()

cuobjdump = os.environ.get("CUOBJDUMP", "cuobjdump")
sass = subprocess.run([cuobjdump, "-sass", args.object], check=True, capture_output=True,
                      text=True).stdout
pattern = re.compile(args.kernel)
functions, current = {}, None
for line in sass.splitlines():
    m = re.search(r"Function : (\S+)", line)
    if m:
        current = functions.setdefault(m.group(1), []) if pattern.search(m.group(1)) else None
        continue
    m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
    if current is not None and m and not m.group(2).startswith("NOP"):
        current.append((int(m.group(1), 16), m.group(2)))
if not functions:
    sys.exit(f"sass_warp_path: no kernel matches {args.kernel}")


def target(text):
    m = re.search(r"BRA\s.*?(0x[0-9a-f]+)$", text)
    return int(m.group(1), 16) if m else None


def walk(ins):
    index = {a: i for i, (a, _) in enumerate(ins)}

    def block_from(i):
        out = []
        while i < len(ins):
            out.append(ins[i][1])
            if re.search(r"\b(BRA|EXIT|RET)", ins[i][1]) and not ins[i][1].startswith("BSSY"):
                break
            i += 1
        return " ".join(out)

    i, count, loops, vote = 0, 0, {}, None
    while i < len(ins):
        a, t = ins[i]
        count += 1
        op = re.sub(r"^@!?P\d+ ", "", t)
        predicated = t.startswith("@")
        m = re.match(r"^VOTE\.ANY (P\d+)", op)
        if m:
            vote = m.group(1)
        elif vote and re.match(r"^\S+ " + vote + r"\b", op):
            vote = None
        if op.startswith("EXIT"):
            if not predicated:
                return count
            i += 1
            continue
        if not op.startswith("BRA"):
            i += 1
            continue
        tgt = target(t)
        if not predicated:
            i = index[tgt]
            continue
        m = re.match(r"^@(!?)(P\d+) ", t)
        if vote and m and m.group(2) == vote:
            taken = (m.group(1) == "!") != args.inf
            i = index[tgt] if taken else i + 1
            continue
        if tgt <= a:
            body = " ".join(x for _, x in ins[index[tgt]:i])
            if "SHFL" in body and i - index[tgt] < 20:
                loops[a] = loops.get(a, 0) + 1
                if loops[a] < args.iters:
                    i = index[tgt]
                    continue
            i += 1
            continue
        fall = block_from(i + 1)
        i = index[tgt] if ("CALL" in fall or "0xf0f0f0f0" in fall) else i + 1
    return count


for name, ins in functions.items():
    print(walk(ins), name)
