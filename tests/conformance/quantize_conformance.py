"""Conformance of quantize / dequantize (s8/u8 storage) against PyTorch 1.13 (CPU, f32).

Bit-exact against torch:
  - quantize per tensor / per channel   vs torch.quantize_per_{tensor,channel}(...).int_repr()
    (u8 storage = torch.quint8 [0, 255], i8 storage = torch.qint8 [-128, 127]);
  - quantize's mask, per tensor         vs aten::fake_quantize_per_tensor_affine_cachemask;
  - dequantize per tensor / per channel vs torch's dequantize() of the same codes (codes from
    our quantize and uniformly random codes).
Random shapes (size-1 and odd sizes), any channel axis (negative too), power-of-two scales
that make exact .5 ties, values up to 1000 ranges outside the range, +0 and -0.
NaN/Inf (torch converts them to integers: undefined), per-token and per-group scopes,
narrower ranges (e.g. 4-bit in i8), f64/f16 inputs, and quantize_backward are checked
against a NumPy reference written from SEMANTICS.md. Fresh random seed each run (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402
from quant_case_utils import (broadcast, first_diff, qparam_shape, rand_scale,  # noqa: E402
                              rand_shape, rand_values, same_bits, scope_attrs)

import torch  # noqa: E402

SUITE = "quantize_conformance"


def rand_range(rng, torch_dtype):
    """(attrs, qmin, qmax, storage): the full s8/u8 ranges torch uses, or narrower ones."""
    signed = bool(rng.integers(0, 2))
    if torch_dtype:
        return ({"signed": True}, -128, 127, np.int8) if signed else ({}, 0, 255, np.uint8)
    bits = int(rng.choice([2, 3, 4, 5, 7, 8]))
    if signed:
        narrow = bool(rng.integers(0, 2))
        lo = -(2 ** (bits - 1)) + (1 if narrow else 0)
        return ({"bits": bits, "signed": True, "narrow_range": narrow}, lo, 2 ** (bits - 1) - 1,
                np.int8)
    if rng.integers(0, 2):
        lo = int(rng.integers(0, 100))
        hi = int(rng.integers(lo + 1, 256))
        return {"quant_min": lo, "quant_max": hi}, lo, hi, np.uint8
    return {"bits": bits}, 0, 2 ** bits - 1, np.uint8


def reference(x, scale_b, zp_b, qmin, qmax, storage):
    """SEMANTICS.md: math in f32 (f64 for f64), q = clamp(rint(x * inv) + zp), NaN -> zp."""
    mt = np.float64 if x.dtype == np.float64 else np.float32
    xm = x.astype(mt)
    inv = (mt(1) / np.asarray(scale_b).astype(mt)).astype(mt)
    z = np.broadcast_to(np.asarray(zp_b).astype(mt), x.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        q = (np.rint(xm * inv) + z).astype(mt)
        mask = (q >= qmin) & (q <= qmax)
        q = np.where(np.isnan(xm), z, np.clip(q, mt(qmin), mt(qmax)))
    return q.astype(storage), np.broadcast_to(mask, x.shape)


def unpack_mask(m, n):
    return np.unpackbits(m, bitorder="little")[:n].astype(bool)


def case(qat, rng, tally, scope, dtype=np.float32, nonfinite=False, torch_cmp=True):
    shape = rand_shape(rng, min_rank=0 if scope == "tensor" else 1)
    rank = len(shape)
    attrs, qmin, qmax, storage = rand_range(rng, torch_cmp)
    ties = bool(rng.integers(0, 2))
    axis = int(rng.integers(-rank, rank)) if rank else 0
    gs = int(rng.integers(1, shape[axis] + 3)) if rank else 1
    qshape = qparam_shape(scope, shape, axis, gs)
    n = int(np.prod(qshape))
    scale = rand_scale(rng, n, ties).reshape(qshape)
    zp = rng.integers(qmin, qmax + 1, size=n).astype(np.int32).reshape(qshape)
    scale_b = broadcast(scope, shape, scale, axis, gs)
    zp_b = broadcast(scope, shape, zp, axis, gs)
    x = rand_values(rng, shape, scale_b, zp_b, qmin, qmax, ties)
    if nonfinite and x.size:
        flat = x.reshape(-1)
        for v in (np.nan, np.inf, -np.inf):
            flat[rng.integers(0, flat.size, size=max(1, flat.size // 8))] = v
    with np.errstate(over="ignore"):  # far values may overflow f16 to Inf: still checked
        x = x.astype(dtype)
    attrs = dict(attrs, **scope_attrs(scope, axis, gs))
    out = run_op(qat, "quantize", {"x": x, "scale": scale, "zero_point": zp}, ["q", "mask"],
                 attrs=attrs)
    q, mask = out["q"], unpack_mask(out["mask"], x.size).reshape(x.shape)
    label = f"{scope}" + ("" if dtype == np.float32 else f"/{np.dtype(dtype)}")
    desc = f"shape {shape} attrs {attrs}"

    rq, rmask = reference(x, scale_b, zp_b, qmin, qmax, storage)
    tag = "numpy quantize/" + label + ("/nonfinite" if nonfinite else "")
    tally.check(tag, same_bits(q, rq) and np.array_equal(mask, rmask),
                f"{desc}: {first_diff(q, rq)}; mask equal {np.array_equal(mask, rmask)}")

    # Dequantize our codes, and uniformly random codes, per SEMANTICS.md: (q - zp) * scale.
    codes = rng.integers(qmin, qmax + 1, size=shape).astype(storage)
    for name, qq in (("codes", q), ("random", codes)):
        out_dtype = "f32" if dtype != np.float64 else "f64"
        y = run_op(qat, "dequantize", {"q": qq, "scale": scale, "zero_point": zp}, ["y"],
                   attrs=dict(scope_attrs(scope, axis, gs), out_dtype=out_dtype))["y"]
        mt = np.float64 if out_dtype == "f64" else np.float32
        ry = ((qq.astype(mt) - np.asarray(zp_b).astype(mt)) *
              np.asarray(scale_b).astype(mt)).astype(mt)
        ry = np.broadcast_to(ry, shape)
        tally.check(f"numpy dequantize/{label}", same_bits(y, ry), f"{desc} {name}: {first_diff(y, ry)}")
        if torch_cmp and dtype == np.float32 and scope in ("tensor", "channel") and name == "random":
            qt = torch.from_numpy(qq.copy())
            if scope == "tensor":
                tq = torch._make_per_tensor_quantized_tensor(qt, float(scale.reshape(-1)[0]),
                                                             int(zp.reshape(-1)[0]))
            else:
                # torch's per-channel quantized tensors need rank >= 1 and axis >= 0.
                tq = torch._make_per_channel_quantized_tensor(
                    qt, torch.from_numpy(scale.astype(np.float64)),
                    torch.from_numpy(zp.astype(np.int64)), axis % rank)
            ty = tq.dequantize().numpy()
            tally.check(f"torch dequantize/{scope}", same_bits(y, ty), f"{desc}: {first_diff(y, ty)}")

    if torch_cmp and dtype == np.float32 and not nonfinite and scope in ("tensor", "channel"):
        xt = torch.from_numpy(x.copy())
        tdt = torch.qint8 if storage == np.int8 else torch.quint8
        if scope == "tensor":
            s0, z0 = float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])
            tq = torch.quantize_per_tensor(xt, s0, z0, tdt)
            _, tm = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(xt, s0, z0, qmin, qmax)
            tally.check("torch quantize/tensor/mask", np.array_equal(mask, tm.numpy()),
                        f"{desc}: mask differs")
        else:
            tq = torch.quantize_per_channel(xt, torch.from_numpy(scale.astype(np.float64)),
                                            torch.from_numpy(zp.astype(np.int64)), axis % rank,
                                            tdt)
        tr = tq.int_repr().numpy()
        tally.check(f"torch quantize/{scope}", same_bits(q, tr), f"{desc}: {first_diff(q, tr)}")
        ty = tq.dequantize().numpy()
        y = run_op(qat, "dequantize", {"q": q, "scale": scale, "zero_point": zp}, ["y"],
                   attrs=scope_attrs(scope, axis, gs))["y"]
        tally.check(f"torch quantize+dequantize/{scope}", same_bits(y, ty),
                    f"{desc}: {first_diff(y, ty)}")

    if dtype == np.float32 and x.size and rng.integers(0, 3) == 0:
        # quantize_backward: dx = dy / scale where the mask is set, else 0 (f32 division).
        dy = rng.uniform(-2, 2, size=shape).astype(np.float32)
        dx = run_op(qat, "quantize_backward", {"dy": dy, "mask": out["mask"], "scale": scale},
                    ["dx"], attrs=dict(scope_attrs(scope, axis, gs), dx_dtype="f32"))["dx"]
        rdx = np.where(rmask, dy / np.asarray(scale_b, np.float32), np.float32(0)).astype(np.float32)
        tally.check(f"numpy quantize_backward/{scope}", same_bits(dx, rdx),
                    f"{desc}: {first_diff(dx, rdx)}")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for _ in range(100):
        case(args.qat, rng, tally, "tensor")
        case(args.qat, rng, tally, "channel")
    for scope in ("tensor", "channel", "token", "group"):
        for _ in range(30 if scope in ("token", "group") else 15):
            case(args.qat, rng, tally, scope, torch_cmp=False)
        for _ in range(8):
            case(args.qat, rng, tally, scope, nonfinite=True, torch_cmp=False)
        for dt in (np.float64, np.float16):
            for _ in range(5):
                case(args.qat, rng, tally, scope, dtype=dt, torch_cmp=False)
    tally.finish()


if __name__ == "__main__":
    main()
