"""Conformance of dynamic_fake_quantize against PyTorch 1.13 (Debian's CPU build), f32 and f64.

The reference is torchao's QAT qparams written in torch ops (8da4w's per-token asymmetric
activations: min_neg = min(amin, 0), max_pos = max(amax, 0), scale = clamp((max_pos -
min_neg) / (qmax - qmin), eps), zp = clamp(qmin - round(min_neg / scale)); its int4 weights:
scale = clamp(max(-min_neg, max_pos) / ((qmax - qmin) / 2), eps), zp = 0), with the division
by the Python number written as the multiplication by its reciprocal in the input's dtype, as
PyTorch's CUDA kernels compute it (the op's rule on both backends; torch's CPU divides, which
can differ in the last bit). Then the fake quantization: torch.fake_quantize_per_channel_affine
over the groups (f32), the same formula in torch ops (f64), and the in-range mask. Scales, zero
points, y and the mask bit for bit. Random shapes, group sizes, ranges and data (one-signed,
all-zero and tiny rows). The bf16/f16 rounding of the qparams is checked against torchao on the
GPU (python/tests/test_torch_torchao_conformance.py) and by hand in tests/ops_dynamic_fake_quantize.

Mode float_zero (torchao's int4 weight-only QAT) against its torch ops likewise: the group's
own range, scale = clamp((max - min) * (1 / (qmax - qmin)), eps), zero = min + scale * mid,
both rounded to the qparam dtype (x's, or bf16), then tinygemm's quantize (x - (zero - scale *
mid)) / scale and dequantize (q - mid) * scale + zero, with the in-range mask before the clamp.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, check_bad_input, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "dynamic_fake_quantize_conformance"
OUTS = ["y", "mask", "scale", "zero_point"]
F32_EPS = float(np.finfo(np.float32).eps)


def reference(x, qmin, qmax, group, symmetric, eps):
    """(y, in_range, scale f32, zp i32) of x [rows, K] by torch ops in x's dtype."""
    t = torch.from_numpy(x)
    v = t.reshape(-1, group)
    dt = t.dtype
    zero = torch.zeros(v.shape[0], dtype=dt)
    min_neg = torch.minimum(torch.amin(v, dim=1), zero)
    max_pos = torch.maximum(torch.amax(v, dim=1), zero)
    divisor = (qmax - qmin) / 2.0 if symmetric else float(qmax - qmin)
    inv = torch.tensor(1.0, dtype=dt) / torch.tensor(divisor, dtype=dt)  # the reciprocal in dt
    if symmetric:
        scale = torch.maximum(-min_neg, max_pos) * inv
    else:
        scale = (max_pos - min_neg) * inv
    scale = torch.where(scale < torch.tensor(eps, dtype=dt), torch.tensor(eps, dtype=dt), scale)
    if symmetric:
        zp = torch.zeros_like(scale)
    else:
        zp = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax)
    s, z = scale.unsqueeze(1), zp.unsqueeze(1)
    q = torch.round(v * (1.0 / s)) + z
    y = ((torch.clamp(q, qmin, qmax) - z) * s).reshape(t.shape)
    if dt == torch.float32:  # torch's own fake-quant op over the groups: the same values
        y_op = torch.fake_quantize_per_channel_affine(v, scale, zp.to(torch.int32), 0, qmin, qmax)
        assert torch.equal(y_op.reshape(t.shape).view(torch.int32), y.view(torch.int32))
    in_range = ((q >= qmin) & (q <= qmax)).reshape(-1).numpy()
    return y.numpy(), in_range, scale.to(torch.float32).numpy(), zp.to(torch.int32).numpy()


def float_zero_reference(x, qmax, group, eps, qparam_dtype):
    """(y, in_range, scale f32, zero f32) of mode float_zero by torch ops in x's dtype."""
    t = torch.from_numpy(x)
    v = t.reshape(-1, group)
    dt = t.dtype
    mn, mx = torch.amin(v, dim=1), torch.amax(v, dim=1)
    inv = torch.tensor(1.0, dtype=dt) / torch.tensor(float(qmax), dtype=dt)
    scale = (mx - mn) * inv
    scale = torch.where(scale < torch.tensor(eps, dtype=dt), torch.tensor(eps, dtype=dt), scale)
    mid = (qmax + 1) / 2
    zero = mn + scale * mid
    qdt = {"input": dt, "bf16": torch.bfloat16}[qparam_dtype]
    scale, zero = scale.to(qdt), zero.to(qdt)
    s, z = scale.unsqueeze(1), zero.unsqueeze(1)
    low = z - s * mid
    q = torch.round((v - low) / s)
    in_range = ((q >= 0) & (q <= qmax)).reshape(-1).numpy()
    d = (torch.clamp(q, 0, qmax) - mid).to(dt)
    d *= s
    d += z
    return (d.reshape(t.shape).numpy(), in_range, scale.to(torch.float32).numpy(),
            zero.to(torch.float32).numpy())


