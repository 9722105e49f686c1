"""Joins the CPU thread-scaling run of scripts/cpu_threads_bench.sh into one markdown file:
our [8192, 4096] f32 cases per thread count (`qat --threads n bench --json`, files
ours_<n>.json), PyTorch's (bench/torch_cpu_threads.py, torch.json) and the wall times of
`qat train --compare` with 1 and N threads (train_<model>_<n>.txt / .seconds).

Each of our rows is held against two copies timed in the same `qat bench` run with the same
thread count, on the thread pool in the kernels' chunks: one of x's bytes, and one of the
bytes the case's kernels read + write (moved_bytes: each node's inputs once and outputs
once), so ours / copy says how far a case is from the memory bandwidth at that thread count.

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
    """label -> {threads: row} from ours_<n>.json (the fused variant of fusable cases)."""
    out = {}
    for path in glob.glob(os.path.join(work, "ours_*.json")):
        n = int(re.search(r"ours_(\d+)\.json$", path).group(1))
        for row in json.load(open(path)):
            if row["variant"] in ("fused", "-"):
                out.setdefault(row["case"], {})[n] = row
    return out


def copy_columns(row):
    """ours GB/s, pool copy of x ms, ours / that, copy of the moved bytes ms, ours / that,
    that copy's GB/s; None where the JSON predates the pool copies (or on a GPU)."""
    us, moved = row["us"], row.get("moved_bytes") or 0
    px, pm = row.get("pool_copy_us") or 0, row.get("pool_copy_moved_us") or 0
    if not (moved and px and pm):
        return [None] * 6
    return [moved / us / 1e3, px / 1000, us / px, pm / 1000, us / pm, moved / pm / 1e3]


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def op_table(work):
    mine = ours(work)
    torch_path = os.path.join(work, "torch.json")
    torch = json.load(open(torch_path)) if os.path.exists(torch_path) else {"torch": None, "results": {}}
    lines = [
        "| case | threads | ours ms | ours speedup | ours GB/s | copy x ms | ours / copy x "
        "| copy moved ms | ours / copy moved | copy GB/s | PyTorch ms | PyTorch speedup "
        "| PyTorch / ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in sorted(mine):
        t = {int(k): v for k, v in torch["results"].get(label, {}).items()}
        for n in sorted(mine[label]):
            row, p = mine[label][n], t.get(n)
            o = row["us"]
            o1, p1 = mine[label][1]["us"] if 1 in mine[label] else None, t.get(1)
            gbps, cx, rx, cm, rm, cgbps = copy_columns(row)
            lines.append(
                f"| {label} | {n} | {fmt(o / 1000)} | {fmt(o1 / o if o1 else None, 1)} | "
                f"{fmt(gbps, 1)} | {fmt(cx)} | {fmt(rx)} | {fmt(cm)} | {fmt(rm)} | "
                f"{fmt(cgbps, 1)} | "
                f"{fmt(p / 1000 if p else None)} | {fmt(p1 / p if p and p1 else None, 1)} | "
                f"{fmt(p / o if p else None)} |")
    moved = sorted({(label, rows[n].get("moved_bytes")) for label, rows in mine.items()
                    for n in rows if rows[n].get("moved_bytes")})
    if moved:
        lines += ["", "Bytes the kernels read + write per launch (moved): " + "; ".join(
            f"{label} {b / 2**20:.1f} MiB" for label, b in moved) + "."]
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
        "obs+fq is our fused observer + fake-quant against torch.fused_moving_avg_obs_fake_quant. "
        "copy x = a copy of x's bytes and copy moved = a copy of the bytes the case's kernels "
        "read + write (each kernel's inputs once and outputs once; a copy of B bytes moves 2B), "
        "both on our thread pool in the kernels' chunks with the same thread count, timed in the "
        "same run; ours GB/s and copy GB/s = the moved bytes / time. The moved bytes count one "
        "pass per kernel: the fused per-tensor obs+fq reads x twice (its statistics must be "
        "complete before any element is quantized), so about 1.5 x the moved-bytes copy is its "
        "bandwidth bound.",
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
