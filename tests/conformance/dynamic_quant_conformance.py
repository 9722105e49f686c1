"""Conformance of dynamic_range_quantize against a NumPy reference written from SEMANTICS.md
("Dynamic-range quantize"; PyTorch has no single op for it), and per-token symmetric also
against the plain-torch formula scale = amax / 127, q = clamp(round(x * (1 / scale))).

Reference, per scope (tensor, channel on any axis, token, group with a tail), in f32:
  finite values only; min_neg = min(min, 0), max_pos = max(max, 0);
  all zero (or no finite value): scale 1, zp clamp(0, qmin, qmax);
  symmetric: scale = amax / qmax, zp 0;  affine: scale = (max_pos - min_neg) / (qmax - qmin),
  zp = clamp(qmin - rint(min_neg / scale), qmin, qmax);  a scale whose reciprocal overflows
  counts as all zero;  q = clamp(rint(x * (1 / scale)) + zp, qmin, qmax), NaN -> zp.
Everything (codes, scales, zero points) bit-exact. Random shapes incl. size-1 and odd sizes,
all-zero scopes, one-signed data, +/-0, NaN/Inf, f64/f16 inputs, empty tensors. Fresh random
seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402
from quant_case_utils import (broadcast, first_diff, qparam_shape, rand_shape,  # noqa: E402
                              same_bits, scope_attrs)

import torch  # noqa: E402

SUITE = "dynamic_quant_conformance"
OUTS = ["q", "scale", "zero_point"]


def rand_range(rng, mode):
    """(attrs, qmin, qmax, storage); symmetric mode needs qmin < 0 < qmax."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return {}, -127, 127, np.int8  # the default
    if kind == 1:
        return {"narrow_range": False}, -128, 127, np.int8
    if mode == "affine" and kind == 2:
        return {"signed": False, "narrow_range": False}, 0, 255, np.uint8
    if mode == "affine":
        lo = int(rng.integers(0, 100))
        return {"quant_min": lo, "quant_max": lo + int(rng.integers(1, 256 - lo))}, lo, None, np.uint8
    lo, hi = -int(rng.integers(1, 129)), int(rng.integers(1, 128))
    return {"quant_min": lo, "quant_max": hi}, lo, hi, np.int8


