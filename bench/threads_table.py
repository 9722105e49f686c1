"""Joins the CPU thread-scaling run of scripts/cpu_threads_bench.sh into one markdown file:
our [8192, 4096] f32 cases per thread count (`qat --threads n bench --json`, files
ours_<n>.json), PyTorch's (bench/torch_cpu_threads.py, torch.json) and the wall times of
`qat train --compare` with 1 and N threads (train_<model>_<n>.txt / .seconds).

    python3 bench/threads_table.py WORK_DIR OUT.md
"""
import glob
import json
import os
import platform
import re
import sys


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ours(work):
    """label -> {threads: us} from ours_<n>.json (the fused variant of fusable cases)."""
    out = {}
    for path in glob.glob(os.path.join(work, "ours_*.json")):
        n = int(re.search(r"ours_(\d+)\.json$", path).group(1))
        for row in json.load(open(path)):
            if row["variant"] in ("fused", "-"):
                out.setdefault(row["case"], {})[n] = row["us"]
    return out


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def op_table(work):
    mine = ours(work)
    torch_path = os.path.join(work, "torch.json")
    torch = json.load(open(torch_path)) if os.path.exists(torch_path) else {"torch": None, "results": {}}
    lines = [
        "| case | threads | ours ms | ours speedup | PyTorch ms | PyTorch speedup | PyTorch / ours |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in sorted(mine):
        t = {int(k): v for k, v in torch["results"].get(label, {}).items()}
        for n in sorted(mine[label]):
            o, p = mine[label][n], t.get(n)
            o1, p1 = mine[label].get(1), t.get(1)
            lines.append(
                f"| {label} | {n} | {fmt(o / 1000)} | {fmt(o1 / o if o1 else None, 1)} | "
                f"{fmt(p / 1000 if p else None)} | {fmt(p1 / p if p and p1 else None, 1)} | "
                f"{fmt(p / o if p else None)} |")
    return torch["torch"], lines


def result_lines(path):
    """The accuracy lines of a `qat train --compare` log (per seed and the table)."""
    return [l for l in open(path) if "%" in l]


def train_table(work):
    runs = {}
    for path in glob.glob(os.path.join(work, "train_*_*.seconds")):
        model, n = re.search(r"train_(\w+)_(\d+)\.seconds$", path).groups()
        runs.setdefault(model, {})[int(n)] = (float(open(path).read()), path[:-len(".seconds")] + ".txt")
    if not runs:
        return []
    lines = ["| model | threads | wall s | speedup | accuracies identical to 1 thread |",
             "|---|---|---|---|---|"]
    for model in sorted(runs):
        base_s, base_txt = runs[model].get(1, (None, None))
        for n in sorted(runs[model]):
            s, txt = runs[model][n]
            same = "-" if base_txt is None or n == 1 else (
                "yes" if result_lines(txt) == result_lines(base_txt) else "NO")
            lines.append(f"| {model} | {n} | {s:.1f} | {fmt(base_s / s if base_s else None, 1)} | {same} |")
    return lines


def main():
    work, out = sys.argv[1], sys.argv[2]
    torch_version, ops = op_table(work)
    text = [
        "# CPU thread scaling",
        "",
        f"`scripts/cpu_threads_bench.sh` on {cpu_name()}, {os.cpu_count()} CPUs "
        f"({len(os.sched_getaffinity(0))} available to the process); PyTorch {torch_version or 'not found'}. "
        "Median wall time of single launches; speedup = time with 1 thread / time with n; "
        "obs+fq is our fused observer + fake-quant against torch.fused_moving_avg_obs_fake_quant.",
        "",
    ] + ops
    train = train_table(work)
    if train:
        text += ["", "`qat train --compare --device cpu` wall time (whole command):", ""] + train
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
