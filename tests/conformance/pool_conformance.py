"""Conformance of max_pool2d / avg_pool2d / global_avg_pool2d (and their backward ops) against
PyTorch 1.13 (CPU, f32).

  - max_pool2d y and indices: bit-exact against F.max_pool2d(..., return_indices=True), with
    random kernel, stride (or the kernel's default), padding <= kernel / 2, dilation and
    ceil_mode; also windows holding NaN (the last NaN of a window wins in both);
  - a window holding no input cell (dilation stepping past a narrow input) gives -inf and
    torch's index in both; its gradient is not compared (torch scatters it to that index,
    outside the window; we pass none);
  - output shapes equal torch's, and attribute sets torch rejects (the window does not fit
    the padded input) are rejected by qat op too;
  - avg_pool2d y: relative error <= 2e-6 (of max |y|) against F.avg_pool2d with
    count_include_pad both ways and ceil_mode: both sum the window in f32 and divide once,
    so they differ only by the order of at most 25 additions (~25 * 2^-24 = 1.5e-6 worst);
  - global_avg_pool2d y: relative error <= 1e-5 against x.mean((2, 3)): torch sums
    vectorised (a different order) over up to 40 * 40 cells; 1e-5 is SEMANTICS.md's f32
    reduction tolerance;
  - gradients dx of all three, from torch autograd with a random output gradient: same
    tolerances (max: exact sums of the same f32 terms in the same output order, so
    bit-exact is expected; 2e-6 allowed all the same).
Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SUITE = "pool_conformance"
WINDOW_TOL = 2e-6
REDUCE_TOL = 1e-5


def rel_err(a, b):
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(b))), 1e-6)
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale


def rand_window(rng, with_dilation):
    k = [int(rng.integers(1, 5)), int(rng.integers(1, 5))]
    attrs = {"kernel": k}
    stride = None
    if rng.random() < 0.7:
        stride = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
        attrs["stride"] = stride
    pad = [int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1))]
    attrs["padding"] = pad
    dil = [1, 1]
    if with_dilation and rng.random() < 0.5:
        dil = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
        attrs["dilation"] = dil
    attrs["ceil_mode"] = bool(rng.random() < 0.5)
    return attrs, k, stride, pad, dil


def rand_input(rng):
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 13)),
             int(rng.integers(1, 13)))
    return rng.uniform(-3, 3, size=shape).astype(np.float32)


def torch_or_none(fn):
    try:
        return fn()
    except RuntimeError:
        return None


def max_case(qat, rng, tally, with_nan=False):
    attrs, k, stride, pad, dil = rand_window(rng, True)
    x = rand_input(rng)
    if with_nan:
        x.reshape(-1)[rng.integers(0, x.size, size=max(1, x.size // 8))] = np.nan
    desc = f"x{list(x.shape)} {attrs}"
    xt = torch.from_numpy(x).requires_grad_(True)
    ref = torch_or_none(lambda: F.max_pool2d(xt, k, stride, pad, dil, attrs["ceil_mode"],
                                             return_indices=True))
    if ref is None:
        proc = run_op(qat, "max_pool2d", {"x": x}, ["y", "indices"], attrs, expect_failure=True)
        tally.check("max_pool2d/rejected", proc.returncode != 0, f"{desc}: accepted")
        return
    ty, ti = ref
    got = run_op(qat, "max_pool2d", {"x": x}, ["y", "indices"], attrs)
    y, idx = got["y"], got["indices"]
    same_y = y.shape == ty.shape and np.array_equal(y, ty.detach().numpy(), equal_nan=True)
    tally.check("max_pool2d/y" + ("/nan" if with_nan else ""), same_y, desc)
    tally.check("max_pool2d/indices" + ("/nan" if with_nan else ""),
                idx.shape == ti.shape and np.array_equal(idx, ti.numpy()), desc)
    if with_nan:
        return
    if np.isneginf(y).any():
        # A window with no input cell (the dilation steps past a narrow input): torch gives
        # -inf and an index outside the window (equal to ours) and scatters the gradient
        # there, possibly past the plane; ours passes no gradient (tests/ops_pool covers it).
        tally.check("max_pool2d_backward/empty window skipped", True)
        return
    dy = rng.uniform(-1, 1, size=ty.shape).astype(np.float32)
    ty.backward(torch.from_numpy(dy))
    battrs = dict(attrs, input_shape=list(x.shape))
    dx = run_op(qat, "max_pool2d_backward", {"dy": dy, "indices": idx}, ["dx"], battrs)["dx"]
    err = rel_err(dx, xt.grad.numpy())
    tally.check("max_pool2d_backward", err <= WINDOW_TOL, f"{desc}: error {err}")


def avg_case(qat, rng, tally):
    attrs, k, stride, pad, _ = rand_window(rng, False)
    attrs["count_include_pad"] = bool(rng.random() < 0.5)
    x = rand_input(rng)
    desc = f"x{list(x.shape)} {attrs}"
    xt = torch.from_numpy(x).requires_grad_(True)
    ty = torch_or_none(lambda: F.avg_pool2d(xt, k, stride, pad, attrs["ceil_mode"],
                                            attrs["count_include_pad"]))
    if ty is None:
        proc = run_op(qat, "avg_pool2d", {"x": x}, ["y"], attrs, expect_failure=True)
        tally.check("avg_pool2d/rejected", proc.returncode != 0, f"{desc}: accepted")
        return
    y = run_op(qat, "avg_pool2d", {"x": x}, ["y"], attrs)["y"]
    err = rel_err(y, ty.detach().numpy())
    tally.check("avg_pool2d", err <= WINDOW_TOL, f"{desc}: error {err}")
    dy = rng.uniform(-1, 1, size=ty.shape).astype(np.float32)
    ty.backward(torch.from_numpy(dy))
    battrs = dict(attrs, input_shape=list(x.shape))
    dx = run_op(qat, "avg_pool2d_backward", {"dy": dy}, ["dx"], battrs)["dx"]
    err = rel_err(dx, xt.grad.numpy())
    tally.check("avg_pool2d_backward", err <= WINDOW_TOL, f"{desc}: error {err}")


def global_case(qat, rng, tally):
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 41)),
             int(rng.integers(1, 41)))
    x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    ty = xt.mean((2, 3))
    y = run_op(qat, "global_avg_pool2d", {"x": x}, ["y"])["y"]
    err = rel_err(y, ty.detach().numpy())
    tally.check("global_avg_pool2d", err <= REDUCE_TOL, f"x{list(shape)}: error {err}")
    dy = rng.uniform(-1, 1, size=ty.shape).astype(np.float32)
    ty.backward(torch.from_numpy(dy))
    dx = run_op(qat, "global_avg_pool2d_backward", {"dy": dy}, ["dx"],
                {"input_shape": list(shape)})["dx"]
    err = rel_err(dx, xt.grad.numpy())
    tally.check("global_avg_pool2d_backward", err <= WINDOW_TOL, f"x{list(shape)}: error {err}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(60):
        max_case(args.qat, rng, tally)
        avg_case(args.qat, rng, tally)
    for _ in range(15):
        max_case(args.qat, rng, tally, with_nan=True)
        global_case(args.qat, rng, tally)
    tally.finish()


if __name__ == "__main__":
    main()
