"""Conformance of causal_attention and causal_attention_backward against torch 1.13 running
the composed attention: k and v repeated to the query heads as transformers' repeat_kv does
(KV head j serves query heads j * group .. (j + 1) * group - 1), scores = q k^T * scale plus a
causal mask of -inf above the diagonal, softmax over the keys, times v; lse is torch's
logsumexp of the masked scores. The reference runs in f64 on the same input values, forward
and backward. The backward op runs alone through `qat op` on our o and lse with a random do;
its reference is the backward's own formula in f64 given that o (D = do . o reads the o it is
handed, as flash attention's backward does), and for f32 and f64, where o is close to exact,
also torch.autograd of the composed forward. Row i always sees key i, so no row is fully masked; T = 1 (one key
per row) is among the cases. bf16 is not here: .npy has no bf16 (tests/ops_attention checks
bf16 against the f32 composed graph instead).

Random cases: batch 1-2, query heads 1-8 with a KV head count dividing them (GQA, MQA, none),
T from 1 to 100 (odd and even), head dims 64 and 128 (the CUDA kernels' sizes) and a few odd
ones (the CPU takes any), the default scale hd^-1/2 or a random one, values at two scales.

Tolerances, as a fraction of max |ref| (at least 1 for lse, which can be near 0, and at
least the gradients' natural scale, below, for gradients that cancel), plus
4 * cond, where cond = u * max_ij scale * sum_d |q_id k_jd| is the scores' own rounding in the
math type (u = 2^-24 for f32 and f16, 2^-53 for f64): large scores amplify it, in torch too.
  o, lse      f64 1e-12; f32 2e-6 (sums of up to 100 terms in f32, a few ulps); f16 2^-10
              (o is the f32 result rounded once to f16: half an f16 ulp, 2^-11, plus f32 error).
  dq, dk, dv  f64 1e-12; f32 1e-5; f16 4e-3 (each gradient rounds once to f16 after sums
              whose terms p (dp - D) can cancel).
Fresh seed per run (printed) unless --seed is given.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, check_bad_input, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "causal_attention_conformance"
FORWARD_TOL = {np.float32: 2e-6, np.float64: 1e-12, np.float16: 2.0 ** -10}
BACKWARD_TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 4e-3}


def close(tally, op, ours, ref, floor, tol, what, cond=0.0):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        tally.check(op, False, f"{what}: shape {ours.shape} vs torch {ref.shape}")
        return
    bound = (tol + 4 * cond) * max(float(np.max(np.abs(ref), initial=0.0)), floor, 1e-30)
    err = float(np.max(np.abs(ours - ref), initial=0.0))
    tally.check(op, err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}")


def composed_attention(q, k, v, scale):
    """torch's composed causal attention with repeat_kv; returns o and the row logsumexp."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    t = q.shape[2]
    mask = torch.triu(torch.full((t, t), float("-inf"), dtype=q.dtype), diagonal=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v), torch.logsumexp(scores, dim=-1)


def backward_given_o(q, k, v, o, dout, scale):
    """The backward's formula in f64 on the o it is given: p from the exact scores,
    D = do . o, ds = p (do . v - D); dk and dv summed over each KV head's query heads."""
    n, kv, t, hd = k.shape
    group = q.shape[1] // kv
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = torch.triu(torch.full((t, t), float("-inf"), dtype=q.dtype), diagonal=1)
    p = torch.softmax(torch.matmul(q, kr.transpose(-1, -2)) * scale + mask, dim=-1)
    dp = torch.matmul(dout, vr.transpose(-1, -2))
    ds = p * (dp - (dout * o).sum(-1, keepdim=True))
    dq = scale * torch.matmul(ds, kr)
    dk = scale * torch.matmul(ds.transpose(-1, -2), q).reshape(n, kv, group, t, hd).sum(2)
    dv = torch.matmul(p.transpose(-1, -2), dout).reshape(n, kv, group, t, hd).sum(2)
    return dq, dk, dv


