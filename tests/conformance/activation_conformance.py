"""Conformance of gelu (approximate "none" and "tanh"), silu and their backward ops against
PyTorch 1.13 (CPU): F.gelu(x, approximate=...) (the tanh form exists since torch 1.12) and
F.silu, gradients from torch autograd with a random output gradient.

Tolerance, per element: |ours - torch| <= TOL * (1 + |torch|), TOL = 2e-6 in f32 (about 32
ulps at 1: torch evaluates erf/tanh/exp with its own vectorised polynomials, we with libm's
erff/tanhf/expf; each is within a few ulps of the true value, and the difference is
amplified where 1 + erf or 1 + tanh cancels for negative x, an absolute error of a few ulps
of 1 times |x| <= 8) and 1e-12 in f64 (both use libm-accurate double functions there; the
operation order still differs slightly).
The maximum errors are printed (seed 3: f32 at most 6.7e-7, gelu tanh backward; f64 2.4e-15). Random shapes (odd sizes, empty), values in
[-8, 8] plus exact points 0, +-1, +-2. Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SUITE = "activation_conformance"
TOL = {np.float32: 2e-6, np.float64: 1e-12}
worst = {}


def close(op, dtype, got, ref):
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return False, f"{got.dtype}{got.shape} vs {ref.dtype}{ref.shape}"
    if got.size == 0:
        return True, ""
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / (1 + np.abs(ref))
    e = float(np.max(err))
    key = f"{op} {np.dtype(dtype).name}"
    worst[key] = max(worst.get(key, 0.0), e)
    return e <= TOL[dtype], f"max error {e}"


def case(qat, rng, tally, dtype):
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(rng.integers(0 if rng.random() < 0.05 else 1, 9)) for _ in range(ndim))
    x = rng.uniform(-8, 8, size=shape).astype(dtype)
    flat = x.reshape(-1)
    fixed = np.array([0, 1, -1, 2, -2], dtype=dtype)
    flat[: min(flat.size, 5)] = fixed[: min(flat.size, 5)]
    dy = rng.uniform(-1, 1, size=shape).astype(dtype)
    desc = f"{np.dtype(dtype).name}{list(shape)}"
    for op, attrs, fn in (("gelu", {"approximate": "none"}, lambda t: F.gelu(t)),
                          ("gelu", {"approximate": "tanh"},
                           lambda t: F.gelu(t, approximate="tanh")),
                          ("silu", {}, F.silu)):
        label = op + ("/" + attrs["approximate"] if attrs else "")
        xt = torch.from_numpy(x.copy()).requires_grad_(True)
        yt = fn(xt)
        yt.backward(torch.from_numpy(dy))
        y = run_op(qat, op, {"x": x}, ["y"], attrs)["y"]
        ok, why = close(label, dtype, y, yt.detach().numpy())
        tally.check(label, ok, f"{desc}: {why}")
        dx = run_op(qat, op + "_backward", {"dy": dy, "x": x}, ["dx"], attrs)["dx"]
        ok, why = close(label + "_backward", dtype, dx, xt.grad.numpy())
        tally.check(label + "_backward", ok, f"{desc}: {why}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(20):
        case(args.qat, rng, tally, np.float32)
    for _ in range(5):
        case(args.qat, rng, tally, np.float64)
    for key, e in sorted(worst.items()):
        print(f"  max error {key:28s} {e:.3g}")
    tally.finish()


if __name__ == "__main__":
    main()
