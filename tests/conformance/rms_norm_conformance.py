"""Conformance of rms_norm and rms_norm_backward against torch 1.13 running the arithmetic of
transformers' LlamaRMSNorm: h = x.to(f32); var = h.pow(2).mean(-1); h = h * rsqrt(var + eps);
y = weight * h.to(x.dtype). For f64 inputs the reference is the same formula kept in f64
(the op's f64 path is its gradient-check reference; transformers would drop to f32 there).
bf16 is not here: .npy has no bf16 (tests/ops_rms_norm pins torch's bf16 results instead).

Random cases: rows of 1 to 300 elements (fewer and more than the kernels' 32 lanes), 1 to 3
leading axes, eps 1e-6 or 1e-5, values at several scales. The backward op runs alone through
`qat op` on our rstd with a random dy, against torch.autograd of the formula in f64.

Given our rstd, y must equal torch's element-wise steps bit for bit (the rounding order).
Tolerances, as a fraction of max |ref| (or of the gradient's scale, below):
  y, rstd   f32 1e-6: the sum of squares is an f64 sum (torch's is an f32 mean), so the f32
            rstd may differ in its last bit; f16 one f16 ulp, 2^-10: that last bit can move
            h or y across an f16 rounding boundary; f64 1e-12.
  dx, dw    against torch's f64 gradient of the same inputs: f32 1e-5, f16 4e-3 (g = dy * w
            and dx round to f16), f64 1e-12.
Fresh seed per run (printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, check_bad_input, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "rms_norm_conformance"
DTYPES = {np.float32: torch.float32, np.float64: torch.float64, np.float16: torch.float16}
FORWARD_TOL = {np.float32: 1e-6, np.float64: 1e-12, np.float16: 2.0 ** -10}
BACKWARD_TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 4e-3}


def close(tally, op, ours, ref, scale, tol, what):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        tally.check(op, False, f"{what}: shape {ours.shape} vs torch {ref.shape}")
        return
    bound = tol * max(float(np.max(np.abs(ref), initial=0.0)), scale, 1e-30)
    err = float(np.max(np.abs(ours - ref), initial=0.0))
    tally.check(op, err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}")


def llama_rms_norm(x, w, eps):
    """transformers' LlamaRMSNorm on torch tensors x and w of one dtype (f64 stays f64)."""
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(stat)
    var = h.pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    return w * (h * rstd).to(x.dtype), rstd.squeeze(-1)


def case(qat, tally, rng, dtype):
    lead = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 4)))]
    d = int(rng.choice([1, 3, 8, 31, 32, 33, 64, 100, 300]))
    shape = lead + [d]
    scale = float(rng.choice([1e-2, 1.0, 30.0]))
    x = (rng.normal(0, scale, size=shape)).astype(dtype)
    w = rng.uniform(-1.5, 1.5, d).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    eps = float(rng.choice([1e-6, 1e-5]))
    name = np.dtype(dtype).name
    out = run_op(qat, "rms_norm", {"x": x, "weight": w}, ["y", "rstd"], {"eps": eps})
    y_ref, rstd_ref = llama_rms_norm(torch.from_numpy(x), torch.from_numpy(w), eps)
    close(tally, f"rms_norm {name}", out["y"], y_ref.numpy(), 0.0, FORWARD_TOL[dtype],
          f"y {shape}")
    rstd_tol = FORWARD_TOL[np.float64 if dtype == np.float64 else np.float32]
    close(tally, f"rms_norm {name}", out["rstd"], rstd_ref.numpy(), 0.0, rstd_tol, "rstd")
    # Given our rstd, torch's element-wise steps (x * rstd in f32, cast, times the weight in
    # the dtype) must give our y bit for bit: this pins the rounding order.
    xs = torch.from_numpy(x).to(rstd_ref.dtype) * torch.from_numpy(out["rstd"])[..., None]
    y_steps = (torch.from_numpy(w) * xs.to(DTYPES[dtype])).numpy()
    tally.check(f"rms_norm {name}", np.array_equal(out["y"], y_steps),
                f"y {shape} differs from torch's element steps on our rstd")

    back = run_op(qat, "rms_norm_backward", {"dy": dy, "x": x, "weight": w, "rstd": out["rstd"]},
                  ["dx", "dweight"])
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    llama_rms_norm(xt, wt, eps)[0].backward(torch.tensor(dy, dtype=torch.float64))
    rstd64 = rstd_ref.numpy().astype(np.float64)
    gscale = float(np.max(np.abs(dy))) * float(np.max(np.abs(w))) * float(np.max(rstd64))
    bop = f"rms_norm_backward {name}"
    close(tally, bop, back["dx"], xt.grad.numpy(), gscale, BACKWARD_TOL[dtype], f"dx {shape}")
    h = x.astype(np.float64) * rstd64[..., None]
    wscale = float(np.max(np.sum(np.abs(dy.astype(np.float64) * h).reshape(-1, d), axis=0)))
    close(tally, bop, back["dweight"], wt.grad.numpy(), wscale, BACKWARD_TOL[dtype], "dweight")


def bad_inputs(qat, tally):
    x = np.zeros((2, 3, 8), np.float32)
    cases = [
        ("rms_norm", {"x": x, "weight": np.ones(4, np.float32)}, ["y"], {}, "weight must be [8]"),
        ("rms_norm", {"x": x, "weight": np.ones(8, np.float64)}, ["y"], {}, "f64"),
        ("rms_norm", {"x": x, "weight": np.ones(8, np.float32)}, ["y"], {"eps": 0.0}, "'eps'"),
        ("rms_norm_backward", {"dy": x, "x": x, "weight": np.ones(8, np.float32),
                               "rstd": np.ones((2, 3), np.float64)}, ["dx"], {}, "rstd must be"),
    ]
    for op, ins, outs, attrs, frag in cases:
        check_bad_input(qat, tally, op, ins, outs, attrs, frag)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64, np.float16):
        for _ in range(16):
            case(args.qat, tally, rng, dtype)
    bad_inputs(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
