"""Per-op table on CUDA: PyTorch's quantization ops against qatgraph's called from torch
(qatgraph.torch), each timed from Python as a training script calls it, in one run.

    PYTHONPATH=<build>/python python3 bench/torch_ops_bench.py [--reps 200] [--json out.json]

Each case is timed with CUDA events over `reps` back-to-back calls after a warm-up, and
reported per call. `copy` is a device copy of the input's bytes (dst.copy_(src)), the floor
any element-wise op pays; the ratio columns are against it and PyTorch / ours."""
import argparse
import json

import torch
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

import qatgraph.torch as qgt
from cuda_timing import per_call_us


def fwd_bwd(op, x, dy):
    def call():
        x.grad = None
        op(x).backward(dy)
    return call


def cases():
    for shape in ([8192, 4096], [2048, 2048], [64, 768]):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device="cuda", dtype=dtype).requires_grad_()
            dy = torch.randn(shape, device="cuda", dtype=dtype)
            name = f"{str(dtype).replace('torch.', '')}{shape}"
            yield (f"fq fwd+bwd per-tensor {name}", x,
                   fwd_bwd(lambda v: torch.fake_quantize_per_tensor_affine(v, 0.1, 3, 0, 255),
                           x, dy),
                   fwd_bwd(lambda v: qgt.fake_quantize_per_tensor_affine(v, 0.1, 3, 0, 255),
                           x, dy))
        x = torch.randn(shape, device="cuda").requires_grad_()
        dy = torch.randn(shape, device="cuda")
        s = torch.rand(shape[0], device="cuda") * 0.1 + 0.01
        z = torch.zeros(shape[0], device="cuda", dtype=torch.int32)
        yield (f"fq fwd+bwd per-channel float32{shape}", x,
               fwd_bwd(lambda v: torch.fake_quantize_per_channel_affine(v, s, z, 0, -128, 127),
                       x, dy),
               fwd_bwd(lambda v: qgt.fake_quantize_per_channel_affine(v, s, z, 0, -128, 127),
                       x, dy))
        theirs = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0,
                              quant_max=255).cuda()
        ours = qgt.FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0,
                                quant_max=255).cuda()
        yield (f"FakeQuantize obs+fq fwd+bwd float32{shape}", x,
               fwd_bwd(theirs, x, dy), fwd_bwd(ours, x, dy))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; us per call\n")
    print("| case | torch us | qatgraph us | copy us | torch/copy | ours/copy | torch/ours |")
    print("|---|---|---|---|---|---|---|")
    for name, x, torch_fn, our_fn in cases():
        src = x.detach().clone()
        dst = torch.empty_like(src)
        copy_us = per_call_us(lambda: dst.copy_(src), args.reps)
        t_us, q_us = per_call_us(torch_fn, args.reps), per_call_us(our_fn, args.reps)
        rows.append({"case": name, "torch_us": t_us, "ours_us": q_us, "copy_us": copy_us})
        print(f"| {name} | {t_us:.1f} | {q_us:.1f} | {copy_us:.1f} | {t_us / copy_us:.2f} | "
              f"{q_us / copy_us:.2f} | {t_us / q_us:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
