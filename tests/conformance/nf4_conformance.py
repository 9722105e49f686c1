"""Conformance of the NF4 ops against a NumPy reference written from SEMANTICS.md ("NF4").

PyTorch has no NF4 op. The reference: per group (group_size consecutive elements along
`axis`, the last group may be shorter) absmax over finite values, v = x * (1 / absmax) in
the math type (f32; f64 for f64 inputs), code = number of midpoints (t[i] + t[i+1]) * 0.5
strictly below v (ties take the lower code), NaN v -> code 7 (0.0); dequant t[code] * absmax;
packing as INT4. Double quantization per the op doc: blocks of block_size absmax values,
scale = (max - min) / 255 (1 if that is 0 or has no finite reciprocal), code =
clamp(rint((a - min) * (1 / scale)), 0, 255), a' = code * scale + min. Everything is
compared bit for bit. Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

SUITE = "nf4_conformance"

TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


def math_type(dtype):
    return np.float64 if dtype == np.float64 else np.float32


def midpoints(mt):
    t = TABLE.astype(mt)
    return ((t[:-1] + t[1:]) * mt(0.5)).astype(mt)


def pack(codes, high_first):
    c = np.concatenate([codes, np.zeros(codes.size % 2, np.uint8)]).astype(np.uint8)
    even, odd = c[0::2], c[1::2]
    return ((even << 4) | odd if high_first else even | (odd << 4)).astype(np.uint8)


def unpack(packed, n, high_first):
    lo, hi = packed & 0xF, packed >> 4
    first, second = (hi, lo) if high_first else (lo, hi)
    return np.stack([first, second], axis=1).reshape(-1)[:n]


def reference_quantize(x, axis, gs, high_first):
    mt = math_type(x.dtype)
    mids = midpoints(mt)
    xm = np.moveaxis(x.astype(mt), axis, -1)
    n = xm.shape[-1]
    ng = -(-n // gs)
    absmax = np.empty(xm.shape[:-1] + (ng,), mt)
    codes = np.empty(xm.shape, np.uint8)
    for g in range(ng):
        seg = xm[..., g * gs:(g + 1) * gs]
        a = np.max(np.where(np.isfinite(seg), np.abs(seg), mt(0)), axis=-1).astype(mt)
        absmax[..., g] = a
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inv = (mt(1) / a).astype(mt)
            v = (seg * inv[..., None]).astype(mt)
            c = (mids < v[..., None]).sum(axis=-1)
        codes[..., g * gs:(g + 1) * gs] = np.where(np.isnan(v), 7, c).astype(np.uint8)
    codes = np.moveaxis(codes, -1, axis).reshape(-1)
    return pack(codes, high_first), np.moveaxis(absmax, -1, axis)


def reference_dequantize(packed, absmax, shape, axis, gs, high_first, out_dtype):
    mt = np.float64 if absmax.dtype == np.float64 else np.float32
    codes = unpack(packed, int(np.prod(shape)), high_first).reshape(shape)
    rep = np.take(np.repeat(absmax, gs, axis=axis), np.arange(shape[axis]), axis=axis)
    with np.errstate(over="ignore"):
        return (TABLE.astype(mt)[codes] * rep.astype(mt)).astype(mt).astype(out_dtype)


def reference_double_quantize(absmax, bs):
    mt = absmax.dtype.type
    flat = absmax.reshape(-1)
    nb = -(-flat.size // bs)
    code = np.empty(flat.size, np.uint8)
    scale = np.empty(nb, mt)
    mins = np.empty(nb, mt)
    for b in range(nb):
        blk = flat[b * bs:(b + 1) * bs]
        mn, mx = blk.min(), blk.max()
        s = mt((mx - mn) / mt(255))
        with np.errstate(divide="ignore"):
            inv = mt(mt(1) / s)
        if not (s > 0) or not np.isfinite(inv):
            s, inv = mt(1), mt(1)
        scale[b], mins[b] = s, mn
        code[b * bs:(b + 1) * bs] = np.clip(np.rint(((blk - mn) * inv).astype(mt)), 0, 255)
    return code.reshape(absmax.shape), scale, mins


def reference_double_dequantize(code, scale, mins, bs):
    idx = np.arange(code.size) // bs
    mt = scale.dtype.type
    return ((code.reshape(-1).astype(mt) * scale[idx]).astype(mt) + mins[idx]).astype(mt) \
        .reshape(code.shape)


def rand_shape(rng):
    rank = int(rng.integers(1, 5))
    return tuple(int(rng.choice([1, 1, 2, 3, 5, 7, 9, 16, 33])) for _ in range(rank))


def rand_input(rng, shape, axis, gs, dtype):
    e = float(2.0 ** rng.integers(-8, 8))
    x = rng.standard_normal(shape) * e
    pick = rng.uniform(size=shape)
    if rng.integers(0, 3) == 0:
        # Exact midpoint ties: each group starts with absmax 2^k, so v = mid * 2^k / 2^k.
        mids = midpoints(np.float32).astype(np.float64)
        x = np.moveaxis(mids[rng.integers(0, 15, size=shape)] * e, axis, -1)
        x[..., ::gs] = e
        x = np.moveaxis(x, -1, axis)
    x = np.where(pick < 0.05, 0.0, x)
    x = np.where((pick >= 0.05) & (pick < 0.08), -0.0, x)
    if rng.integers(0, 4) == 0:
        x = np.where((pick >= 0.08) & (pick < 0.11), np.nan, x)
        x = np.where((pick >= 0.11) & (pick < 0.13), np.inf, x)
        x = np.where((pick >= 0.13) & (pick < 0.15), -np.inf, x)
    if rng.integers(0, 5) == 0:
        x = np.moveaxis(x, axis, -1)
        x[..., :gs] = 0.0
        x = np.moveaxis(x, -1, axis)
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
    high_first = bool(rng.integers(0, 2))
    x = rand_input(rng, shape, axis, gs, dtype)
    order = "high_first" if high_first else "low_first"
    attrs = {"group_size": gs, "axis": axis, "nibble_order": order}
    out = run_op(qat, "nf4_quantize_pack", {"x": x}, ["packed", "absmax"], attrs=attrs)
    rp, ra = reference_quantize(x, axis % rank, gs, high_first)
    tag = f"nf4_quantize_pack/{np.dtype(dtype)}"
    desc = f"shape {shape} attrs {attrs}"
    tally.check(tag + " bytes", same(out["packed"], rp), desc)
    tally.check(tag + " absmax", same(out["absmax"], ra), desc)
    back = run_op(qat, "nf4_unpack_dequantize", {"packed": out["packed"], "absmax": out["absmax"]},
                  ["x"], attrs=dict(attrs, shape=list(shape)))["x"]
    ry = reference_dequantize(rp, ra, shape, axis % rank, gs, high_first, ra.dtype)
    tally.check(f"nf4_unpack_dequantize/{ra.dtype}", same(back, ry), desc)


def dequantize_case(qat, rng, tally):
    shape = rand_shape(rng)
    rank = len(shape)
    axis = int(rng.integers(-rank, rank))
    gs = int(rng.integers(1, shape[axis] + 3))
    high_first = bool(rng.integers(0, 2))
    n = int(np.prod(shape))
    packed = rng.integers(0, 256, size=(n + 1) // 2).astype(np.uint8)
    qshape = list(shape)
    qshape[axis] = -(-shape[axis] // gs)
    adt = rng.choice([np.float32, np.float64])
    absmax = np.exp(rng.uniform(-12, 12, size=qshape)).astype(adt)
    absmax.reshape(-1)[:1] = 0.0
    out_name = str(rng.choice(["auto", "f32", "f64", "f16"]))
    out_dtype = {"auto": adt, "f32": np.float32, "f64": np.float64, "f16": np.float16}[out_name]
    attrs = {"group_size": gs, "axis": axis, "shape": list(shape), "dtype": out_name,
             "nibble_order": "high_first" if high_first else "low_first"}
    y = run_op(qat, "nf4_unpack_dequantize", {"packed": packed, "absmax": absmax}, ["x"],
               attrs=attrs)["x"]
    ry = reference_dequantize(packed, absmax, shape, axis % rank, gs, high_first, out_dtype)
    tally.check("nf4_unpack_dequantize/random", same(y, ry), f"shape {shape} attrs {attrs}")


def double_quant_case(qat, rng, tally):
    shape = rand_shape(rng)
    dt = rng.choice([np.float32, np.float64])
    absmax = np.abs(rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6))).astype(dt)
    kind = rng.integers(0, 4)
    if kind == 0:
        absmax[...] = absmax.reshape(-1)[0]  # constant blocks: range 0 -> scale 1
    elif kind == 1:
        absmax.reshape(-1)[::3] = 0.0  # all-zero groups store absmax 0
    bs = int(rng.choice([1, 2, 7, 64, 256, 1000]))
    out = run_op(qat, "nf4_double_quantize", {"absmax": absmax},
                 ["code", "block_scale", "block_min"], attrs={"block_size": bs})
    rc, rs, rm = reference_double_quantize(absmax, bs)
    desc = f"shape {shape} {np.dtype(dt)} block_size {bs}"
    tally.check("nf4_double_quantize", same(out["code"], rc) and same(out["block_scale"], rs) and
                same(out["block_min"], rm), desc)
    back = run_op(qat, "nf4_double_dequantize",
                  {"code": out["code"], "block_scale": out["block_scale"],
                   "block_min": out["block_min"]}, ["absmax"], attrs={"block_size": bs})["absmax"]
    tally.check("nf4_double_dequantize", same(back, reference_double_dequantize(rc, rs, rm, bs)),
                desc)


def error_cases(qat, tally):
    p = run_op(qat, "nf4_unpack_dequantize",
               {"packed": np.zeros(4, np.uint8), "absmax": np.ones((3, 1), np.float32)},
               ["x"], attrs={"shape": [3, 3]}, expect_failure=True)
    tally.check("nf4 errors", p.returncode == 2 and "has 4 bytes" in p.stderr and
                "needs 5 bytes" in p.stderr, p.stderr)
    p = run_op(qat, "nf4_quantize_pack", {"x": np.zeros((2, 2), np.float32)}, ["packed"],
               attrs={"group_size": -1}, expect_failure=True)
    tally.check("nf4 errors", p.returncode == 2 and "group_size" in p.stderr, p.stderr)
    p = run_op(qat, "nf4_double_quantize", {"absmax": np.array([1.0, -2.0], np.float32)},
               ["code"], expect_failure=True)
    tally.check("nf4 errors", p.returncode == 2 and "absmax[1]" in p.stderr, p.stderr)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(120):
        quantize_case(args.qat, rng, tally, np.float32)
    for dt in (np.float64, np.float16):
        for _ in range(30):
            quantize_case(args.qat, rng, tally, dt)
    for _ in range(50):
        dequantize_case(args.qat, rng, tally)
    for _ in range(50):
        double_quant_case(args.qat, rng, tally)
    error_cases(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
