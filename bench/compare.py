"""Joins `qat bench --json` with bench/torch_bench.py output into one table:
case | ours | unfused ours | PyTorch eager | torch.compile | copy | ratios to copy | speed-up.

    python3 bench/compare.py ours.json torch.json [--markdown]
"""
import json
import sys


def main():
    ours = json.load(open(sys.argv[1]))
    theirs = json.load(open(sys.argv[2]))
    tr = theirs["results"]
    rows = {}
    for m in ours:
        r = rows.setdefault(m["case"], {"copy": m["copy_us"], "kernels": m["kernels"]})
        r["unfused" if m["variant"] == "unfused" else "ours"] = m["us"]
    head = ("case", "ours us", "unfused us", "torch us", "compile us", "copy us", "ours/copy",
            "unfused/copy", "torch/copy", "compile/copy", "torch/ours")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    fmt = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
    for case, r in rows.items():
        t = tr.get(case, {})
        ours_us, unf, copy = r.get("ours"), r.get("unfused"), r["copy"]
        te, tc = t.get("eager_us"), t.get("compile_us")
        tcopy = t.get("copy_us")
        cells = [case, fmt(ours_us), fmt(unf), fmt(te), fmt(tc), fmt(copy),
                 fmt(ours_us / copy if ours_us else None, 2), fmt(unf / copy if unf else None, 2),
                 fmt(te / tcopy if te and tcopy else None, 2), fmt(tc / tcopy if tc and tcopy else None, 2),
                 fmt(te / ours_us if te and ours_us else None, 2)]
        print("| " + " | ".join(cells) + " |")
    print(f"\nPyTorch {theirs.get('torch')} on {theirs.get('device')}; ratios use each side's own copy time.")


if __name__ == "__main__":
    main()
