"""Conformance of fake_quantize and minmax_observer against PyTorch (and NumPy).

Bit-exact against torch 1.13 on the CPU in f32:
  - fake_quantize per tensor / per channel   vs torch.fake_quantize_per_{tensor,channel}_affine
  - the bit-packed mask (LSB first)          vs aten::fake_quantize_per_tensor_affine_cachemask
  - minmax_observer qparams over batches     vs torch.ao.quantization.{PerChannel,}MinMaxObserver
PyTorch casts q to int64 before clamping, which is undefined for NaN/Inf, so non-finite
inputs, per-token/per-group scopes and f64/f16 inputs are checked against a NumPy reference
written from SEMANTICS.md ("Fake quantize"). Fresh random seed each run (printed).
"""
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "fake_quantize_conformance"


# ---- random cases -------------------------------------------------------------------------

def rand_shape(rng, min_rank=1, max_rank=4):
    rank = int(rng.integers(min_rank, max_rank + 1))
    sizes = [1, 1, 2, 3, 5, 7, 8, 13]
    return tuple(int(rng.choice(sizes)) for _ in range(rank))


def rand_range(rng):
    """Returns (attrs, qmin, qmax): default, signed, narrow, odd bit widths, or custom."""
    kind = rng.integers(0, 5)
    bits = int(rng.choice([8, 8, 4, 2, 3, 7, 16]))
    if kind == 0:
        return {"bits": bits}, 0, 2 ** bits - 1
    if kind == 1:
        return {"bits": bits, "signed": True}, -2 ** (bits - 1), 2 ** (bits - 1) - 1
    if kind == 2:
        return ({"bits": bits, "signed": True, "narrow_range": True}, -(2 ** (bits - 1) - 1),
                2 ** (bits - 1) - 1)
    lo = int(rng.integers(-300, 1))
    hi = int(rng.integers(lo + 1, lo + 600))
    return {"quant_min": lo, "quant_max": hi}, lo, hi


def rand_scale(rng, n, ties):
    """Powers of two make x = (k + 0.5) * scale an exact .5 tie after x * (1 / scale)."""
    if ties:
        return (2.0 ** rng.integers(-10, 5, size=n)).astype(np.float32)
    return np.exp(rng.uniform(-9, 3, size=n)).astype(np.float32)


def rand_values(rng, shape, scale_b, zp_b, qmin, qmax, ties, nonfinite=False):
    """Values inside and around the range, exact ties, values far outside, and +/-0."""
    scale_b = np.broadcast_to(scale_b, shape).astype(np.float64)
    zp_b = np.broadcast_to(zp_b, shape).astype(np.float64)
    lo = (qmin - zp_b - 3) * scale_b
    hi = (qmax - zp_b + 3) * scale_b
    x = rng.uniform(0, 1, size=shape) * (hi - lo) + lo
    pick = rng.uniform(size=shape)
    k = rng.integers(qmin - 2, qmax + 2, size=shape) - zp_b
    if ties:
        x = np.where(pick < 0.5, (k + 0.5) * scale_b, x)
    far = (qmax - qmin) * scale_b * rng.uniform(10, 1000, size=shape)
    x = np.where((pick >= 0.5) & (pick < 0.6), far * rng.choice([-1, 1], size=shape), x)
    x = np.where((pick >= 0.6) & (pick < 0.65), 0.0, x)
    x = np.where((pick >= 0.65) & (pick < 0.7), -0.0, x)
    x = x.astype(np.float32)
    if nonfinite and x.size:
        flat = x.reshape(-1)
        for v in (np.nan, np.inf, -np.inf):
            flat[rng.integers(0, flat.size, size=max(1, flat.size // 8))] = v
    return x


def qparam_broadcast(scope, x_shape, scale, axis, group_size):
    """Expands per-scope qparams to x's shape, per SEMANTICS.md's scope definitions."""
    if scope == "tensor":
        return scale.reshape(())
    rank = len(x_shape)
    if scope == "channel":
        shp = [1] * rank
        shp[axis] = x_shape[axis]
        return scale.reshape(shp)
    if scope == "token":
        return scale.reshape(x_shape[:-1] + (1,))
    rep = np.repeat(scale, group_size, axis=axis)  # group: each code covers group_size
    return np.take(rep, np.arange(x_shape[axis]), axis=axis)


def reference(x, scale_b, zp_b, qmin, qmax):
    """SEMANTICS.md: math in f32 (f64 for f64), inv = 1/scale, q = rint(x*inv)+zp."""
    mt = np.float64 if x.dtype == np.float64 else np.float32
    xm = x.astype(mt)
    s = np.asarray(scale_b).astype(mt)
    inv = (mt(1) / s).astype(mt)
    z = np.asarray(zp_b).astype(mt)
    with np.errstate(invalid="ignore", over="ignore"):
        q = (np.rint(xm * inv) + z).astype(mt)
        y = ((np.clip(q, mt(qmin), mt(qmax)) - z) * s).astype(mt)
        mask = (q >= qmin) & (q <= qmax)
        y = np.where(np.isnan(xm), xm, y).astype(x.dtype)
    return y, np.broadcast_to(mask, x.shape)


def unpack_mask(m, n):
    return np.unpackbits(m, bitorder="little")[:n].astype(bool)


def same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    ia = a.view(np.uint64 if a.itemsize == 8 else (np.uint32 if a.itemsize == 4 else np.uint16))
    ib = b.view(ia.dtype)
    return bool(np.array_equal(ia[~nan_a], ib[~nan_b]))


def first_diff(a, b):
    bad = np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b))).reshape(-1) |
                         (np.signbit(a) != np.signbit(b)).reshape(-1))
    if bad.size == 0:
        return "dtype/shape differ"
    i = bad[0]
    return f"first diff at {i}: ours {a.reshape(-1)[i]!r} expected {b.reshape(-1)[i]!r}"


