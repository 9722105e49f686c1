"""Conformance of div and sqrt (the elementwise ops the conv-bn fold needs) against torch 1.13,
forward values. Their gradients are graphs of other ops (div, mul, neg, sum_to), checked by
`qat gradcheck` and against their closed forms in tests/ops_arith.

Random cases: div with broadcasting ([N, C, H, W] / [1, C, 1, 1], [R, C] / [C], same shape)
and sqrt of non-negative values, f32 and f64, with a few exact zeros in divisors and inputs.
Both libraries round IEEE division and square root correctly, so the comparison is exact:
bit for bit, NaN matching NaN and infinities matching in sign.
Fresh seed per run (printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "arith_conformance"


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for dtype in (np.float32, np.float64):
        for _ in range(20):
            kind = int(rng.integers(0, 3))
            if kind == 0:
                c = int(rng.integers(1, 6))
                shape_a = [int(rng.integers(1, 4)), c, int(rng.integers(1, 5)), int(rng.integers(1, 5))]
                shape_b = [1, c, 1, 1]
            elif kind == 1:
                c = int(rng.integers(1, 8))
                shape_a, shape_b = [int(rng.integers(1, 6)), c], [c]
            else:
                shape_a = shape_b = [int(rng.integers(1, 6)), int(rng.integers(1, 6))]
            a = (rng.normal(size=shape_a) * 10).astype(dtype)
            b = rng.normal(size=shape_b).astype(dtype)
            b.flat[0] = 0.0 if rng.random() < 0.3 else b.flat[0]
            ours = run_op(args.qat, "div", {"a": a, "b": b}, ["y"])["y"]
            ref = (torch.from_numpy(a) / torch.from_numpy(b)).numpy()
            tally.check(f"div {np.dtype(dtype).name}", same(ours, ref), f"{shape_a}/{shape_b}")
            x = np.abs(rng.normal(size=shape_a) * 5).astype(dtype)
            x.flat[0] = 0.0
            ours = run_op(args.qat, "sqrt", {"x": x}, ["y"])["y"]
            tally.check(f"sqrt {np.dtype(dtype).name}", same(ours, torch.sqrt(torch.from_numpy(x)).numpy()),
                        f"{shape_a}")
    proc = run_op(args.qat, "div", {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)},
                  ["y"], expect_failure=True)
    tally.check("div bad input", proc.returncode != 0 and "div" in proc.stdout + proc.stderr,
                "a [2,3] / b [4] must fail naming div")
    tally.finish()


if __name__ == "__main__":
    main()
