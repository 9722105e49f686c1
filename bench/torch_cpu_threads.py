"""PyTorch side of the CPU thread-scaling run (scripts/cpu_threads_bench.sh): the three
[8192, 4096] f32 cases below with torch.set_num_threads(n) for each n, in one process,
timed as `qat bench` times ours (median wall time of single launches after warm-up):

  obs+fq per-tensor      torch.fused_moving_avg_obs_fake_quant (moving-average observer)
  fq fwd per-tensor      torch.fake_quantize_per_tensor_affine
  fq fwd+bwd per-tensor  the same, then backward with a given dy

    python3 bench/torch_cpu_threads.py --threads 1,2,4,8,16 --json torch_threads.json

Labels match ours: "<case> f32[<rows>, <cols>]"; the JSON maps label -> {threads: us}.
"""
import argparse
import json
import statistics
import time

import torch


def median_us(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2,4,8,16", help="comma-separated thread counts")
    ap.add_argument("--shape", default="8192,4096")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    rows, cols = (int(v) for v in args.shape.split(","))
    g = torch.Generator().manual_seed(7)
    x = torch.randn((rows, cols), generator=g)
    dy = torch.randn((rows, cols), generator=g)
    scale = torch.tensor([0.02])
    zp = torch.tensor([128], dtype=torch.int32)
    on = torch.ones(1, dtype=torch.long)
    state = dict(rmin=torch.full((1,), float("inf")), rmax=torch.full((1,), float("-inf")),
                 scale=torch.ones(1), zp=torch.zeros(1, dtype=torch.int32))

    def obs_fq():
        torch.fused_moving_avg_obs_fake_quant(x, on, on, state["rmin"], state["rmax"], state["scale"],
                                              state["zp"], 0.01, 0, 255, 0, False, False)

    def fq():
        torch.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255)

    def fq_fwd_bwd():
        xg = x.detach().requires_grad_(True)
        torch.fake_quantize_per_tensor_affine(xg, scale, zp, 0, 255).backward(dy)

    cases = {"obs+fq per-tensor": obs_fq, "fq fwd per-tensor": fq, "fq fwd+bwd per-tensor": fq_fwd_bwd}
    results = {f"{name} f32[{rows}, {cols}]": {} for name in cases}
    for n in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(n)
        for name, fn in cases.items():
            us = median_us(fn, args.reps)
            results[f"{name} f32[{rows}, {cols}]"][str(n)] = us
            print(f"torch {torch.__version__} threads {n:3d} {name:24s} {us / 1000:9.2f} ms", flush=True)
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
