"""Conformance of the nn library's folded conv-bn block (nn/conv_bn.cpp) against torch 1.13's
torch.ao.nn.intrinsic.qat.ConvBnReLU2d / ConvBn2d, driven through `qat layer conv_bn`.

Both sides get the same weight, BN gamma/beta/running statistics and input; the weight
fake-quant is per-channel symmetric int8 (MovingAveragePerChannelMinMaxObserver, -128..127,
PyTorch's default QAT weight fake-quant) and there is no activation fake-quant (the module
itself has none). After `steps` training-mode forward passes we compare:
  * the fake-quantized folded weight, bit for bit (same f32 ops: sqrt(var + eps),
    gamma / std, w * sf, then the same quantization);
  * the output, |ours - torch| <= 1e-5 * (1 + |torch|): the conv sums and batch statistics
    are f32 reductions in a different order (errors are ~1e-7 relative; the bound leaves
    room for the division by the scale factor and the normalisation, which amplify them);
  * the updated running mean and variance, same tolerance.
Fresh random seed each run (printed). Exits 0 with a note when this build lacks the conv2d
or batch_norm op (the ops come from another branch).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args  # noqa: E402

SUITE = "conv_bn_conformance"


def torch_block(c, o, k, stride, padding, relu):
    import torch
    import torch.ao.quantization as tq
    try:
        from torch.ao.nn.intrinsic.qat import ConvBn2d, ConvBnReLU2d
    except ImportError:  # Debian's torch 1.13 keeps them under the pre-ao path
        from torch.nn.intrinsic.qat import ConvBn2d, ConvBnReLU2d

    weight_fq = tq.FakeQuantize.with_args(
        observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0)
    qconfig = tq.QConfig(activation=tq.NoopObserver, weight=weight_fq)
    cls = ConvBnReLU2d if relu else ConvBn2d
    return cls(c, o, k, stride=stride, padding=padding, bias=False, qconfig=qconfig)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    import torch

    tally = Tally(SUITE)
    cases = [
        # (n, c, o, k, hw, stride, padding, relu, steps)
        (2, 1, 4, 3, 8, 1, 1, True, 1),
        (3, 3, 8, 3, 7, 1, 1, True, 2),
        (2, 4, 6, 3, 9, 2, 0, False, 1),
        (4, 2, 5, 1, 5, 1, 0, True, 3),
    ]
    for (n, c, o, k, hw, stride, padding, relu, steps) in cases:
        label = f"n{n} c{c} o{o} k{k} hw{hw} s{stride} p{padding} relu{relu} steps{steps}"
        m = torch_block(c, o, k, stride, padding, relu)
        m.train()
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, (o, c, k, k)).astype(np.float32)))
            m.bn.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, o).astype(np.float32)))
            m.bn.bias.copy_(torch.from_numpy(rng.uniform(-0.2, 0.2, o).astype(np.float32)))
            m.bn.running_mean.copy_(torch.from_numpy(rng.uniform(-0.1, 0.1, o).astype(np.float32)))
            m.bn.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, o).astype(np.float32)))
        x = rng.uniform(-1, 1, (n, c, hw, hw)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "x.npy"), x)
            for ours, t in [("layer.weight", m.weight), ("layer.bn.weight", m.bn.weight),
                            ("layer.bn.bias", m.bn.bias),
                            ("layer.bn.running_mean", m.bn.running_mean),
                            ("layer.bn.running_var", m.bn.running_var)]:
                np.save(os.path.join(d, ours + ".npy"), t.detach().numpy().copy())
            cmd = [args.qat, "layer", "conv_bn", "--dir", d, "--out-channels", str(o),
                   "--kernel", str(k), "--stride", str(stride), "--padding", str(padding),
                   "--weight-bits", "8", "--steps", str(steps)]
            if not relu:
                cmd.append("--no-relu")
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                if ("conv2d" in r.stderr or "batch_norm" in r.stderr) and "unknown" in r.stderr.lower():
                    print("skipped: this build lacks the conv2d / batch_norm ops:", r.stderr.strip())
                    sys.exit(0)
                tally.check("conv_bn", False, f"{label}: qat failed: {r.stderr.strip()}")
                continue
            y = np.load(os.path.join(d, "y.npy"))
            wfq = np.load(os.path.join(d, "weight_fq.npy")).reshape(o, c, k, k)
            rm = np.load(os.path.join(d, "layer.bn.running_mean.out.npy"))
            rv = np.load(os.path.join(d, "layer.bn.running_var.out.npy"))
        captured = {}

        def hook(mod, inp, out):  # the folded weight each forward fake-quantizes
            captured["w"] = out.detach().numpy().copy()

        h = m.weight_fake_quant.register_forward_hook(hook)
        with torch.no_grad():
            for _ in range(steps):
                ty = m(torch.from_numpy(x)).numpy()
        h.remove()
        tally.check("conv_bn folded weight fake-quant (bit for bit)",
                    wfq.shape == captured["w"].shape and
                    np.array_equal(wfq.view(np.uint32), captured["w"].view(np.uint32)),
                    f"{label}: {np.count_nonzero(wfq != captured['w'])} elements differ")
        tol = lambda a, b: np.all(np.abs(a - b) <= 1e-5 * (1 + np.abs(b)))  # noqa: E731
        tally.check("conv_bn output", tol(y, ty), f"{label}: max diff {np.max(np.abs(y - ty))}")
        tally.check("conv_bn running_mean", tol(rm, m.bn.running_mean.numpy()),
                    f"{label}: {rm} vs {m.bn.running_mean.numpy()}")
        tally.check("conv_bn running_var", tol(rv, m.bn.running_var.numpy()),
                    f"{label}: {rv} vs {m.bn.running_var.numpy()}")
    tally.finish()


if __name__ == "__main__":
    main()
