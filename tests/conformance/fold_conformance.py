"""Conformance of conv_bn_fold_weight and its backward (ops/fold) against torch 1.13's
QAT ConvBn2d fold, torch.ao.nn.intrinsic.qat.ConvBn2d._forward:
    running_std = torch.sqrt(running_var + eps)
    scale_factor = gamma / running_std
    w_fold = w * scale_factor.reshape([-1, 1, 1, 1])
computed here with the same torch ops on [O, C, k, k] weights.

The forward is one IEEE operation per step in the tensors' dtype on both sides (torch adds
the Python float eps as a scalar of the tensor's dtype), so w_fold, scale_factor and
running_std must equal torch's bit for bit, in f32 and f64. The backward op runs alone
through `qat op` on torch's scale_factor and running_std with random d_w_fold and
d_scale_factor; dw is one multiplication per element (bit for bit with torch's), dgamma holds
a sum over C * k * k and is checked against torch's f64 autograd of the same expression:
max |ours - ref| <= tol * max(max |ref|, 1e-30), tol 1e-5 for f32 (the sum's order and the
f32 roundings of the products differ) and 1e-12 for f64. Fresh seed per run (printed)
unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "fold_conformance"
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def torch_fold(w, gamma, var, eps):
    running_std = torch.sqrt(var + eps)
    scale_factor = gamma / running_std
    shape = [-1] + [1] * (w.dim() - 1)
    return w * scale_factor.reshape(shape), scale_factor, running_std


def case(qat, tally, rng, dtype):
    o, c, k = int(rng.integers(1, 17)), int(rng.integers(1, 9)), int(rng.choice([1, 3, 5]))
    eps = float(rng.choice([1e-5, 1e-3, 0.1]))
    w = rng.uniform(-1, 1, (o, c, k, k)).astype(dtype)
    gamma = (rng.uniform(0.2, 2.0, o) * rng.choice([-1.0, 1.0], o)).astype(dtype)
    var = rng.uniform(0.0, 3.0, o).astype(dtype)
    var[rng.uniform(size=o) < 0.2] = 0  # eps alone under the root
    name = np.dtype(dtype).name
    op = f"conv_bn_fold_weight {name}"
    ours = run_op(qat, "conv_bn_fold_weight", {"w": w, "gamma": gamma, "running_var": var},
                  ["w_fold", "scale_factor", "running_std"], {"eps": eps})
    ref = torch_fold(torch.from_numpy(w), torch.from_numpy(gamma), torch.from_numpy(var), eps)
    for key, r in zip(["w_fold", "scale_factor", "running_std"], ref):
        tally.check(op, np.array_equal(ours[key], r.numpy()),
                    f"{key} [{o},{c},{k},{k}] eps {eps} differs from torch's")

    d_w_fold = rng.normal(size=w.shape).astype(dtype)
    d_sf = rng.normal(size=o).astype(dtype)
    bop = f"conv_bn_fold_weight_backward {name}"
    back = run_op(qat, "conv_bn_fold_weight_backward",
                  {"d_w_fold": d_w_fold, "d_scale_factor": d_sf, "w": w,
                   "scale_factor": ours["scale_factor"], "running_std": ours["running_std"]},
                  ["dw", "dgamma"])
    dw_torch = (torch.from_numpy(d_w_fold) * ref[1].reshape([-1, 1, 1, 1])).numpy()
    tally.check(bop, np.array_equal(back["dw"], dw_torch), "dw differs from torch's product")
    # dgamma: torch autograd in f64 through the fold, both outputs seeded.
    t = {n: torch.tensor(v, dtype=torch.float64, requires_grad=n == "gamma")
         for n, v in (("w", w), ("gamma", gamma), ("var", var))}
    w_fold, scale_factor, _ = torch_fold(t["w"], t["gamma"], t["var"], float(dtype(eps)))
    loss = (w_fold * torch.from_numpy(d_w_fold.astype(np.float64))).sum() + \
        (scale_factor * torch.from_numpy(d_sf.astype(np.float64))).sum()
    (dgamma,) = torch.autograd.grad(loss, [t["gamma"]])
    ref_g = dgamma.numpy()
    err = float(np.max(np.abs(back["dgamma"].astype(np.float64) - ref_g)))
    bound = TOL[dtype] * max(float(np.max(np.abs(ref_g))), 1e-30)
    tally.check(bop, err <= bound, f"dgamma: max error {err:.3g} > {bound:.3g}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64):
        for _ in range(25):
            case(args.qat, tally, rng, dtype)
    tally.finish()


if __name__ == "__main__":
    main()