def rand_data(rng, shape, scope_idx, n_scopes, nonfinite):
    x = rng.normal(rng.normal(0, 2), np.exp(rng.uniform(-6, 4)), size=shape)
    kind = rng.integers(0, 4)
    if kind == 1:
        x = np.abs(x) * rng.choice([-1, 1])  # one-signed data: min_neg or max_pos is 0
    if x.size and rng.integers(0, 3) == 0:  # some scopes entirely zero (+0 and -0)
        zero = rng.integers(0, n_scopes, size=max(1, n_scopes // 3))
        hit = np.isin(scope_idx, zero)
        x = np.where(hit, rng.choice([0.0, -0.0], size=shape), x)
    x = x.astype(np.float32)
    if x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, size=max(1, flat.size // 10))] = rng.choice([0.0, -0.0])
        if nonfinite:
            for v in (np.nan, np.inf, -np.inf):
                flat[rng.integers(0, flat.size, size=max(1, flat.size // 8))] = v
    return x


def reference(x, scope_idx, n, mode, qmin, qmax, storage):
    mt = np.float64 if x.dtype == np.float64 else np.float32
    xm = x.astype(mt)
    finite = np.isfinite(xm)
    lo = np.full(n, np.inf, mt)
    hi = np.full(n, -np.inf, mt)
    np.minimum.at(lo, scope_idx[finite], xm[finite])
    np.maximum.at(hi, scope_idx[finite], xm[finite])
    f = np.float32
    any_finite = lo <= hi
    min_neg = np.where(any_finite, np.minimum(lo.astype(f), f(0)), f(0)).astype(f)
    max_pos = np.where(any_finite, np.maximum(hi.astype(f), f(0)), f(0)).astype(f)
    unit_zp = f(min(max(0, qmin), qmax))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if mode == "symmetric":
            scale = (np.maximum(-min_neg, max_pos) / f(qmax)).astype(f)
        else:
            scale = ((max_pos - min_neg) / f(qmax - qmin)).astype(f)
        unit = ((min_neg == 0) & (max_pos == 0)) | ~np.isfinite(f(1) / scale)
        zp = np.zeros(n, f)
        if mode == "affine":
            zp = np.clip(f(qmin) - np.rint((min_neg / scale).astype(f)), f(qmin), f(qmax)).astype(f)
        scale = np.where(unit, f(1), scale).astype(f)
        zp = np.where(unit, unit_zp, zp).astype(f)
        inv = (mt(1) / scale.astype(mt)).astype(mt)
        z = zp.astype(mt)[scope_idx]
        q = (np.rint(xm * inv[scope_idx]) + z).astype(mt)
        q = np.where(np.isnan(xm), z, np.clip(q, mt(qmin), mt(qmax)))
    return q.astype(storage), scale, zp.astype(np.int32)


def case(qat, rng, tally, scope, mode, dtype=np.float32, nonfinite=False, shape=None,
         default_range=False):
    if shape is None:
        shape = rand_shape(rng, min_rank=0 if scope == "tensor" else 1)
    rank = len(shape)
    attrs, qmin, qmax, storage = ({}, -127, 127, np.int8) if default_range else \
        rand_range(rng, mode)
    if qmax is None:
        qmax = attrs["quant_max"]
    axis = int(rng.integers(-rank, rank)) if rank else 0
    gs = int(rng.integers(1, shape[axis] + 3)) if rank and shape[axis] else 1
    qshape = qparam_shape(scope, shape, axis, gs)
    n = int(np.prod(qshape))
    scope_idx = np.broadcast_to(broadcast(scope, shape, np.arange(n).reshape(qshape), axis, gs),
                                shape)
    x = rand_data(rng, shape, scope_idx, n, nonfinite)
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    attrs = dict(attrs, mode=mode, **scope_attrs(scope, axis, gs))
    out = run_op(qat, "dynamic_range_quantize", {"x": x}, OUTS, attrs=attrs)
    rq, rs, rz = reference(x, scope_idx, n, mode, qmin, qmax, storage)
    desc = f"shape {shape} attrs {attrs}"
    label = f"numpy dynamic_range_quantize/{scope}/{mode}" + \
        ("" if dtype == np.float32 else f"/{np.dtype(dtype)}") + ("/nonfinite" if nonfinite else "")
    ok = (same_bits(out["q"], rq) and same_bits(out["scale"].reshape(-1), rs) and
          same_bits(out["zero_point"].reshape(-1), rz) and out["scale"].shape == tuple(qshape))
    tally.check(label, ok, f"{desc}: q {first_diff(out['q'], rq)}; scale "
                f"{first_diff(out['scale'].reshape(-1), rs)}; zp "
                f"{first_diff(out['zero_point'].reshape(-1), rz)}")
    if scope == "token" and mode == "symmetric" and not attrs.get("quant_min") and \
            attrs.get("narrow_range", True) and dtype == np.float32 and not nonfinite and x.size:
        # The plain-torch per-token formula (default range [-127, 127]).
        xt = torch.from_numpy(x)
        amax = xt.abs().amax(dim=-1, keepdim=True)
        ts = torch.where(amax == 0, torch.ones_like(amax), amax / 127.0)
        tq = torch.clamp(torch.round(xt * (1.0 / ts)), -127, 127).to(torch.int8)
        tally.check("torch per-token symmetric formula",
                    same_bits(out["q"], tq.numpy()) and same_bits(out["scale"], ts.numpy()),
                    f"{desc}: q {first_diff(out['q'], tq.numpy())}; scale "
                    f"{first_diff(out['scale'], ts.numpy())}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for scope in ("tensor", "channel", "token", "group"):
        for mode in ("symmetric", "affine"):
            for _ in range(60):
                case(args.qat, rng, tally, scope, mode)
            for _ in range(10):
                case(args.qat, rng, tally, scope, mode, nonfinite=True)
            for dt in (np.float64, np.float16):
                for _ in range(5):
                    case(args.qat, rng, tally, scope, mode, dtype=dt)
            case(args.qat, rng, tally, scope, mode, shape=(0, 3) if scope != "token" else (3, 0))
    for _ in range(60):  # per-token symmetric, default range: also the torch formula
        case(args.qat, rng, tally, "token", "symmetric", default_range=True)
    tally.finish()


if __name__ == "__main__":
    main()