# ---- fake_quantize ------------------------------------------------------------------------

def fq_case(qat, rng, tally, scope, dtype=np.float32, nonfinite=False):
    shape = rand_shape(rng, min_rank=1 if scope != "tensor" else 0)
    attrs, qmin, qmax = rand_range(rng)
    ties = bool(rng.integers(0, 2))
    rank = len(shape)
    axis = int(rng.integers(-rank, rank)) if rank else 0
    gs = int(rng.integers(1, shape[axis] + 3)) if rank else 1
    if scope == "tensor":
        qshape = (1,)
    elif scope == "channel":
        qshape = (shape[axis],)
    elif scope == "token":
        qshape = shape[:-1] + (1,)
    else:
        qshape = list(shape)
        qshape[axis] = -(-shape[axis] // gs)
        qshape = tuple(qshape)
    n = int(np.prod(qshape))
    scale = rand_scale(rng, n, ties).reshape(qshape)
    zp = rng.integers(qmin, qmax + 1, size=n).astype(np.int32).reshape(qshape)
    scale_b = qparam_broadcast(scope, shape, scale, axis, gs)
    zp_b = qparam_broadcast(scope, shape, zp, axis, gs)
    with np.errstate(over="ignore"):  # far-out values may overflow f16 to Inf: still checked
        x = rand_values(rng, shape, scale_b, zp_b, qmin, qmax, ties, nonfinite).astype(dtype)
    attrs = dict(attrs, scope=scope)
    if scope in ("channel", "group"):
        attrs["axis"] = axis
    if scope == "group":
        attrs["group_size"] = gs
    out = run_op(qat, "fake_quantize", {"x": x, "scale": scale, "zero_point": zp},
                 ["y", "mask"], attrs=attrs)
    y, mask = out["y"], unpack_mask(out["mask"], x.size).reshape(x.shape)
    label = f"fake_quantize/{scope}" + ("" if dtype == np.float32 else f"/{np.dtype(dtype)}")
    desc = f"shape {shape} attrs {attrs}"
    if dtype == np.float32 and not nonfinite and scope in ("tensor", "channel"):
        xt = torch.from_numpy(x)
        if scope == "tensor":
            ty, tm = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
                xt, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), qmin, qmax)
            ty2 = torch.fake_quantize_per_tensor_affine(
                xt, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), qmin, qmax)
            ok = same_bits(y, ty.numpy()) and same_bits(y, ty2.numpy())
            tally.check("torch " + label, ok, f"{desc}: {first_diff(y, ty.numpy())}")
            tally.check("torch fake_quantize/cachemask", np.array_equal(mask, tm.numpy()),
                        f"{desc}: mask differs")
        else:
            ty = torch.fake_quantize_per_channel_affine(
                xt, torch.from_numpy(scale), torch.from_numpy(zp), axis % rank, qmin, qmax)
            tally.check("torch " + label, same_bits(y, ty.numpy()),
                        f"{desc}: {first_diff(y, ty.numpy())}")
    ry, rmask = reference(x, scale_b, zp_b, qmin, qmax)
    tag = "numpy " + label + ("/nonfinite" if nonfinite else "")
    tally.check(tag, same_bits(y, ry) and np.array_equal(mask, rmask),
                f"{desc}: {first_diff(y, ry)}; mask equal {np.array_equal(mask, rmask)}")


# ---- minmax_observer ----------------------------------------------------------------------

