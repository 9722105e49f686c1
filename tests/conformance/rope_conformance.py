"""Conformance of rope (and its inverse, the backward) against torch 1.13 running the
arithmetic of transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb:
    inv_freq = 1 / theta ** (arange(0, D, 2).float() / D)           (f32)
    freqs    = inv_freq[None, :, None] @ position_ids[:, None, :].float(), transposed
    emb      = cat(freqs, freqs); cos, sin = emb.cos(), emb.sin()    (f32), cast to x's dtype
    y        = x * cos[:, None] + rotate_half(x) * sin[:, None]      (in x's dtype)
in f32, f64 and f16 (.npy has no bf16: tests/ops_rope pins torch's bf16 results instead).

Three checks per case:
  1. inv_freq: ours (f64 power rounded to f32) equals torch's f32 one bit for bit, for the
     head dims and thetas drawn here (2..128; 1e4, 5e5).
  2. y with our cos and sin (f32(cos(f64(angle)))): torch's element-wise steps must give our
     y bit for bit, and torch.autograd of those steps our inverse rotation of dy (each
     product and the sum rounded to the dtype).
  3. y against the recipe above, torch's own f32 cos/sin: those are vectorised and within an
     ulp of ours, so y agrees to max |x| * 4e-7 in f32 and f64 (whose cos/sin are f32
     values too), and to max |x| * 2^-9 in f16 (an ulp of cos moved across an f16 rounding
     boundary, then the sum's rounding).
Positions are steps 0..T-1 (offset up to 4000) or random in [0, 8192), [batch, T] or [1, T].
Fresh seed per run (printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, check_bad_input, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "rope_conformance"
DTYPES = {np.float32: torch.float32, np.float64: torch.float64, np.float16: torch.float16}
RECIPE_TOL = {np.float32: 4e-7, np.float64: 4e-7, np.float16: 2.0 ** -9}
F32 = np.float32


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def torch_inv_freq(d, theta):
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def our_inv_freq(d, theta):
    e = (np.arange(0, d, 2).astype(F32) / F32(d)).astype(F32)
    p = np.power(np.float64(F32(theta)), e.astype(np.float64)).astype(F32)
    return (F32(1) / p).astype(F32)


def cos_sin(angle_f32, dtype):
    """[P, T, D/2] f32 angles -> cos, sin [P, 1, T, D] of x's dtype (cat(freqs, freqs))."""
    c = torch.from_numpy(np.cos(angle_f32.astype(np.float64)).astype(F32))
    s = torch.from_numpy(np.sin(angle_f32.astype(np.float64)).astype(F32))
    c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.to(DTYPES[dtype])[:, None], s.to(DTYPES[dtype])[:, None]


def case(qat, tally, rng, dtype):
    b, h, t = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 10))
    d = int(rng.choice([2, 4, 8, 16, 32, 64, 128]))
    theta = float(rng.choice([1e4, 5e5]))
    rows = 1 if rng.integers(0, 2) else b
    if rng.integers(0, 2):
        pos = np.arange(t, dtype=np.int64)[None, :] + rng.integers(0, 4000, size=(rows, 1))
    else:
        pos = rng.integers(0, 8192, size=(rows, t)).astype(np.int64)
    x = rng.normal(0, 2, size=(b, h, t, d)).astype(dtype)
    dy = rng.normal(size=(b, h, t, d)).astype(dtype)
    name = np.dtype(dtype).name
    op, bop = f"rope {name}", f"rope inverse {name}"
    attrs = {"rope_theta": theta}
    y = run_op(qat, "rope", {"x": x, "position_ids": pos}, ["y"], attrs)["y"]
    dx = run_op(qat, "rope", {"x": dy, "position_ids": pos}, ["y"], {**attrs, "inverse": True})["y"]

    inv = our_inv_freq(d, theta)
    tally.check(op, np.array_equal(inv, torch_inv_freq(d, theta).numpy()),
                f"inv_freq D={d} theta={theta} differs from torch's")

    angle = (pos.astype(F32)[:, :, None] * inv[None, None, :]).astype(F32)
    c, s = cos_sin(angle, dtype)
    xt = torch.tensor(x, requires_grad=True)
    y_steps = xt * c + rotate_half(xt) * s
    y_steps.backward(torch.from_numpy(dy))
    tally.check(op, np.array_equal(y, y_steps.detach().numpy()),
                f"y {list(x.shape)} differs from torch's steps on our cos/sin")
    tally.check(bop, np.array_equal(dx, xt.grad.numpy()),
                f"inverse of dy {list(x.shape)} differs from torch.autograd of the steps")

    inv_t = torch_inv_freq(d, theta)
    p = torch.from_numpy(pos)
    freqs = (inv_t[None, :, None].expand(p.shape[0], -1, 1) @ p[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    ct, st = emb.cos().to(DTYPES[dtype])[:, None], emb.sin().to(DTYPES[dtype])[:, None]
    xr = torch.from_numpy(x)
    y_recipe = (xr * ct + rotate_half(xr) * st).numpy()
    err = float(np.max(np.abs(y.astype(np.float64) - y_recipe.astype(np.float64))))
    bound = RECIPE_TOL[dtype] * float(np.max(np.abs(x)))
    tally.check(op, err <= bound,
                f"y {list(x.shape)} vs transformers' recipe: {err:.3g} > {bound:.3g}")


def bad_inputs(qat, tally):
    x = np.zeros((2, 3, 4, 8), np.float32)
    pos = np.zeros((2, 4), np.int64)
    cases = [
        ({"x": np.zeros((2, 3, 4, 7), np.float32), "position_ids": pos}, {}, "head_dim = 7"),
        ({"x": x, "position_ids": np.zeros((2, 5), np.int64)}, {}, "position_ids must be [2, 4]"),
        ({"x": x, "position_ids": np.zeros((2, 4), np.int32)}, {}, "position_ids must be i64"),
        ({"x": x, "position_ids": pos}, {"rope_theta": -1.0}, "'rope_theta'"),
    ]
    for ins, attrs, frag in cases:
        check_bad_input(qat, tally, "rope", ins, ["y"], attrs, frag)


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
