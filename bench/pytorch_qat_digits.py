#!/usr/bin/python3
"""The `qat train --compare` recipe in PyTorch eager mode (torch.ao.quantization), for a
side-by-side accuracy comparison on the UCI digits data.

Same data and split (the 80/20 split of `qat train`, reproduced with a Python port of
std::mt19937_64 and the same Fisher-Yates shuffle), same model (`--model mlp`: 64 ->
width x depth LinearReLU -> 10; `--model cnn`: conv-bn-relu blocks on the 1x8x8 image, fused
to ConvBnReLU2d so batch norm is folded into the weight before its fake-quant; both with
QuantStub/DeQuantStub), same quantizers (per-channel symmetric int8 -128..127 or int4 -8..7
weights with moving-average observers, per-tensor affine quint8 0..255 activations, or
0..15 for the A4 rows), same optimizer, epochs, batch and fine-tuning schedule. Weight init and
data order come from torch's RNG, so individual runs differ; compare the means over seeds.

    /usr/bin/python3 bench/pytorch_qat_digits.py [--model cnn] [--epochs 30 ...]
"""
import argparse
import copy
import gzip
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.ao.quantization as tq

DEBIAN_DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
M64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64 (its output sequence is fixed by the C++ standard)."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & M64
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & M64
        self.idx = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.idx = 0

    def next(self):
        if self.idx >= 312:
            self._twist()
        y = self.mt[self.idx]
        self.idx += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & M64

    def below(self, n):  # nn::Rng::below: rejection sampling
        limit = M64 - M64 % n
        while True:
            v = self.next()
            if v < limit:
                return v % n

    def permutation(self, n):  # nn::Rng::permutation
        p = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.below(i + 1)
            p[i], p[j] = p[j], p[i]
        return p


def load_split(path):
    rows = [l.split(",") for l in gzip.open(path, "rt").read().splitlines() if l.strip()]
    x = torch.tensor([[float(v) / 16.0 for v in r[:64]] for r in rows], dtype=torch.float32)
    y = torch.tensor([int(float(r[64])) for r in rows], dtype=torch.int64)
    perm = MT19937_64(0).permutation(len(rows))
    n_test = int(len(rows) * 0.2 + 0.5)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


