"""Conformance of conv2d and its backward ops against torch.nn.functional.conv2d (torch 1.13)
and torch.autograd's gradients for x, w and b.

Random cases: batch 1-3, groups 1, 2, 3 or depthwise (groups == C, channel multiplier 1-2),
kernels 1x1 to 4x4 (non-square too), stride 1-3, padding 0-2, dilation 1-3 per axis, image
sizes 1-12 drawn so that the output is not empty; f32 and f64. Each op runs alone through
`qat op`: conv2d {x, w, b}, conv2d_backward_input {dy, w}, conv2d_backward_weight {dy, x},
conv2d_backward_bias {dy}, with dy random.

Tolerance: relative 1e-5 in f32 (1e-12 in f64), measured against the sum of the absolute
values of the terms each output adds up (the same conv / gradient on |x|, |w|, |b|, |dy|).
Both sides compute the same sums of products, but in different orders (Eigen's blocked GEMM
here, oneDNN or ATen's own kernels in torch), so results differ by rounding that grows with
the magnitude of the terms, not with the result's own size (which may cancel to near 0).
A few bad inputs also check that `qat op` fails with the op named. Fresh seed per run
(printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SUITE = "conv_conformance"
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def draw_case(rng):
    """Returns (x_shape, w_shape, attrs) with a non-empty output."""
    while True:
        kind = rng.integers(0, 4)
        if kind == 3:  # depthwise
            groups = int(rng.integers(1, 6))
            cg, og = 1, int(rng.integers(1, 3))
        else:
            groups = [1, 2, 3][kind]
            cg, og = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        n = int(rng.integers(1, 4))
        k = [int(rng.integers(1, 5)) for _ in range(2)]
        stride = [int(rng.integers(1, 4)) for _ in range(2)]
        padding = [int(rng.integers(0, 3)) for _ in range(2)]
        dilation = [int(rng.integers(1, 4)) for _ in range(2)]
        hw = [int(rng.integers(1, 13)) for _ in range(2)]
        out = [(hw[i] + 2 * padding[i] - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1
               for i in range(2)]
        if min(out) < 1 or any(hw[i] + 2 * padding[i] < dilation[i] * (k[i] - 1) + 1
                               for i in range(2)):
            continue
        x_shape = [n, groups * cg] + hw
        w_shape = [groups * og, cg] + k
        attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
        return x_shape, w_shape, attrs


def torch_results(x, w, b, dy, attrs):
    """conv2d and the three gradients, and the same on absolute values (the error scale)."""
    kw = dict(stride=attrs["stride"], padding=attrs["padding"], dilation=attrs["dilation"],
              groups=attrs["groups"])
    out = []
    for xs, ws, bs, ds in ((x, w, b, dy), (abs(x), abs(w), abs(b), abs(dy))):
        xt = torch.tensor(xs, requires_grad=True)
        wt = torch.tensor(ws, requires_grad=True)
        bt = torch.tensor(bs, requires_grad=True)
        y = F.conv2d(xt, wt, bt, **kw)
        gx, gw, gb = torch.autograd.grad(y, (xt, wt, bt), torch.tensor(ds))
        out.append({"y": y.detach().numpy(), "dx": gx.numpy(), "dw": gw.numpy(),
                    "db": gb.numpy()})
    return out


def close(tally, op, got, want, scale, tol, label):
    if got.shape != want.shape:
        tally.check(op, False, f"{label}: shape {got.shape} vs torch {want.shape}")
        return
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = tol * np.maximum(scale.astype(np.float64), 1e-30)
    bad = err > bound
    detail = ""
    if bad.any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        detail = (f"{label}: at {i} qat {got[i]!r} torch {want[i]!r} err {err[i]:.3g} "
                  f"> {bound[i]:.3g}")
    tally.check(op, not bad.any(), detail)


def conv_case(qat, rng, tally, dtype):
    x_shape, w_shape, attrs = draw_case(rng)
    x = rng.normal(size=x_shape).astype(dtype)
    w = rng.normal(size=w_shape).astype(dtype)
    b = rng.normal(size=[w_shape[0]]).astype(dtype) if rng.integers(0, 4) else \
        np.zeros(w_shape[0], dtype)  # a zero bias: how callers without one call conv2d
    tol = TOL[dtype]
    label = f"{np.dtype(dtype).name} x{x_shape} w{w_shape} {attrs}"
    got = run_op(qat, "conv2d", {"x": x, "w": w, "b": b}, ["y"], attrs)["y"]
    dy = rng.normal(size=got.shape).astype(dtype)
    ref, scale = torch_results(x, w, b, dy, attrs)
    close(tally, "conv2d", got, ref["y"], scale["y"], tol, label)
    dx = run_op(qat, "conv2d_backward_input", {"dy": dy, "w": w}, ["dx"],
                dict(attrs, input_shape=x_shape))["dx"]
    close(tally, "conv2d_backward_input", dx, ref["dx"], scale["dx"], tol, label)
    dw = run_op(qat, "conv2d_backward_weight", {"dy": dy, "x": x}, ["dw"],
                dict(attrs, weight_shape=w_shape))["dw"]
    close(tally, "conv2d_backward_weight", dw, ref["dw"], scale["dw"], tol, label)
    db = run_op(qat, "conv2d_backward_bias", {"dy": dy}, ["db"])["db"]
    close(tally, "conv2d_backward_bias", db, ref["db"], scale["db"], tol, label)


def error_cases(qat, tally):
    """Bad inputs: qat op must fail and name conv2d. Each is one torch rejects too, except an
    unbatched [C, H, W] input, which torch 1.13 accepts and conv2d does not (NCHW only)."""
    f = np.float32
    cases = [
        ("NHWC input", np.zeros((1, 6, 6, 4), f), np.zeros((2, 4, 3, 3), f), {}, True),
        ("unbatched input", np.zeros((4, 6, 6), f), np.zeros((2, 4, 3, 3), f), {}, False),
        ("groups 3 of C 4", np.zeros((1, 4, 6, 6), f), np.zeros((3, 1, 3, 3), f),
         {"groups": 3}, True),
        ("kernel too large", np.zeros((1, 4, 2, 2), f), np.zeros((2, 4, 3, 3), f), {}, True),
        ("stride 0", np.zeros((1, 4, 6, 6), f), np.zeros((2, 4, 3, 3), f), {"stride": [0, 1]},
         True),
    ]
    for label, x, w, attrs, torch_rejects in cases:
        b = np.zeros(w.shape[0], f)
        rejected = False
        try:
            F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), **attrs)
        except (RuntimeError, ValueError):
            rejected = True
        proc = run_op(qat, "conv2d", {"x": x, "w": w, "b": b}, ["y"], attrs, expect_failure=True)
        ok = (proc.returncode != 0 and "conv2d" in proc.stdout + proc.stderr
              and rejected == torch_rejects)
        tally.check("conv2d (bad input)", ok, f"{label}: rc {proc.returncode}, torch rejects: "
                    f"{rejected}; {proc.stderr.strip()[:200]}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64):
        for _ in range(40):
            conv_case(args.qat, rng, tally, dtype)
    error_cases(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
