"""PyTorch side of the whole-step comparison (PERF.md "Whole training steps"):
one training step (forward, backward, SGD) of

  cnn:          4 conv(3x3, pad 1)-bn-relu blocks, 64 channels, 3x32x32 input, batch 256,
                global average pool, linear 64 -> 10, cross-entropy;
  transformer:  one pre-norm block (d=768, 12 heads, MLP 3072 with GELU, residuals),
                sequence 512, batch 8, a linear 768 -> 10 head on every token,
                cross-entropy over the 4096 tokens;

float and QAT (eager `prepare_qat` with the default fbgemm-style QAT qconfig: per-tensor
affine uint8 activations, per-channel symmetric int8 weights; ConvBnReLU2d fused for the
CNN), TF32 off unless --tf32. Times are the median of CUDA-event-timed steps after warm-up.

    python3 bench/torch_model_steps.py --json torch_steps.json [--tf32]

The qatgraph side is `qat bench --steps` (same shapes, same optimizer); bench/compare.py
joins the two JSON files.
"""
import argparse
import json
import statistics
import warnings

import torch
import torch.nn as nn
import torch.ao.quantization as tq


class ConvBnRelu(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class Cnn(nn.Module):
    def __init__(self, channels=64, blocks=4):
        super().__init__()
        self.quant = tq.QuantStub()
        chans = [3] + [channels] * blocks
        self.blocks = nn.Sequential(*[ConvBnRelu(a, b) for a, b in zip(chans[:-1], chans[1:])])
        self.head = nn.Linear(channels, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.blocks(self.quant(x))
        x = x.mean(dim=(2, 3))
        return self.dequant(self.head(x))

    def fuse(self):
        for i in range(len(self.blocks)):
            tq.fuse_modules_qat(self.blocks[i], [["conv", "bn", "relu"]], inplace=True)


class Block(nn.Module):
    """Pre-norm transformer block with explicit q/k/v/out projections (nn.Linear, so
    prepare_qat puts fake-quant on every weight and activation of the projections)."""

    def __init__(self, d=768, heads=12, mlp=3072):
        super().__init__()
        self.heads = heads
        self.quant = tq.QuantStub()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)
        self.act = nn.GELU()
        self.head = nn.Linear(d, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        x = self.quant(x)
        y = self.ln1(x)
        split = lambda t: t.reshape(b, s, h, d // h).transpose(1, 2)
        q, k, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, s, d))
        x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
        return self.dequant(self.head(x).reshape(b * s, 10))


def build(kind, qat, device):
    torch.manual_seed(0)
    if kind == "cnn":
        m = Cnn()
        x = torch.randn(256, 3, 32, 32)
        y = torch.randint(0, 10, (256,))
    else:
        m = Block()
        x = torch.randn(8, 512, 768)
        y = torch.randint(0, 10, (8 * 512,))
    m.train()
    if qat:
        if kind == "cnn":
            m.fuse()
        m.qconfig = tq.get_default_qat_qconfig("fbgemm")
        m = tq.prepare_qat(m)
    return m.to(device), x.to(device), y.to(device)


def time_step(kind, qat, device, reps, warmup, autocast):
    m, x, y = build(kind, qat, device)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tf32", action="store_true", help="also time with TF32 matmul/conv on")
    ap.add_argument("--bf16", action="store_true", help="also time under bf16 autocast")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    device = torch.device("cuda")
    rows = []
    modes = [("fp32", False, False)]
    if args.tf32:
        modes.append(("tf32", True, False))
    if args.bf16:
        modes.append(("bf16-autocast", False, True))
    for mode, tf32, autocast in modes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        for kind in ("cnn", "transformer"):
            for qat in (False, True):
                us = time_step(kind, qat, device, args.reps, args.warmup, autocast)
                label = f"step {kind} {'qat' if qat else 'float'} {mode}"
                rows.append({"case": label, "torch_us": us})
                print(f"{label:<40} {us / 1000:8.3f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
