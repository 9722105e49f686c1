"""A whole QAT training step in PyTorch on CUDA, in one run: the float model, torch.ao's eager
prepare_qat (default fbgemm QAT qconfig, fuse_modules_qat for conv-bn-relu) and
qatgraph.torch.prepare_qat (the same quantizers on qatgraph's kernels), each stepped with SGD.

    PYTHONPATH=<build>/python python3 bench/torch_prepare_step_bench.py [--reps 50]

The CNN: conv(3->32)-bn-relu, conv(32->64)-bn-relu, max-pool, conv(64->64)-bn-relu, max-pool,
linear(64*8*8 -> 10), batch 128 of 3x32x32, f32. Each step is forward, cross-entropy,
backward and optimizer.step(), timed with CUDA events over `reps` steps after 10 warm-up steps
(PyTorch's observers wait for the device each step, qatgraph's do not)."""
import argparse
import copy

import torch
from torch import nn
from torch.ao import quantization as tq

import qatgraph.torch as qgt
from cuda_timing import per_call_us


def cnn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    return nn.Sequential(*block(3, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 64),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10))


def torch_ao_qat(model):
    model = copy.deepcopy(model).train()
    tq.fuse_modules_qat(model, [["0", "1", "2"], ["3", "4", "5"], ["7", "8", "9"]], inplace=True)
    model.qconfig = tq.get_default_qat_qconfig("fbgemm")
    return tq.prepare_qat(model)


def step_time(model, x, y, reps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return per_call_us(step, reps) / 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(128, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, [128], device="cuda")
    base = cnn().cuda().train()
    rows = [("float", base), ("torch.ao prepare_qat", torch_ao_qat(base)),
            ("qatgraph.torch.prepare_qat", qgt.prepare_qat(base))]
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; CNN batch 128, f32\n")
    print("| step | ms | / float |")
    print("|---|---|---|")
    float_ms = None
    for name, model in rows:
        ms = step_time(model, x, y, args.reps)
        float_ms = float_ms or ms
        print(f"| {name} | {ms:.3f} | {ms / float_ms:.2f} |")


if __name__ == "__main__":
    main()