def observer_config(rng, per_channel):
    symmetric = bool(rng.integers(0, 2))
    signed = bool(rng.integers(0, 2))
    # torch's MinMaxObserver refuses reduce_range with symmetric quint8.
    reduce_range = bool(rng.integers(0, 2)) and (signed or not symmetric)
    custom = rng.integers(0, 4) == 0
    dtype = torch.qint8 if signed else torch.quint8
    attrs = {"signed": signed, "reduce_range": reduce_range,
             "qscheme": "symmetric" if symmetric else "affine"}
    kw = {"dtype": dtype, "reduce_range": reduce_range}
    if custom:
        lo, hi = ((-8, 7) if signed else (0, 15)) if rng.integers(0, 2) else \
                 ((-64, 63) if signed else (0, 100))
        attrs.update(quant_min=lo, quant_max=hi)
        kw.update(quant_min=lo, quant_max=hi)
    if per_channel:
        kw["qscheme"] = (torch.per_channel_symmetric if symmetric
                         else torch.per_channel_affine)
    else:
        kw["qscheme"] = (torch.per_tensor_symmetric if symmetric
                         else torch.per_tensor_affine)
    return attrs, kw


def observer_run(qat, rng, tally, per_channel):
    attrs, kw = observer_config(rng, per_channel)
    shape = rand_shape(rng, min_rank=1 if per_channel else 0, max_rank=3)
    rank = len(shape)
    label = "minmax_observer/" + ("channel" if per_channel else "tensor")
    if per_channel:
        axis = int(rng.integers(-rank, rank))
        attrs.update(scope="channel", axis=axis)
        obs = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=axis % rank, **kw)
    else:
        obs = torch.ao.quantization.MinMaxObserver(**kw)
    states = {}
    for batch in range(int(rng.integers(1, 5))):
        center = rng.normal(0, 3)
        spread = np.exp(rng.uniform(-6, 4))
        x = np.asarray(center + spread * rng.standard_normal(shape), dtype=np.float32)
        if rng.integers(0, 4) == 0:  # all-positive / all-negative batches exercise min_neg/max_pos
            x = np.asarray(np.abs(x) * rng.choice([-1, 1]), dtype=np.float32)
        if x.size and rng.integers(0, 5) == 0:
            x.reshape(-1)[0] = -0.0
        out = run_op(qat, "minmax_observer", {"x": x}, ["scale", "zero_point"], attrs=attrs,
                     states=states, state_out=["min", "max"])
        states = {"min": out["state:min"], "max": out["state:max"]}
        # torch's per-channel observer needs rank >= 2; a trailing 1 changes nothing.
        obs(torch.from_numpy(x.reshape(x.shape + (1,)) if per_channel and rank == 1 else x))
        ts, tz = obs.calculate_qparams()
        ts = ts.numpy().astype(np.float32).reshape(-1)
        tz = tz.numpy().astype(np.int64).reshape(-1)
        ok = same_bits(out["scale"].reshape(-1), ts) and \
            np.array_equal(out["zero_point"].reshape(-1).astype(np.int64), tz)
        tally.check("torch " + label, ok,
                    f"shape {shape} attrs {attrs} batch {batch}: scale {out['scale']} vs {ts}, "
                    f"zp {out['zero_point']} vs {tz}")


def observer_nonfinite(qat, rng, tally):
    """Non-finite values are skipped: qparams equal torch's on the finite values alone."""
    attrs, kw = observer_config(rng, False)
    x = rng.standard_normal(int(rng.integers(2, 40))).astype(np.float32)
    finite = x.copy()
    x = np.concatenate([x, np.array([np.nan, np.inf, -np.inf], np.float32)])
    rng.shuffle(x)
    out = run_op(qat, "minmax_observer", {"x": x}, ["scale", "zero_point"], attrs=attrs)
    obs = torch.ao.quantization.MinMaxObserver(**kw)
    obs(torch.from_numpy(finite))
    ts, tz = obs.calculate_qparams()
    ok = same_bits(out["scale"].reshape(-1), ts.numpy().astype(np.float32).reshape(-1)) and \
        int(out["zero_point"].reshape(-1)[0]) == int(tz.reshape(-1)[0])
    tally.check("torch minmax_observer/nonfinite-skipped", ok, f"attrs {attrs}")


def main():
    warnings.filterwarnings("ignore", message=".*reduce_range will be deprecated.*")
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(120):
        fq_case(args.qat, rng, tally, "tensor")
        fq_case(args.qat, rng, tally, "channel")
    for _ in range(50):
        fq_case(args.qat, rng, tally, "token")
        fq_case(args.qat, rng, tally, "group")
    for scope in ("tensor", "channel", "token", "group"):
        for _ in range(8):
            fq_case(args.qat, rng, tally, scope, nonfinite=True)
        for dt in (np.float64, np.float16):
            for _ in range(5):
                fq_case(args.qat, rng, tally, scope, dtype=dt)
    for _ in range(40):
        observer_run(args.qat, rng, tally, per_channel=False)
        observer_run(args.qat, rng, tally, per_channel=True)
    for _ in range(10):
        observer_nonfinite(args.qat, rng, tally)
    tally.finish()


if __name__ == "__main__":
    main()
