"""A whole QAT training step in PyTorch on CUDA, in one run: the float model, torch.ao's eager
prepare_qat (default fbgemm QAT qconfig, fuse_modules_qat for conv-bn-relu) and
qatgraph.torch.prepare_qat (the same quantizers on qatgraph's kernels), each stepped with SGD.

    PYTHONPATH=<build>/python python3 bench/torch_prepare_step_bench.py [--reps 50]

The CNN: conv(3->32)-bn-relu, conv(32->64)-bn-relu, max-pool, conv(64->64)-bn-relu, max-pool,
linear(64*8*8 -> 10), batch 128 of 3x32x32, f32. Each step is forward, cross-entropy,
backward and optimizer.step(), timed with CUDA events over `reps` steps after 10 warm-up steps
(PyTorch's observers wait for the device each step, qatgraph's do not).

--cuda-graph: the float and qatgraph steps are each captured once as a CUDA graph and replayed
(no host work per step). torch.ao's QAT step stays eager: its capture fails (on PyTorch 2.11
with "operation failed due to a previous error during capture"), so eager is the fastest it
runs; a capture attempt after every timing prints the error it gives."""
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


def make_step(model, x, y, keep_grads=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=not keep_grads)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def graphed(step):
    """step captured as one CUDA graph after three warm-up steps on a side stream (which make
    the optimizer's momentum buffers and qatgraph's prepared kernels); returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def step_time(model, x, y, reps, cuda_graph=False):
    step = make_step(model, x, y, keep_grads=cuda_graph)
    if cuda_graph:
        step = graphed(step)
    return per_call_us(step, reps) / 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay the float and qatgraph steps as CUDA graphs")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(128, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, [128], device="cuda")
    base = cnn().cuda().train()
    graph = args.cuda_graph
    rows = [("float", base, graph), ("torch.ao prepare_qat", torch_ao_qat(base), False),
            ("qatgraph.torch.prepare_qat", qgt.prepare_qat(base), graph)]
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; CNN batch 128, f32"
          f"{'; float and qatgraph steps replayed as CUDA graphs' if graph else ''}\n")
    print("| step | ms | / float | / torch.ao |")
    print("|---|---|---|---|")
    times = {}
    for name, model, as_graph in rows:
        times[name] = ms = step_time(model, x, y, args.reps, as_graph)
        ao = times.get("torch.ao prepare_qat")
        print(f"| {name}{' (CUDA graph)' if as_graph else ' (eager)'} | {ms:.3f} | "
              f"{ms / times['float']:.2f} | {ms / ao if ao else float('nan'):.2f} |")
    if graph:  # last, after every timing: a failed capture may leave the device unusable
        try:
            graphed(make_step(torch_ao_qat(base), x, y, keep_grads=True))
            print("\ntorch.ao's QAT step captured")
        except Exception as e:  # noqa: BLE001 (report whatever capture raises)
            print(f"\ntorch.ao's QAT step cannot be captured: {type(e).__name__}: "
                  f"{str(e).splitlines()[0]}")


if __name__ == "__main__":
    main()
