#!/usr/bin/python3
"""Trains float PyTorch twins of `qat train --model mlp` and `--model cnn` on the digits data
and writes what `qat train --init` imports, plus the reference outputs to compare against.

Same data and split as qatgraph (bench/pytorch_qat_digits.py's port of nn::split_dataset:
std::mt19937_64 seed 0, Fisher-Yates, the first 20% test). Same architectures, layer for
layer (nn/model.cpp):
  mlp: fc1 Linear(64, 128) -> ReLU -> fc2 Linear(128, 10)                (--width 128 --depth 1)
  cnn: x as [N, 1, 8, 8] -> conv1, conv2 (Conv2d 3x3 pad 1, no bias -> BatchNorm2d(eps 1e-5,
       momentum 0.1) -> ReLU) -> MaxPool2d(2) -> conv3 -> mean over H, W -> fc Linear(32, 10)
The CNN's blocks hold .conv and .bn, so its state_dict says conv1.conv.weight (imported as
qatgraph's conv1.weight) and conv1.bn.num_batches_tracked (ignored): the import's name rules
are exercised, not bypassed.

Writes into --out: mlp.safetensors, cnn.safetensors (F32), cnn.npz (the same tensors as
NumPy .npz), and per model <m>_torch_logits.npy (the test split in order, eval mode: batch
norm on running statistics) and <m>_torch.json (test accuracy, sizes, seconds).

    /usr/bin/python3 tests/import/train_torch_digits.py --out DIR [--seed 0]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from pytorch_qat_digits import DEBIAN_DIGITS, load_split  # noqa: E402


class Mlp(nn.Module):
    def __init__(self, width=128, depth=1, classes=10):
        super().__init__()
        dims = [64] + [width] * depth
        self.depth = depth
        for i in range(depth):
            setattr(self, f"fc{i + 1}", nn.Linear(dims[i], dims[i + 1]))
        setattr(self, f"fc{depth + 1}", nn.Linear(dims[-1], classes))

    def forward(self, x):
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"fc{i + 1}")(x))
        return getattr(self, f"fc{self.depth + 1}")(x)


class ConvBnReLU(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Cnn(nn.Module):
    def __init__(self, channels=(16, 32, 32), classes=10):
        super().__init__()
        self.conv1 = ConvBnReLU(1, channels[0])
        self.conv2 = ConvBnReLU(channels[0], channels[1])
        self.pool = nn.MaxPool2d(2)
        self.conv3 = ConvBnReLU(channels[1], channels[2])
        self.fc = nn.Linear(channels[2], classes)

    def forward(self, x):
        x = self.pool(self.conv2(self.conv1(x.reshape(-1, 1, 8, 8))))
        return self.fc(self.conv3(x).mean(dim=(2, 3)))


# Enough to reach the accuracy qatgraph's own float runs reach, in about a second each on
# one CPU core (the script runs under ctest).
RECIPES = {"mlp": dict(make=Mlp, epochs=30, lr=3e-3), "cnn": dict(make=Cnn, epochs=12, lr=1e-2)}

ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.float64): "F64", np.dtype(np.int64): "I64"}


def write_safetensors(path, tensors, metadata=None):
    """The safetensors layout: u64 little-endian header length, JSON header (padded with
    spaces to 8 bytes), then each tensor's little-endian bytes at its data_offsets."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def read_safetensors(path):
    """name -> numpy array (the dtypes write_safetensors and `qat train --save-logits` use)."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    by_name = {v: k for k, v in ST_DTYPES.items()}
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dtype = by_name[h["dtype"]].newbyteorder("<")
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtype).reshape(h["shape"])
    return out


def digits_path():
    return os.environ.get("QG_DIGITS_CSV") or DEBIAN_DIGITS


def train_model(kind, xtr, ytr, seed, batch=64):
    r = RECIPES[kind]
    torch.manual_seed(seed)
    model = r["make"]()
    opt = torch.optim.Adam(model.parameters(), lr=r["lr"])
    gen = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(r["epochs"]):
        order = torch.randperm(len(xtr), generator=gen)
        for s in range(len(xtr) // batch):  # drop_last, as nn::Trainer
            idx = order[s * batch:(s + 1) * batch]
            opt.zero_grad()
            loss_fn(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="mlp,cnn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    xtr, ytr, xte, yte = load_split(digits_path())
    for kind in args.models.split(","):
        t0 = time.time()
        model = train_model(kind, xtr, ytr, args.seed)
        with torch.no_grad():
            logits = model(xte)
        acc = (logits.argmax(1) == yte).double().mean().item()
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        meta = {"source": "tests/import/train_torch_digits.py", "model": kind,
                "torch": torch.__version__}
        write_safetensors(os.path.join(args.out, f"{kind}.safetensors"), state, meta)
        if kind == "cnn":
            np.savez(os.path.join(args.out, "cnn.npz"), **state)
        np.save(os.path.join(args.out, f"{kind}_torch_logits.npy"), logits.numpy())
        info = {"model": kind, "test_accuracy": acc, "test_rows": len(yte), "train_rows": len(ytr),
                "epochs": RECIPES[kind]["epochs"], "lr": RECIPES[kind]["lr"],
                "seconds": time.time() - t0, "tensors": sorted(state)}
        with open(os.path.join(args.out, f"{kind}_torch.json"), "w") as f:
            json.dump(info, f, indent=1)
        print(f"torch {kind}: test accuracy {100 * acc:.2f}% ({len(yte)} rows), "
              f"{len(state)} tensors, {info['seconds']:.1f} s")


if __name__ == "__main__":
    main()