def float_zero_case(qat, tally, rng, dtype):
    rows = int(rng.integers(1, 9))
    group = int(rng.choice([3, 8, 32, 64, 128]))
    k = group * int(rng.integers(1, 4))
    qmax = int(rng.choice([15, 15, 7, 255]))
    qdt = "bf16" if rng.integers(0, 2) else "input"
    x = rand_x(rng, rows, k, dtype)
    attrs = {"quant_min": 0, "quant_max": qmax, "group_size": group, "mode": "float_zero",
             "eps": 1e-6, "qparam_dtype": qdt}
    got = run_op(qat, "dynamic_fake_quantize", {"x": x}, OUTS, attrs)
    y, in_range, scale, zero = float_zero_reference(x, qmax, group, 1e-6, qdt)
    mask = np.unpackbits(got["mask"], bitorder="little")[: x.size].astype(bool)
    label = f"{np.dtype(dtype).name} [{rows},{k}] group {group} float_zero [0,{qmax}] {qdt}"
    tally.check("scale", got["scale"].reshape(-1).view(np.int32).tolist()
                == scale.view(np.int32).tolist(), f"{label}: {got['scale']} vs {scale}")
    tally.check("zero_point", got["zero_point"].reshape(-1).view(np.int32).tolist()
                == zero.view(np.int32).tolist(), f"{label}: {got['zero_point']} vs {zero}")
    iview = np.int32 if dtype == np.float32 else np.int64
    tally.check("y", np.array_equal(got["y"].view(iview), y.view(iview)), label)
    tally.check("mask", np.array_equal(mask, in_range), label)


def rand_x(rng, rows, k, dtype):
    x = rng.normal(rng.normal(0, 1), np.exp(rng.uniform(-5, 3)), size=(rows, k))
    kind = int(rng.integers(0, 4))
    if kind == 1:
        x = np.abs(x) * rng.choice([-1, 1])  # one-signed rows: min_neg or max_pos is 0
    elif kind == 2:
        x[int(rng.integers(0, rows))] = 0.0  # an all-zero row takes eps
    elif kind == 3:
        x[int(rng.integers(0, rows))] *= 1e-12  # a tiny row
    return x.astype(dtype)


def case(qat, tally, rng, dtype):
    rows = int(rng.integers(1, 9))
    group = int(rng.choice([3, 8, 32, 40, 64]))
    k = group * int(rng.integers(1, 5))
    symmetric = bool(rng.integers(0, 2))
    if symmetric:
        qmin, qmax = int(rng.choice([-8, -128, -2])), None
        qmax = -qmin - 1
        eps = float(np.finfo(np.float32).tiny)
    else:
        qmin, qmax = (-128, 127) if rng.integers(0, 2) else (0, int(rng.integers(3, 256)))
        eps = F32_EPS
    per_row = not symmetric and rng.integers(0, 2) == 0
    g = k if per_row else group
    x = rand_x(rng, rows, k, dtype)
    attrs = {"quant_min": qmin, "quant_max": qmax, "group_size": 0 if per_row else group,
             "mode": "symmetric" if symmetric else "asymmetric", "eps": eps}
    got = run_op(qat, "dynamic_fake_quantize", {"x": x}, OUTS, attrs)
    y, in_range, scale, zp = reference(x, qmin, qmax, g, symmetric, eps)
    mask = np.unpackbits(got["mask"], bitorder="little")[: x.size].astype(bool)
    label = f"{np.dtype(dtype).name} [{rows},{k}] group {g} {attrs['mode']} [{qmin},{qmax}]"
    tally.check("scale", got["scale"].reshape(-1).view(np.int32).tolist()
                == scale.view(np.int32).tolist(), f"{label}: {got['scale']} vs {scale}")
    tally.check("zero_point", got["zero_point"].reshape(-1).tolist() == zp.tolist(),
                f"{label}: {got['zero_point']} vs {zp}")
    iview = np.int32 if dtype == np.float32 else np.int64
    tally.check("y", np.array_equal(got["y"].view(iview), y.view(iview)), label)
    tally.check("mask", np.array_equal(mask, in_range), label)


def bad_inputs(qat, tally):
    x = np.zeros((2, 10), np.float32)
    op = "dynamic_fake_quantize"
    check_bad_input(qat, tally, op, {"x": x}, OUTS,
                    {"quant_min": -8, "quant_max": 7, "group_size": 4}, "does not divide")
    check_bad_input(qat, tally, op, {"x": x}, OUTS,
                    {"quant_min": 0, "quant_max": 15, "mode": "symmetric"}, "symmetric")
    check_bad_input(qat, tally, op, {"x": x}, OUTS,
                    {"quant_min": -8, "quant_max": 7, "mode": "float_zero"}, "unsigned")
    bad = np.array([[1.0, np.nan, 2.0]], np.float32)
    check_bad_input(qat, tally, op, {"x": bad}, OUTS, {"quant_min": -8, "quant_max": 7},
                    "positive and finite")


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64):
        for _ in range(40):
            case(args.qat, tally, rng, dtype)
        for _ in range(30):
            float_zero_case(args.qat, tally, rng, dtype)
    bad_inputs(args.qat, tally)
    tally.finish()


if __name__ == "__main__":
    main()
