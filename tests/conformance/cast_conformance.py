"""Conformance of cast against torch 1.13's Tensor.to(dtype), forward values, between f32, f64
and f16 (.npy has no bf16: torch's bf16 rounding is checked by tests/ops_cast through the same
python3-torch). The gradient is a cast back, checked by `qat gradcheck` and tests/ops_cast.

Random cases: normal values at scales from 1e-8 to 1e5 (f16 subnormals and overflow), plus
fixed edge values (ties to even at several magnitudes, f16's max and the tie above it, signed
zeros, infinities, NaN). Every conversion rounds to nearest even, so the comparison is bit
for bit, NaN matching NaN (payloads of a narrowing NaN are not specified).
Fresh seed per run (printed) unless --seed is given.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "cast_conformance"
DTYPES = {"f32": (np.float32, torch.float32), "f64": (np.float64, torch.float64),
          "f16": (np.float16, torch.float16)}


def edge_values():
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, 1e30, -1e30]
    for e in (-25, -24, -15, -14, 0, 10):
        for m in (1.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -24, 1 + 2.0 ** -11 + 2.0 ** -40):
            v += [m * 2.0 ** e, -m * 2.0 ** e]
    return np.array(v, dtype=np.float64)


def same(ours, ref):
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return False
    nan = np.isnan(ours.astype(np.float64))
    if not np.array_equal(nan, np.isnan(ref.astype(np.float64))):
        return False
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[ours.dtype.itemsize]
    return np.array_equal(ours.view(bits)[~nan], ref.view(bits)[~nan])


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    for src, (np_src, _) in DTYPES.items():
        for dst, (np_dst, torch_dst) in DTYPES.items():
            cases = [edge_values()]
            for _ in range(6):
                shape = [int(rng.integers(1, 5)), int(rng.integers(1, 40))]
                cases.append(rng.normal(size=shape) * 10.0 ** float(rng.uniform(-8, 5)))
            for values in cases:
                with np.errstate(over="ignore"):  # 1e30 -> f16 is +inf on purpose
                    x = values.astype(np_src)
                ours = run_op(args.qat, "cast", {"x": x}, ["y"], attrs={"dtype": dst})["y"]
                ref = torch.from_numpy(x).to(torch_dst).numpy()
                tally.check(f"cast {src} -> {dst}", ours.dtype == np_dst and same(ours, ref),
                            f"{list(x.shape)}")
    proc = run_op(args.qat, "cast", {"x": np.ones(3, np.int32)}, ["y"], attrs={"dtype": "f32"},
                  expect_failure=True)
    tally.check("cast bad input", proc.returncode != 0 and "cast" in proc.stdout + proc.stderr
                and "i32" in proc.stdout + proc.stderr, "an i32 input must fail naming cast and i32")
    proc = run_op(args.qat, "cast", {"x": np.ones(3, np.float32)}, ["y"], attrs={"dtype": "f8"},
                  expect_failure=True)
    tally.check("cast bad dtype", proc.returncode != 0 and "f8" in proc.stdout + proc.stderr,
                "dtype f8 must fail naming the value")
    tally.finish()


if __name__ == "__main__":
    main()
