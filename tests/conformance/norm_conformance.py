"""Conformance of batch_norm, layer_norm, channel_div and their backward ops against torch
1.13's F.batch_norm / F.layer_norm / broadcast division and torch.autograd.

Random cases: batch_norm on [N, C] and [N, C, H, W] (N * H * W >= 2), in training (batch
statistics: y, the saved batch mean and 1/sqrt(var + eps), used_batch_stats = 1) and in eval
mode (`qat op --eval`: the running statistics, used_batch_stats = 0); layer_norm over the
last axis of 2-D and 3-D inputs. Each backward op runs alone through `qat op` on torch's
saved statistics with a random dy. The running-statistics update is checked by
tests/ops_norm (hand-worked values) and conv_bn_conformance (against torch's module).

Tolerance: the reference is torch in f64 on the same values; an output passes when
max |ours - ref| <= tol * max(max |ref|, max |dy| * max |gamma * invstd|), tol 1e-5 for f32
(statistics are summed in another order, and the f32 result rounds once) and 1e-10 for f64.
Fresh seed per run (printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SUITE = "norm_conformance"
TOL = {np.float32: 1e-5, np.float64: 1e-10}


def close(tally, op, ours, ref, scale, dtype, what):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        tally.check(op, False, f"{what}: shape {ours.shape} vs torch {ref.shape}")
        return
    bound = TOL[dtype] * max(float(np.max(np.abs(ref), initial=0.0)), scale, 1e-30)
    err = float(np.max(np.abs(ours - ref), initial=0.0))
    tally.check(op, err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}")


def batch_norm_case(qat, tally, rng, dtype, training):
    rank = int(rng.integers(0, 2))
    n, c = int(rng.integers(2, 6)), int(rng.integers(1, 6))
    shape = [n, c] if rank == 0 else [n, c, int(rng.integers(1, 6)), int(rng.integers(1, 6))]
    x = rng.normal(rng.normal(0, 2), rng.uniform(0.5, 3), size=shape).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, c).astype(dtype)
    beta = rng.normal(size=c).astype(dtype)
    rm = rng.normal(size=c).astype(dtype)
    rv = rng.uniform(0.5, 2.0, c).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    eps, momentum = float(rng.choice([1e-5, 1e-3])), float(rng.choice([0.1, 0.3]))
    attrs = {"eps": eps, "momentum": momentum}
    out = run_op(qat, "batch_norm",
                 {"x": x, "gamma": gamma, "beta": beta, "running_mean": rm.copy(),
                  "running_var": rv.copy()},
                 ["y", "save_mean", "save_invstd", "used_batch_stats"], attrs,
                 eval_mode=not training)
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in ("x", "gamma", "beta"))
         for k, v in (("x", x), ("gamma", gamma), ("beta", beta))}
    y = F.batch_norm(t["x"], torch.tensor(rm, dtype=torch.float64),
                     torch.tensor(rv, dtype=torch.float64), t["gamma"], t["beta"],
                     training=training, momentum=momentum, eps=eps)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    axes = tuple(i for i in range(len(shape)) if i != 1)
    xd = x.astype(np.float64)
    if training:
        mean = xd.mean(axis=axes)
        invstd = 1.0 / np.sqrt(xd.var(axis=axes) + eps)
    else:
        mean = rm.astype(np.float64)
        invstd = 1.0 / np.sqrt(rv.astype(np.float64) + eps)
    op = f"batch_norm {'train' if training else 'eval'} {np.dtype(dtype).name}"
    scale = float(np.max(np.abs(dy))) * float(np.max(np.abs(gamma * invstd)))
    close(tally, op, out["y"], y.detach().numpy(), 0.0, dtype, f"y {shape}")
    close(tally, op, out["save_mean"], mean, 0.0, dtype, "save_mean")
    close(tally, op, out["save_invstd"], invstd, 0.0, dtype, "save_invstd")
    tally.check(op, float(out["used_batch_stats"][0]) == (1.0 if training else 0.0),
                f"used_batch_stats {out['used_batch_stats']}")
    back = run_op(qat, "batch_norm_backward",
                  {"dy": dy, "x": x, "gamma": gamma, "save_mean": mean.astype(dtype),
                   "save_invstd": invstd.astype(dtype), "used_batch_stats": out["used_batch_stats"]},
                  ["dx", "dgamma", "dbeta"])
    bop = f"batch_norm_backward {'train' if training else 'eval'} {np.dtype(dtype).name}"
    close(tally, bop, back["dx"], t["x"].grad.numpy(), scale, dtype, f"dx {shape}")
    gscale = float(np.sum(np.abs(dy))) / max(1, c)
    close(tally, bop, back["dgamma"], t["gamma"].grad.numpy(), gscale, dtype, "dgamma")
    close(tally, bop, back["dbeta"], t["beta"].grad.numpy(), gscale, dtype, "dbeta")


def layer_norm_case(qat, tally, rng, dtype):
    shape = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 3)))]
    d = int(rng.integers(1, 40))
    shape.append(d)
    x = rng.normal(rng.normal(0, 2), rng.uniform(0.5, 3), size=shape).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, d).astype(dtype)
    beta = rng.normal(size=d).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    eps = float(rng.choice([1e-5, 1e-3]))
    out = run_op(qat, "layer_norm", {"x": x, "gamma": gamma, "beta": beta},
                 ["y", "mean", "rstd"], {"eps": eps})
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in (("x", x), ("gamma", gamma), ("beta", beta))}
    y = F.layer_norm(t["x"], (d,), t["gamma"], t["beta"], eps)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=-1)
    rstd = 1.0 / np.sqrt(xd.var(axis=-1) + eps)
    op = f"layer_norm {np.dtype(dtype).name}"
    close(tally, op, out["y"], y.detach().numpy(), 0.0, dtype, f"y {shape}")
    close(tally, op, out["mean"], mean, 0.0, dtype, "mean")
    close(tally, op, out["rstd"], rstd, 0.0, dtype, "rstd")
    back = run_op(qat, "layer_norm_backward",
                  {"dy": dy, "x": x, "gamma": gamma, "mean": mean.astype(dtype),
                   "rstd": rstd.astype(dtype)}, ["dx", "dgamma", "dbeta"])
    bop = f"layer_norm_backward {np.dtype(dtype).name}"
    scale = float(np.max(np.abs(dy))) * float(np.max(np.abs(gamma))) * float(np.max(rstd))
    close(tally, bop, back["dx"], t["x"].grad.numpy(), scale, dtype, f"dx {shape}")
    gscale = float(np.sum(np.abs(dy))) / d
    close(tally, bop, back["dgamma"], t["gamma"].grad.numpy(), gscale, dtype, "dgamma")
    close(tally, bop, back["dbeta"], t["beta"].grad.numpy(), gscale, dtype, "dbeta")


def channel_div_case(qat, tally, rng, dtype):
    """channel_div (conv-bn's rescale) is torch's x / s[None, :, None, None]: y and dx are one
    IEEE division each, so they must equal torch's in the same dtype bit for bit; ds is a sum,
    checked against torch's f64 autograd within the tolerance above."""
    n, c = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    shape = [n, c] + [int(rng.integers(1, 6)) for _ in range(int(rng.integers(0, 3)))]
    x = rng.normal(0, 2, size=shape).astype(dtype)
    s = (rng.uniform(0.25, 4.0, c) * rng.choice([-1.0, 1.0], c)).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    view = [1, c] + [1] * (len(shape) - 2)
    op = f"channel_div {np.dtype(dtype).name}"
    y = run_op(qat, "channel_div", {"x": x, "s": s}, ["y"])["y"]
    y_torch = (torch.from_numpy(x) / torch.from_numpy(s).reshape(view)).numpy()
    tally.check(op, np.array_equal(y, y_torch), f"y {shape} differs from torch's division")
    back = run_op(qat, "channel_div_backward", {"dy": dy, "y": y, "s": s}, ["dx", "ds"])
    bop = f"channel_div_backward {np.dtype(dtype).name}"
    dx_torch = (torch.from_numpy(dy) / torch.from_numpy(s).reshape(view)).numpy()
    tally.check(bop, np.array_equal(back["dx"], dx_torch), f"dx {shape} differs from torch's")
    xt = torch.tensor(x, dtype=torch.float64)
    st = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    (xt / st.reshape(view)).backward(torch.tensor(dy, dtype=torch.float64))
    gscale = float(np.sum(np.abs(dy.astype(np.float64) * y))) / max(1, c)
    close(tally, bop, back["ds"], st.grad.numpy(), gscale, dtype, "ds")


def bad_inputs(qat, tally):
    x = np.zeros((2, 3, 2, 2), np.float32)
    c3, c4 = np.ones(3, np.float32), np.ones(4, np.float32)
    cases = [
        ("batch_norm", {"x": x, "gamma": c4, "beta": c3, "running_mean": c3, "running_var": c3},
         ["y"], {}, "must be [3]"),
        ("batch_norm", {"x": x, "gamma": c3, "beta": c3, "running_mean": c3, "running_var": c3},
         ["y"], {"eps": -1.0}, "'eps'"),
        ("layer_norm", {"x": x, "gamma": c3, "beta": c3}, ["y"], {}, "must be [2]"),
        ("channel_div", {"x": x, "s": c4}, ["y"], {}, "s must be [3]"),
    ]
    for op, ins, outs, attrs, frag in cases:
        proc = run_op(qat, op, ins, outs, attrs, expect_failure=True)
        text = proc.stdout + proc.stderr
        tally.check(f"{op} bad input", proc.returncode != 0 and op in text and frag in text,
                    f"expected a failure naming {op} and '{frag}', got rc {proc.returncode}: {text}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64):
        for _ in range(12):
            batch_norm_case(args.qat, tally, rng, dtype, training=True)
            batch_norm_case(args.qat, tally, rng, dtype, training=False)
            layer_norm_case(args.qat, tally, rng, dtype)
            channel_div_case(args.qat, tally, rng, dtype)
    bad_inputs(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
