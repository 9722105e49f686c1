"""PyTorch's data-parallel QAT on the digits models' shapes, for the 2-GPU comparison in
scripts/gpu_dist_check.sh: DDP over NCCL + torch.ao.quantization prepare_qat (fused
conv-bn-relu, fbgemm QAT qconfig), Adam, fp32, one step = forward, backward, optimizer step.
Prints the mean wall time of one step per rank.

  python3 scripts/torch_ddp_qat_bench.py --model cnn --batch 256 --world 2 --steps 200
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.ao import quantization as tq


class Cnn(nn.Module):
    # 1x8x8 -> conv-bn-relu 16 -> 32 -> maxpool 2 -> 32 -> global average pool -> fc 10
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        chans = [(1, 16), (16, 32), (32, 32)]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1, bias=False) for a, b in chans)
        self.bns = nn.ModuleList(nn.BatchNorm2d(b) for _, b in chans)
        self.relus = nn.ModuleList(nn.ReLU() for _ in chans)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.quant(x.view(-1, 1, 8, 8))
        for i in range(3):
            x = self.relus[i](self.bns[i](self.convs[i](x)))
            if i == 1:
                x = self.pool(x)
        x = x.mean(dim=(2, 3))
        return self.dequant(self.fc(x))

    def fuse(self):
        for i in range(3):
            tq.fuse_modules_qat(self, [[f"convs.{i}", f"bns.{i}", f"relus.{i}"]], inplace=True)


class Transformer(nn.Module):
    # 8 tokens x 8 features -> d_model 32, one pre-norm block (4 heads, MLP 64), mean, head
    def __init__(self, d=32, heads=4, hidden=64):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.heads = heads
        self.embed = nn.Linear(8, d)
        self.pos = nn.Parameter(torch.zeros(8, d))
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.quant(x.view(-1, 8, 8))
        h = self.embed(x) + self.pos
        a = self.ln1(h)
        b, t, d = a.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = F.scaled_dot_product_attention(split(self.q(a)), split(self.k(a)), split(self.v(a)))
        h = h + self.o(att.transpose(1, 2).reshape(b, t, d))
        h = h + self.fc2(F.relu(self.fc1(self.ln2(h))))
        return self.dequant(self.head(self.ln_f(h).mean(dim=1)))

    def fuse(self):
        pass


def run(rank, world, args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = Cnn() if args.model == "cnn" else Transformer()
    model.train()
    model.fuse()
    model.qconfig = tq.get_default_qat_qconfig("fbgemm")
    tq.prepare_qat(model, inplace=True)
    model = model.cuda()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(args.batch, 64, device="cuda")
    y = torch.randint(0, 10, (args.batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / args.steps * 1e6
    print(f"torch DDP+prepare_qat {args.model} rank {rank}/{world} batch {args.batch}: {us:.1f} us",
          flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn", choices=["cnn", "transformer"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    if args.world == 1:
        run(0, 1, args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    mp.spawn(run, args=(args.world, args), nprocs=args.world)


if __name__ == "__main__":
    main()