class Cnn(nn.Module):
    """The `qat train --model cnn` network: the 8x8 digit as a 1x8x8 image through
    conv-bn-relu blocks (3x3, padding 1), a 2x2 max pool after the second, global average
    pooling and a linear classifier."""

    def __init__(self, channels=(16, 32, 32)):
        super().__init__()
        self.quant = tq.QuantStub()
        chans = (1,) + tuple(channels)
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1, bias=False)
                                   for a, b in zip(chans[:-1], chans[1:]))
        self.bns = nn.ModuleList(nn.BatchNorm2d(b) for b in channels)
        self.relus = nn.ModuleList(nn.ReLU() for _ in channels)
        self.pool = nn.MaxPool2d(2)
        self.out = nn.Linear(chans[-1], 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.quant(x.reshape(-1, 1, 8, 8))
        for i, (conv, bn, relu) in enumerate(zip(self.convs, self.bns, self.relus)):
            x = relu(bn(conv(x)))
            if i == 1:
                x = self.pool(x)
        return self.dequant(self.out(x.mean(dim=(2, 3))))

    def fusion_groups(self):
        return [[f"convs.{i}", f"bns.{i}", f"relus.{i}"] for i in range(len(self.convs))]


class Mlp(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.quant = tq.QuantStub()
        dims = [64] + [width] * depth
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.relus = nn.ModuleList(nn.ReLU() for _ in range(depth))
        self.out = nn.Linear(dims[-1], 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        for fc, relu in zip(self.fcs, self.relus):
            x = relu(fc(x))
        return self.dequant(self.out(x))

    def fusion_groups(self):
        return [[f"fcs.{i}", f"relus.{i}"] for i in range(len(self.fcs))]


def qconfig(weight_bits, observer, act_bits=8):
    wmin, wmax = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}[weight_bits]
    amax = (1 << act_bits) - 1
    if observer == "minmax":
        act_obs, w_obs = tq.MinMaxObserver, tq.PerChannelMinMaxObserver
    else:
        act_obs, w_obs = tq.MovingAverageMinMaxObserver, tq.MovingAveragePerChannelMinMaxObserver
    return tq.QConfig(
        activation=tq.FakeQuantize.with_args(observer=act_obs, quant_min=0, quant_max=amax,
                                             dtype=torch.quint8, qscheme=torch.per_tensor_affine,
                                             reduce_range=False),
        weight=tq.FakeQuantize.with_args(observer=w_obs, quant_min=wmin, quant_max=wmax,
                                         dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                         ch_axis=0, reduce_range=False))


def prepare(float_model, weight_bits, observer, act_bits=8):
    """prepare_qat after fusing LinearReLU (MLP) or ConvBnReLU2d (CNN: batch norm folded
    into the conv weight before its fake-quant, as torch.ao.nn.intrinsic.qat does)."""
    m = copy.deepcopy(float_model).train()
    tq.fuse_modules_qat(m, m.fusion_groups(), inplace=True)
    m.qconfig = qconfig(weight_bits, observer, act_bits)
    return tq.prepare_qat(m)


def make_model(args):
    return Cnn() if args.model == "cnn" else Mlp(args.width, args.depth)


# (name, weight bits, activation bits): the rows of `qat train --compare`.
SETTINGS = [("W8A8", 8, 8), ("W4A8", 4, 8), ("W4A4", 4, 4), ("W2A8", 2, 8)]


def accuracy(model, x, y):
    model.eval()
    model.apply(tq.disable_observer)  # eval freezes the observers, as `qat train` does
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.apply(tq.enable_observer)
    model.train()
    return acc


def train(model, x, y, epochs, lr, batch, gen):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(len(x) // batch):  # drop_last
            idx = order[s * batch:(s + 1) * batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()


def time_steps(args, xtr, ytr):
    """Mean time of one eager QAT W8A8 training step (forward, backward, Adam) at one batch."""
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    m = prepare(make_model(args), 8, "moving_average").to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = xtr[:args.batch].to(dev), ytr[:args.batch].to(dev)

    def step():
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.time_steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.time_steps
    print(f"PyTorch {torch.__version__} eager QAT W8A8 step, {args.model}, "
          f"batch {args.batch}, {dev}: {1e6 * dt:.1f} us (mean of {args.time_steps} steps after "
          f"20 warm-up)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("QG_DIGITS_CSV", DEBIAN_DIGITS))
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--qat-epochs", type=int, default=10)
    ap.add_argument("--qat-lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-steps", type=int, default=0,
                    help="only time this many QAT W8A8 training steps")
    ap.add_argument("--device", default="cpu", help="for --time-steps: cpu or cuda")
    args = ap.parse_args()
    if not os.path.exists(args.data):
        sys.exit(f"digits data not found at {args.data}: apt-get install python3-sklearn")
    # Newer PyTorch marks torch.ao.quantization eager mode deprecated; the API still works.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = load_split(args.data)
    if args.time_steps > 0:
        time_steps(args, xtr, ytr)
        return
    results = {}
    t0 = time.time()
    for k in range(args.seeds):
        seed = args.seed + k
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        fm = make_model(args)
        train(fm, xtr, ytr, args.epochs, args.lr, args.batch, gen)
        results.setdefault("float32", []).append(accuracy(fm, xte, yte))
        for name, wbits, abits in SETTINGS:  # PTQ: min/max calibration, no training
            pm = prepare(fm, wbits, "minmax", abits)
            with torch.no_grad():
                for s in range(len(xtr) // args.batch):
                    pm(xtr[s * args.batch:(s + 1) * args.batch])
            results.setdefault(f"PTQ {name}", []).append(accuracy(pm, xte, yte))
        for name, wbits, abits in SETTINGS:  # QAT: fine-tune with fake quantization
            qm = prepare(fm, wbits, "moving_average", abits)
            train(qm, xtr, ytr, args.qat_epochs, args.qat_lr, args.batch, gen)
            results.setdefault(f"QAT {name}", []).append(accuracy(qm, xte, yte))
        print(f"seed {seed}: " + "  ".join(f"{k} {100 * v[-1]:.2f}%" for k, v in results.items()),
              flush=True)
    what = "CNN 1x8x8" if args.model == "cnn" else f"MLP 64-{args.width}x{args.depth}-10"
    print(f"\nPyTorch {torch.__version__} eager QAT, {what}, "
          f"{args.seeds} seeds, {time.time() - t0:.1f} s")
    print(f"{'model':<10} {'test acc (fake-quant)':>22}")
    for name, v in results.items():
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"{name:<10} {100 * statistics.mean(v):>13.2f}% +- {100 * sd:.2f}")


if __name__ == "__main__":
    main()