def case(qat, tally, rng, dtype):
    n = int(rng.integers(1, 3))
    heads = int(rng.choice([1, 2, 4, 8]))
    kv = int(rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0]))
    t = int(rng.choice([1, 2, 3, 7, 16, 33, 64, 100]))
    hd = int(rng.choice([64, 128, 64, 128, 1, 5, 8]))
    attrs = {}
    scale = 1.0 / math.sqrt(hd)
    if rng.random() < 0.3:
        scale = float(rng.uniform(0.02, 0.5))
        attrs["scale"] = scale
    spread = float(rng.choice([0.5, 2.0]))
    q = rng.normal(0, spread, size=(n, heads, t, hd)).astype(dtype)
    k = rng.normal(0, spread, size=(n, kv, t, hd)).astype(dtype)
    v = rng.normal(0, 1, size=(n, kv, t, hd)).astype(dtype)
    dout = rng.normal(0, 1, size=(n, heads, t, hd)).astype(dtype)
    name = np.dtype(dtype).name
    what = f"[{n},{heads},{t},{hd}] kv {kv} scale {scale:.3g}"
    out = run_op(qat, "causal_attention", {"q": q, "k": k, "v": v}, ["o", "lse"], attrs)
    qt, kt, vt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    o_ref, lse_ref = composed_attention(qt, kt, vt, scale)
    unit = 2.0 ** -53 if dtype == np.float64 else 2.0 ** -24
    group = heads // kv
    qa, ka = np.abs(q.astype(np.float64)), np.abs(k.astype(np.float64))
    ka = np.repeat(ka, group, axis=1)
    cond = unit * scale * float(np.max(np.matmul(qa, np.swapaxes(ka, -1, -2))))
    fop = f"causal_attention {name}"
    close(tally, fop, out["o"], o_ref.detach().numpy(), 0.0, FORWARD_TOL[dtype], f"o {what}",
          cond)
    lse_tol = FORWARD_TOL[np.float64 if dtype == np.float64 else np.float32]
    close(tally, fop, out["lse"], lse_ref.detach().numpy(), 1.0, lse_tol, f"lse {what}", cond)

    back = run_op(qat, "causal_attention_backward",
                  {"q": q, "k": k, "v": v, "o": out["o"], "lse": out["lse"], "do": dout},
                  ["dq", "dk", "dv"], attrs)
    bop = f"causal_attention_backward {name}"
    as64 = [torch.tensor(a, dtype=torch.float64) for a in (q, k, v, out["o"], dout)]
    given_o = backward_given_o(*as64, scale)
    names = ("dq", "dk", "dv")
    # Where the softmax is nearly one-hot the exact gradients nearly cancel (T = 1: dq = dk =
    # 0), so each is also measured against its natural scale: ds ~ |do| |v|, times scale |k|
    # for dq, scale |q| for dk; dv ~ |do|.
    mx = {a: float(np.max(np.abs(x.astype(np.float64)))) for a, x in
          (("q", q), ("k", k), ("v", v), ("do", dout))}
    floors = (scale * mx["k"] * mx["do"] * mx["v"], scale * mx["q"] * mx["do"] * mx["v"], mx["do"])
    for label, ref, floor in zip(names, given_o, floors):
        close(tally, bop, back[label], ref.numpy(), floor, BACKWARD_TOL[dtype],
              f"{label} {what} (given o)", cond)
    if dtype != np.float16:  # f16's o is too far from exact for the autograd reference
        o_ref.backward(torch.tensor(dout, dtype=torch.float64))
        for label, ref, floor in zip(names, (qt.grad, kt.grad, vt.grad), floors):
            close(tally, bop, back[label], ref.numpy(), floor, BACKWARD_TOL[dtype],
                  f"{label} {what} (autograd)", cond)


def bad_inputs(qat, tally):
    f = np.float32
    q = np.zeros((2, 4, 5, 8), f)
    k = np.zeros((2, 2, 5, 8), f)
    lse = np.zeros((2, 4, 5), f)
    cases = [
        ("causal_attention", {"q": q[0], "k": k, "v": k}, ["o"], {}, "q must be [batch, heads"),
        ("causal_attention", {"q": q, "k": np.zeros((2, 3, 5, 8), f), "v": np.zeros((2, 3, 5, 8), f)},
         ["o"], {}, "multiple of the 3 KV heads"),
        ("causal_attention", {"q": q, "k": k, "v": np.zeros((2, 2, 5, 4), f)}, ["o"], {},
         "must have the same shape"),
        ("causal_attention", {"q": q, "k": k.astype(np.float64), "v": k.astype(np.float64)}, ["o"],
         {}, "dtype mismatch"),
        ("causal_attention", {"q": q[:, :, :0], "k": k[:, :, :0], "v": k[:, :, :0]}, ["o"], {},
         "seq must be at least 1"),
        ("causal_attention", {"q": q, "k": k, "v": k}, ["o"], {"scale": 0.0}, "'scale'"),
        ("causal_attention_backward",
         {"q": q, "k": k, "v": k, "o": q, "lse": lse.astype(np.float64), "do": q}, ["dq"], {},
         "lse must be f32[2, 4, 5]"),
    ]
    for op, ins, outs, attrs, frag in cases:
        check_bad_input(qat, tally, op, ins, outs, attrs, frag)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64, np.float16):
        for _ in range(12):
            case(args.qat, tally, rng, dtype)
    bad_inputs(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
