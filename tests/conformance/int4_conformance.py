"""Conformance of int4_quantize_pack / int4_unpack_dequantize against a NumPy reference.

PyTorch has no INT4 group op, so the reference below is written from SEMANTICS.md
("INT4 (group-wise)") and the op docs: groups of group_size consecutive elements along
`axis` (the last group may be shorter), range over finite values, inv = 1 / scale, round
half to even, NaN -> zero point, a group whose scale is 0 or has no finite reciprocal gets
scale 1, codes packed in flat C order two per byte. Codes, bytes, scales and zero points are
compared bit for bit. Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

SUITE = "int4_conformance"


def math_type(dtype):
    return np.float64 if dtype == np.float64 else np.float32


def group_params(seg, symmetric, mt):
    """seg: [..., n] one group per leading index. Returns (scale, inv, zp) in mt."""
    fin = np.isfinite(seg)
    if symmetric:
        amax = np.max(np.where(fin, np.abs(seg), mt(0)), axis=-1).astype(mt)
        scale = (amax / mt(7)).astype(mt)
    else:
        mn = np.min(np.where(fin, seg, mt(np.inf)), axis=-1).astype(mt)
        mx = np.max(np.where(fin, seg, mt(-np.inf)), axis=-1).astype(mt)
        min_neg = np.where(mn < 0, mn, mt(0)).astype(mt)
        max_pos = np.where(mx > 0, mx, mt(0)).astype(mt)
        scale = ((max_pos - min_neg) / mt(15)).astype(mt)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (mt(1) / scale).astype(mt)
    bad = ~(scale > 0) | ~np.isfinite(inv)
    scale = np.where(bad, mt(1), scale).astype(mt)
    inv = np.where(bad, mt(1), inv).astype(mt)
    if symmetric:
        zp = np.full(scale.shape, mt(8), dtype=mt)
    else:
        zp = np.clip(np.rint((-min_neg * inv).astype(mt)), 0, 15).astype(mt)
    return scale, inv, zp


def reference_quantize(x, axis, gs, symmetric, high_first):
    mt = math_type(x.dtype)
    xm = np.moveaxis(x.astype(mt), axis, -1)
    n = xm.shape[-1]
    ng = -(-n // gs)
    scale = np.empty(xm.shape[:-1] + (ng,), mt)
    zp = np.empty(xm.shape[:-1] + (ng,), mt)
    codes = np.empty(xm.shape, np.uint8)
    for g in range(ng):
        seg = xm[..., g * gs:(g + 1) * gs]
        s, inv, z = group_params(seg, symmetric, mt)
        scale[..., g], zp[..., g] = s, z
        with np.errstate(invalid="ignore", over="ignore"):
            q = np.clip(np.rint((seg * inv[..., None]).astype(mt)) + z[..., None], 0, 15)
        q = np.where(np.isnan(seg), z[..., None], q)
        codes[..., g * gs:(g + 1) * gs] = q.astype(np.uint8)
    codes = np.moveaxis(codes, -1, axis).reshape(-1)
    return (pack(codes, high_first), np.moveaxis(scale, -1, axis),
            np.moveaxis(zp, -1, axis).astype(np.uint8), codes)


def pack(codes, high_first):
    c = np.concatenate([codes, np.zeros(codes.size % 2, np.uint8)]).astype(np.uint8)
    even, odd = c[0::2], c[1::2]
    return ((even << 4) | odd if high_first else even | (odd << 4)).astype(np.uint8)


def unpack(packed, n, high_first):
    lo, hi = packed & 0xF, packed >> 4
    first, second = (hi, lo) if high_first else (lo, hi)
    return np.stack([first, second], axis=1).reshape(-1)[:n]


def reference_dequantize(packed, scale, zp, shape, axis, gs, high_first, out_dtype):
    mt = np.float64 if scale.dtype == np.float64 else np.float32
    codes = unpack(packed, int(np.prod(shape)), high_first).reshape(shape)
    rep = lambda t: np.take(np.repeat(t, gs, axis=axis), np.arange(shape[axis]), axis=axis)
    y = ((codes.astype(mt) - rep(zp).astype(mt)) * rep(scale).astype(mt)).astype(mt)
    return y.astype(out_dtype)


def rand_shape(rng):
    rank = int(rng.integers(1, 5))
    return tuple(int(rng.choice([1, 1, 2, 3, 5, 7, 9, 16, 33])) for _ in range(rank))


def rand_input(rng, shape, axis, gs, dtype):
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8))
    pick = rng.uniform(size=shape)
    # Exact .5 ties: a group whose absmax is 7 * 2^e has scale 2^e, so (k + 0.5) * 2^e ties.
    if rng.integers(0, 3) == 0:
        e = float(2.0 ** rng.integers(-6, 6))
        x = (rng.integers(-7, 7, size=shape) + 0.5) * e
        x = np.moveaxis(x, axis, -1)
        x[..., ::gs] = 7 * e  # each group starts with its absmax
        x = np.moveaxis(x, -1, axis)
    x = np.where(pick < 0.05, 0.0, x)
    x = np.where((pick >= 0.05) & (pick < 0.08), -0.0, x)
    if rng.integers(0, 4) == 0:  # special values
        x = np.where((pick >= 0.08) & (pick < 0.11), np.nan, x)
        x = np.where((pick >= 0.11) & (pick < 0.13), np.inf, x)
        x = np.where((pick >= 0.13) & (pick < 0.15), -np.inf, x)
    if rng.integers(0, 5) == 0:  # whole groups of zeros
        x = np.moveaxis(x, axis, -1)
        x[..., :gs] = 0.0
        x = np.moveaxis(x, -1, axis)
    if rng.integers(0, 5) == 0:  # all-positive groups (asymmetric zp 0)
        x = np.abs(x)
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype)


def same(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            return False
        u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
        m = ~np.isnan(a)
        return bool(np.array_equal(a.view(u)[m], b.view(u)[m]))
    return bool(np.array_equal(a, b))


def quantize_case(qat, rng, tally, dtype):
    shape = rand_shape(rng)
    rank = len(shape)
    axis = int(rng.integers(-rank, rank))
    gs = int(rng.integers(1, shape[axis] + 3))
    symmetric = bool(rng.integers(0, 2))
    high_first = bool(rng.integers(0, 2))
    x = rand_input(rng, shape, axis, gs, dtype)
    attrs = {"group_size": gs, "axis": axis, "mode": "symmetric" if symmetric else "asymmetric",
             "nibble_order": "high_first" if high_first else "low_first"}
    out = run_op(qat, "int4_quantize_pack", {"x": x}, ["packed", "scale", "zero_point"],
                 attrs=attrs)
    rp, rs, rz, _ = reference_quantize(x, axis % rank, gs, symmetric, high_first)
    tag = f"int4_quantize_pack/{np.dtype(dtype)}"
    desc = f"shape {shape} attrs {attrs}"
    tally.check(tag + " bytes", same(out["packed"], rp), desc)
    tally.check(tag + " scale", same(out["scale"], rs), f"{desc}: {out['scale']} vs {rs}")
    tally.check(tag + " zero_point", same(out["zero_point"], rz), desc)
    dattrs = {"group_size": gs, "axis": axis, "nibble_order": attrs["nibble_order"],
              "shape": list(shape)}
    back = run_op(qat, "int4_unpack_dequantize",
                  {"packed": out["packed"], "scale": out["scale"], "zero_point": out["zero_point"]},
                  ["x"], attrs=dattrs)["x"]
    ry = reference_dequantize(rp, rs, rz, shape, axis % rank, gs, high_first, rs.dtype)
    tally.check(f"int4_unpack_dequantize/{rs.dtype}", same(back, ry), desc)


def dequantize_case(qat, rng, tally):
    """Random bytes and qparams (not produced by our quantizer), i32 zero points, out dtypes."""
    shape = rand_shape(rng)
    rank = len(shape)
    axis = int(rng.integers(-rank, rank))
    gs = int(rng.integers(1, shape[axis] + 3))
    high_first = bool(rng.integers(0, 2))
    n = int(np.prod(shape))
    packed = rng.integers(0, 256, size=(n + 1) // 2).astype(np.uint8)
    if n % 2:  # the pad nibble is 0 in a well-formed buffer, but must be ignored anyway
        packed[-1] &= 0x0F if not high_first else 0xF0
    qshape = list(shape)
    qshape[axis] = -(-shape[axis] // gs)
    sdt = rng.choice([np.float32, np.float64])
    scale = np.exp(rng.uniform(-10, 10, size=qshape)).astype(sdt)
    zp = rng.integers(0, 16, size=qshape).astype(rng.choice([np.uint8, np.int32]))
    out_name = str(rng.choice(["auto", "f32", "f64", "f16"]))
    out_dtype = {"auto": sdt, "f32": np.float32, "f64": np.float64, "f16": np.float16}[out_name]
    attrs = {"group_size": gs, "axis": axis, "shape": list(shape), "dtype": out_name,
             "nibble_order": "high_first" if high_first else "low_first"}
    y = run_op(qat, "int4_unpack_dequantize", {"packed": packed, "scale": scale, "zero_point": zp},
               ["x"], attrs=attrs)["x"]
    with np.errstate(over="ignore"):
        ry = reference_dequantize(packed, scale, zp, shape, axis % rank, gs, high_first,
                                  out_dtype)
    tally.check("int4_unpack_dequantize/random", same(y, ry), f"shape {shape} attrs {attrs}")


def error_cases(qat, tally):
    x = np.zeros((3, 5), np.float32)
    p = run_op(qat, "int4_unpack_dequantize",
               {"packed": np.zeros(7, np.uint8), "scale": np.ones((3, 1), np.float32),
                "zero_point": np.zeros((3, 1), np.uint8)},
               ["x"], attrs={"shape": [3, 5]}, expect_failure=True)
    tally.check("int4 errors", p.returncode == 2 and "has 7 bytes" in p.stderr and
                "needs 8 bytes" in p.stderr, p.stderr)
    p = run_op(qat, "int4_quantize_pack", {"x": x}, ["packed"], attrs={"group_size": 0},
               expect_failure=True)
    tally.check("int4 errors", p.returncode == 2 and "group_size" in p.stderr, p.stderr)
    p = run_op(qat, "int4_quantize_pack", {"x": x.astype(np.int32)}, ["packed"],
               expect_failure=True)
    tally.check("int4 errors", p.returncode == 2 and "int4_quantize_pack" in p.stderr, p.stderr)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(120):
        quantize_case(args.qat, rng, tally, np.float32)
    for dt in (np.float64, np.float16):
        for _ in range(30):
            quantize_case(args.qat, rng, tally, dt)
    for _ in range(60):
        dequantize_case(args.qat, rng, tally)
    error_cases(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
