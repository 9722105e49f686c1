"""Joins `qat steps --json` (ours) with bench/torch_model_steps.py --json (PyTorch) into one
table of whole training steps: our time, PyTorch's, their ratio, and each side's QAT step
over its own float step (the PERF.md targets: ours float <= 1.1x PyTorch float; ours QAT
<= 1.05x ours float; ours QAT faster than PyTorch QAT).

    python3 bench/compare_steps.py ours.json torch.json [more_ours.json ...]
"""
import json
import sys


def main():
    ours = {}
    for path in [sys.argv[1]] + sys.argv[3:]:
        for r in json.load(open(path)):
            ours[r["case"]] = r
    theirs = json.load(open(sys.argv[2]))
    torch_us = {r["case"]: r["torch_us"] for r in theirs["rows"]}
    print("| case | ours ms | kernels | PyTorch ms | PyTorch / ours | ours qat / ours float | "
          "PyTorch qat / PyTorch float |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
    for case in sorted(set(ours) | set(torch_us)):
        o = ours.get(case, {}).get("ours_us")
        t = torch_us.get(case)
        float_case = case.replace(" qat ", " float ")
        oq = o / ours[float_case]["ours_us"] if " qat " in case and o and float_case in ours else None
        tq = t / torch_us[float_case] if " qat " in case and t and float_case in torch_us else None
        print(f"| {case} | {fmt(o and o / 1000)} | {ours.get(case, {}).get('kernels', '-')} | "
              f"{fmt(t and t / 1000)} | {fmt(t / o if t and o else None, 2)} | {fmt(oq, 2)} | "
              f"{fmt(tq, 2)} |")
    print(f"\nPyTorch {theirs.get('torch')}; ours replayed as one CUDA graph per step.")


if __name__ == "__main__":
    main()
