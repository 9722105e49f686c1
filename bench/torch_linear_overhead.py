"""Host time per QAT linear call on CUDA: how much a training step's host work grows when an
nn.Linear becomes qatgraph.torch's 8da4w QATLinear (and torchao's), on shapes small enough
that the GPU never holds the host back. Each row is the mean host time of a forward +
backward of one layer over `--calls` calls after a warm-up, with the device synchronised
only before and after the loop.

    PYTHONPATH=<build>/python:<torchao> python3 bench/torch_linear_overhead.py
"""
import argparse
import time

import torch

import qatgraph.torch as qgt


def host_us(layer, x, calls):
    dy = torch.ones(x.shape[0], layer.out_features, device=x.device, dtype=x.dtype)
    for _ in range(20):
        layer(x).backward(dy)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        layer(x).backward(dy)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def forward_us(layer, x, calls):
    with torch.no_grad():
        for _ in range(20):
            layer(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            layer(x)
        t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def fresh():
        return torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to("cuda", torch.bfloat16)

    variants = [("nn.Linear (float)", fresh())]
    variants.append(("qatgraph.torch 8da4w", qgt.prepare_qat(fresh(), "8da4w", group_size=32)))
    try:
        from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer
        variants.append(("torchao 8da4w", Int8DynActInt4WeightQATQuantizer(groupsize=32).prepare(fresh())))
    except ImportError as e:
        print(f"torchao left out: {e}")
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; Linear 256 -> 256, bf16, "
          f"x [16, 256], {args.calls} calls\n")
    print("| layer | host us: forward (no grad) | host us: forward + backward |")
    print("|---|---|---|")
    for name, layer in variants:
        layer = layer[0]
        print(f"| {name} | {forward_us(layer, x, args.calls):.1f} | "
              f"{host_us(layer, x, args.calls):.1f} |")


if __name__ == "__main__":
    main()
