"""Conformance of lsq_fake_quantize / lsq_backward against PyTorch 1.13 (CPU, f32).

  - forward y: bit-exact against torch._fake_quantize_learnable_per_{tensor,channel}_affine,
    also with exact .5 ties and fractional zero points (both round them half to even, clamp);
  - dx: exact (dy where the code is in range, else 0; torch's 0 may be -0);
  - gradient cases avoid exact .5 ties: torch 1.13's learnable backward rounds x * inv + zp
    (not rint(x * inv) + zp as its forward does), so at a tie with an odd zp its backward
    disagrees with its own forward; we follow the forward and SEMANTICS.md;
  - per-tensor gradient cases use zero points >= 0: torch 1.13's per-tensor backward reads
    the zero point as int64(zp + 0.5), i.e. zp + 1 for a negative integer zp (its
    per-channel backward is right; per-channel cases keep negative zero points);
  - dscale, dzero_point: relative error <= 1e-5 against torch's autograd, with integer
    zero points (torch's backward rounds zp as zp + 0.5 truncated, which equals ours only on
    integers), with an explicit grad_factor and with our default 1/sqrt(numel * quant_max)
    (passed to torch explicitly, as torch's _LearnableFakeQuantize does).
dscale/dzero_point are also checked against an f64 NumPy reference written from SEMANTICS.md
(relative error <= 1e-5). Against torch the difference may instead stay within torch's own
f32 rounding bound: torch rounds v = x * inv to f32 before subtracting rint(v), losing up to
|v| * 2^-24 per in-range term, and sums mixed-sign terms in f32; cancellation can make either
exceed 1e-5 of the sum. Our terms are exact and summed in f64; the NumPy check holds them to
1e-5.
Per group (groups of g along the last axis of [rows, groups * g]: the learned weight ranges
of the language-model recipes), against two oracles:
  - torch 1.13's per-channel learnable op over the [rows * groups, g] view (axis 0): the same
    checks as above;
  - torchao's range-learning formula, y = (clamp(round_ste(x * (1 / s)) + zp, qmin, qmax) - zp)
    * s with plain torch autograd (round_ste: round forward, identity backward) and our
    grad_factor 1: y bit-exact; dx within 1e-6 relative (autograd forms dy * s * (1 / s));
    dscale within its f32 rounding bound.
Non-finite inputs are not compared (torch casts them to int64: undefined); the C++ tests
cover them. Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402
from quant_case_utils import (SIZES, broadcast, first_diff, rand_scale,  # noqa: E402
                              rand_shape, rand_values, same_bits)

import torch  # noqa: E402

SUITE = "lsq_conformance"
TOL = 1e-5


def rand_range(rng, need_positive_qmax):
    kind = int(rng.integers(0, 4))
    bits = int(rng.choice([8, 8, 4, 2, 3, 7]))
    if kind == 0:
        return {"bits": bits}, 0, 2 ** bits - 1
    if kind == 1:
        return {"bits": bits, "signed": True}, -2 ** (bits - 1), 2 ** (bits - 1) - 1
    if kind == 2:
        return ({"bits": bits, "signed": True, "narrow_range": True}, -(2 ** (bits - 1) - 1),
                2 ** (bits - 1) - 1)
    # torch's learnable backward requires quant_min <= 0 <= quant_max.
    lo = int(rng.integers(-200, 1))
    hi = int(rng.integers(max(1 if need_positive_qmax else 0, lo + 1), 300))
    return {"quant_min": lo, "quant_max": hi}, lo, hi


def without_chance_ties(x, scale_b, zp_b):
    """Moves x off the values where x * inv, or x * inv + zp as torch's backward computes it,
    is an exact .5 in f32: such an x becomes (floor(x * inv) + 0.25) * scale, a quarter step
    into the same integer cell. Random draws hit ties by chance (seed 1942280848:
    x * inv == 71.5 with zp 121, where the forward's rint(71.5) + 121 = 193 and torch's
    backward's rint(192.5) = 192 differ by one code, so the in-range dscale term flips sign);
    the gradient cases exclude ties on purpose. (Stepping x by one f32 ulp is not enough: with
    a large zp, x * inv + zp stays on the tie for many steps of x.)"""
    scale = np.broadcast_to(np.asarray(scale_b, np.float32), x.shape)
    inv = (np.float32(1) / scale).astype(np.float32)
    zp = np.asarray(zp_b, np.float32)

    def ties(x):
        v = (x * inv).astype(np.float32)
        w = (v + zp).astype(np.float32)
        return (np.abs(v - np.trunc(v)) == 0.5) | (np.abs(w - np.trunc(w)) == 0.5), v

    tie, v = ties(x)
    x = np.where(tie, ((np.floor(v) + np.float32(0.25)) * scale).astype(np.float32), x)
    x = x.astype(np.float32)
    assert not ties(x)[0].any(), "a quarter step left x on a .5 tie"
    return x


def rel_err(ours, want, floor):
    d = np.abs(ours.astype(np.float64) - want.astype(np.float64)).max(initial=0.0)
    return d / max(np.abs(want.astype(np.float64)).max(initial=0.0), floor)


def lsq_case(qat, rng, tally, scope, default_gf, frac_zp=False, forward_ties=False):
    shape = rand_shape(rng, min_rank=1 if scope == "channel" else 0)
    rank = len(shape)
    attrs, qmin, qmax = rand_range(rng, need_positive_qmax=default_gf)
    # Exact .5 ties only in forward cases: torch's learnable backward classifies an element
    # by rint(x * inv + zp), its forward (and SEMANTICS.md) by rint(x * inv) + zp; with an
    # odd zp a tie lands in range in the forward and out of range in torch's backward.
    ties = frac_zp or forward_ties
    axis = int(rng.integers(-rank, rank)) if rank else 0
    qshape = (1,) if scope == "tensor" else (shape[axis],)
    n = int(np.prod(qshape))
    scale = rand_scale(rng, n, ties).reshape(qshape)
    # torch 1.13's per-tensor learnable backward takes the zero point as int64(zp + 0.5)
    # (truncation), so a negative integer zp becomes zp + 1 there (its forward and the
    # per-channel op use the true zp): per-tensor gradient cases draw zp >= 0.
    zlo = max(qmin, 0) if scope == "tensor" and not (frac_zp or forward_ties) else qmin
    zp = rng.integers(zlo, qmax + 1, size=n).astype(np.float32).reshape(qshape)
    if frac_zp:  # forward only: fractional zero points, including exact .5
        zp = (zp + rng.choice([-0.5, 0.5, 0.25, -0.3, 0.49], size=qshape)).astype(np.float32)
    scale_b = broadcast(scope, shape, scale, axis, 1)
    zp_b = broadcast(scope, shape, np.clip(np.rint(zp), qmin, qmax), axis, 1)
    x = rand_values(rng, shape, scale_b, zp_b, qmin, qmax, ties)
    if not ties:
        x = without_chance_ties(x, broadcast(scope, shape, scale, axis, 1), zp_b)
    dy = rng.uniform(-2, 2, size=shape).astype(np.float32)
    numel = max(int(np.prod(shape)), 1)
    gf = 1.0 / np.sqrt(float(numel) * float(qmax)) if default_gf else float(rng.uniform(0.05, 2))
    attrs = dict(attrs, scope=scope)
    if scope == "channel":
        attrs["axis"] = axis
    if not default_gf:
        attrs["grad_factor"] = gf
    ins = {"x": x, "scale": scale, "zero_point": zp}
    y = run_op(qat, "lsq_fake_quantize", ins, ["y"], attrs=attrs)["y"]

    # torch's per-channel backward mis-shapes dscale for rank-1 inputs: a trailing 1 changes
    # nothing else.
    tshape = shape + (1,) if scope == "channel" and rank == 1 else shape
    xt = torch.from_numpy(x.reshape(tshape).copy()).requires_grad_(True)
    st = torch.from_numpy(scale.copy()).requires_grad_(True)
    zt = torch.from_numpy(zp.copy()).requires_grad_(True)
    if scope == "tensor":
        ty = torch._fake_quantize_learnable_per_tensor_affine(xt, st, zt, qmin, qmax, gf)
        ty_np = ty.detach().numpy()
    else:
        ty = torch._fake_quantize_learnable_per_channel_affine(xt, st, zt, axis % rank, qmin,
                                                               qmax, gf)
    ty_np = ty.detach().numpy().reshape(shape)
    label = f"lsq/{scope}"
    desc = f"shape {shape} attrs {attrs}"
    kind = "/fractional-zp" if frac_zp else ("/ties" if forward_ties else "")
    tally.check(f"torch {label}/forward{kind}",
                same_bits(y, ty_np), f"{desc}: {first_diff(y, ty_np)}")
    if frac_zp or forward_ties:
        return
    g = run_op(qat, "lsq_backward", dict(ins, dy=dy), ["dx", "dscale", "dzero_point"],
               attrs=attrs)
    ty.backward(torch.from_numpy(dy.reshape(tshape)))
    tdx = xt.grad.numpy().reshape(shape)
    tag = "default-gf" if default_gf else "explicit-gf"
    # Compared by value: torch's dx = dy * mask is -0 where dy < 0 and the mask is 0.
    tally.check(f"torch {label}/dx", g["dx"].shape == tdx.shape and np.array_equal(g["dx"], tdx),
                f"{desc}: {first_diff(g['dx'], tdx)}")
    # Reference from SEMANTICS.md in f64 (classification by the f32 code, as the forward):
    # in range dscale += dy * (rint(v) - x * inv) with the exact product, out of range
    # dscale += dy * (end - zp), dzp += -dy * scale; summed per scope, times gf.
    xs, dys = x.reshape(shape), dy.reshape(shape)
    inv = (np.float32(1) / scale).astype(np.float32)
    inv_b = broadcast(scope, shape, inv, axis, 1)
    v = (xs * inv_b).astype(np.float32)
    code = np.rint(v) + zp_b.astype(np.float32)
    below, above = code < qmin, code > qmax
    inside = ~(below | above)
    z64 = np.asarray(zp_b, np.float64)
    t_scale = np.where(inside, dys * (np.rint(v).astype(np.float64) -
                                      xs.astype(np.float64) * inv_b.astype(np.float64)),
                       dys * (np.where(below, qmin, qmax) - z64))
    t_zp = np.where(inside, 0.0, -dys.astype(np.float64) *
                    np.asarray(scale_b, np.float64))
    # torch rounds v to f32 before subtracting rint(v) and sums in f32: its own error bound.
    t_err = {"dscale": np.where(inside, np.abs(dys) * (np.abs(v.astype(np.float64)) + 1),
                                np.abs(t_scale)),
             "dzero_point": np.abs(t_zp)}

    def per_scope(t):
        t = np.broadcast_to(t, shape)
        if scope == "tensor":
            return np.array([t.sum()])
        return np.moveaxis(t, axis, 0).reshape(shape[axis], -1).sum(axis=1)

    n_terms = max(int(np.prod(shape)) // qshape[0], 1)
    bound = {k: gf * per_scope(t) * 2.0 ** -24 * (4 + np.log2(n_terms)) for k, t in t_err.items()}
    ref = {"dscale": gf * per_scope(t_scale), "dzero_point": gf * per_scope(t_zp)}
    for name, want in (("dscale", st.grad.numpy()), ("dzero_point", zt.grad.numpy())):
        got = g[name]
        ok = got.shape == want.shape and got.dtype == np.float32
        r = ref[name].reshape(want.shape)
        # Ours against the f64 reference: relative error <= 1e-5 (floor 1e-30: exact zeros).
        err_ref = rel_err(got, r, 1e-30) if ok else np.inf
        tally.check(f"numpy {label}/{name}/{tag}", err_ref <= TOL,
                    f"{desc}: {name} rel err {err_ref:.3g} vs f64 reference: ours "
                    f"{got.reshape(-1)[:4]} ref {r.reshape(-1)[:4]}")
        # Against torch: relative error <= 1e-5, or within torch's own f32 rounding bound
        # (its in-range term loses |v| * 2^-24 to cancellation, so a sum of a few terms of
        # ~0.1 at |v| ~ 200 can sit 1e-4 away from the exact value; its f32 sums of
        # mixed-sign terms lose (4 + log2 n) * 2^-24 * sum|terms|).
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) if ok else np.inf
        allowed = np.maximum(TOL * np.abs(want.astype(np.float64)),
                             bound[name].reshape(want.shape))
        within = ok and bool(np.all(diff <= allowed + 1e-30))
        tally.check(f"torch {label}/{name}/{tag}", within,
                    f"{desc}: {name} diff {np.max(diff, initial=0):.3g} allowed "
                    f"{np.min(allowed, initial=0):.3g}: ours {got.reshape(-1)[:4]} torch "
                    f"{want.reshape(-1)[:4]}")


class RoundSte(torch.autograd.Function):
    """torchao's round in range learning: round half to even forward, identity backward."""

    @staticmethod
    def forward(ctx, v):
        return torch.round(v)

    @staticmethod
    def backward(ctx, grad):
        return grad


def lsq_group_case(qat, rng, tally):
    rows, groups, g = (int(rng.choice(SIZES)) for _ in range(3))
    attrs, qmin, qmax = rand_range(rng, need_positive_qmax=False)
    n = rows * groups
    scale = rand_scale(rng, n, False)
    zp = rng.integers(qmin, qmax + 1, size=n).astype(np.float32)
    view = (n, g)  # the groups as channels (axis 0)
    scale_b, zp_b = scale.reshape(n, 1), zp.reshape(n, 1)
    x = without_chance_ties(rand_values(rng, view, scale_b, zp_b, qmin, qmax, False), scale_b,
                            zp_b)
    dy = rng.uniform(-2, 2, size=view).astype(np.float32)
    attrs = dict(attrs, scope="group", axis=-1, group_size=g, grad_factor=1.0)
    ins = {"x": x.reshape(rows, groups * g), "scale": scale.reshape(rows, groups),
           "zero_point": zp.reshape(rows, groups)}
    y = run_op(qat, "lsq_fake_quantize", ins, ["y"], attrs=attrs)["y"].reshape(view)
    ours = run_op(qat, "lsq_backward", dict(ins, dy=dy.reshape(rows, groups * g)),
                  ["dx", "dscale", "dzero_point"], attrs=attrs)
    dx, dscale, dzp = (ours[k].reshape(-1) for k in ("dx", "dscale", "dzero_point"))
    desc = f"[{rows}, {groups} x {g}] attrs {attrs}"

    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    st = torch.from_numpy(scale.copy()).requires_grad_(True)
    zt = torch.from_numpy(zp.copy()).requires_grad_(True)
    ty = torch._fake_quantize_learnable_per_channel_affine(xt, st, zt, 0, qmin, qmax, 1.0)
    ty.backward(torch.from_numpy(dy))
    xa = torch.from_numpy(x.copy()).requires_grad_(True)
    sa = torch.from_numpy(scale_b.copy()).requires_grad_(True)
    za = torch.from_numpy(zp_b.copy())
    q = torch.clamp(RoundSte.apply(xa * (1.0 / sa)) + za, qmin, qmax)
    ya = (q - za) * sa
    ya.backward(torch.from_numpy(dy))

    tally.check("torch lsq/group/forward", same_bits(y, ty.detach().numpy()),
                f"{desc}: {first_diff(y, ty.detach().numpy())}")
    tally.check("torchao-formula lsq/group/forward", same_bits(y, ya.detach().numpy()),
                f"{desc}: {first_diff(y, ya.detach().numpy())}")
    tdx = xt.grad.numpy().reshape(-1)
    tally.check("torch lsq/group/dx", np.array_equal(dx, tdx), f"{desc}: {first_diff(dx, tdx)}")
    adx = xa.grad.numpy().reshape(-1)
    tally.check("torchao-formula lsq/group/dx", np.allclose(dx, adx, rtol=1e-6, atol=0),
                f"{desc}: {first_diff(dx, adx)}")
    # Each dscale term carries |dy| * (|v| + |code|) of f32 rounding in torch's forms.
    v = np.abs((x * (np.float32(1) / scale_b)).astype(np.float64))
    code = np.maximum(abs(qmin), abs(qmax)) + np.abs(zp_b.astype(np.float64))
    bound = (np.abs(dy) * (v + code + 1)).sum(axis=1) * 2.0 ** -22 * (4 + np.log2(g))
    for oracle, want in (("torch", st.grad.numpy()), ("torchao-formula", sa.grad.numpy())):
        want = want.reshape(-1).astype(np.float64)
        diff = np.abs(dscale.astype(np.float64) - want)
        ok = bool(np.all(diff <= np.maximum(TOL * np.abs(want), bound) + 1e-30))
        tally.check(f"{oracle} lsq/group/dscale", ok,
                    f"{desc}: dscale diff {diff.max(initial=0):.3g}: ours {dscale[:4]} "
                    f"{oracle} {want[:4]}")
    tzp = zt.grad.numpy().reshape(-1).astype(np.float64)
    zdiff = np.abs(dzp.astype(np.float64) - tzp)
    zbound = (np.abs(dy) * scale_b).sum(axis=1) * 2.0 ** -22 * (4 + np.log2(g))
    tally.check("torch lsq/group/dzero_point",
                bool(np.all(zdiff <= np.maximum(TOL * np.abs(tzp), zbound) + 1e-30)),
                f"{desc}: dzero_point diff {zdiff.max(initial=0):.3g}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for scope in ("tensor", "channel"):
        for _ in range(60):
            lsq_case(args.qat, rng, tally, scope, default_gf=True)
            lsq_case(args.qat, rng, tally, scope, default_gf=False)
        for _ in range(30):
            lsq_case(args.qat, rng, tally, scope, default_gf=True, frac_zp=True)
            lsq_case(args.qat, rng, tally, scope, default_gf=True, forward_ties=True)
    for _ in range(60):
        lsq_group_case(args.qat, rng, tally)
    tally.finish()


if __name__ == "__main__":
    main()
