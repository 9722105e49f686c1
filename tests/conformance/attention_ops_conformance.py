"""Conformance of the transformer-block ops against PyTorch 1.13 (CPU): softmax /
softmax_backward, embedding / embedding_backward, permute / transpose, batched_matmul.

Tolerances (f32 unless said):
  - permute, transpose, embedding forward: bit-exact (pure data movement), also their
    gradients for permute/transpose (a permute by the inverse permutation).
  - softmax: |ours - torch| <= 2e-6 + 1e-5 |torch| per element. Both compute exp(x - max)
    and divide by the f32 sum, but with different exp implementations (libm's expf vs
    torch's vectorised Sleef exp, each within ~1 ulp) and different summation orders, so the
    sum may differ by up to ~L ulps for a row of length L in the worst case; rows here are at
    most 300 long, so a few e-6 relative at most, well below 1e-5.
  - softmax_backward: |ours - torch| <= 1e-5 (max|dx| + max|dy|): dx = y (dy - sum(dy y))
    has one f32 row sum whose rounding (order-dependent, <= L ulps of sum |dy y|) is
    multiplied by y <= 1.
  - embedding_backward: |ours - torch| <= 1e-6 * (count of repeats) + exact elsewhere: each
    row is a short f32 sum of dy rows (at most a few dozen here), whose order may differ.
  - batched_matmul and its gradients: |ours - torch| <= 2 K eps32 (|op(a)| @ |op(b)|), the
    textbook bound on an f32 dot product of length K computed in any order, counted for both
    implementations (eps32 = 2^-24 per rounding).
  - f64 cases: the same bounds with eps64 (1e-12 relative where a scale is used).
Fresh random seed each run unless --seed (printed).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

import torch  # noqa: E402

SUITE = "attention_ops_conformance"
EPS32 = 2.0 ** -24
# Largest error / tolerance seen per op (printed at the end, to show the headroom).
HEADROOM = {}


def note(op, ratio):
    HEADROOM[op] = max(HEADROOM.get(op, 0.0), float(ratio))


def rand_shape(rng, lo_rank, hi_rank, hi_size=6):
    rank = int(rng.integers(lo_rank, hi_rank + 1))
    return tuple(int(rng.integers(1, hi_size + 1)) for _ in range(rank))


def worst(a, b):
    """Largest |a - b| over the elements that are not NaN in both (0 if none); inf where
    exactly one side is NaN, so a NaN pattern mismatch always fails."""
    if a.shape != b.shape:
        return np.inf
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return np.inf
    keep = ~np.isnan(a)
    return float(np.max(np.abs(a[keep] - b[keep]))) if keep.any() else 0.0


def check_softmax(qat, rng, tally):
    for case in range(40):
        dtype = np.float64 if case % 5 == 4 else np.float32
        shape = rand_shape(rng, 1, 4)
        if case % 7 == 0:
            shape = (int(rng.integers(1, 5)), int(rng.integers(100, 301)))
        axis = int(rng.integers(-len(shape), len(shape)))
        x = (rng.standard_normal(shape) * rng.choice([1.0, 4.0, 30.0])).astype(dtype)
        if case % 6 == 0:
            x.reshape(-1)[0] = -np.inf  # a masked entry, as attention masks write
        y = run_op(qat, "softmax", {"x": x}, ["y"], {"axis": axis})["y"]
        ty = torch.softmax(torch.from_numpy(x), axis).numpy()
        rtol, atol = (1e-5, 2e-6) if dtype == np.float32 else (1e-12, 1e-14)
        both_nan = np.isnan(y) & np.isnan(ty)  # columns of all -inf (a masked row)
        ok = y.shape == ty.shape and np.all(both_nan | (np.abs(y - ty) <= atol + rtol * np.abs(ty)))
        if y.shape == ty.shape:
            keep = ~both_nan
            note(f"softmax {dtype.__name__}", np.max(
                np.abs(y - ty)[keep] / (atol + rtol * np.abs(ty[keep])), initial=0.0))
        tally.check("softmax", ok, f"shape {shape} axis {axis} {dtype.__name__}: {worst(y, ty)}")

        dy = rng.standard_normal(shape).astype(dtype)
        tx = torch.from_numpy(x).requires_grad_(True)
        torch.softmax(tx, axis).backward(torch.from_numpy(dy))
        want = tx.grad.numpy()
        dx = run_op(qat, "softmax_backward", {"dy": dy, "y": ty.astype(dtype)}, ["dx"],
                    {"axis": axis})["dx"]
        finite = want[~np.isnan(want)]
        scale = (float(np.max(np.abs(finite))) if finite.size else 0.0) + float(np.max(np.abs(dy)))
        tol = (1e-5 if dtype == np.float32 else 1e-12) * scale
        note(f"softmax_backward {dtype.__name__}", worst(dx, want) / tol)
        tally.check("softmax_backward", worst(dx, want) <= tol,
                    f"shape {shape} axis {axis} {dtype.__name__}: {worst(dx, want)} > {tol}")

    # A row of all -inf is NaN in both.
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, 2.0]], np.float32)
    y = run_op(qat, "softmax", {"x": x}, ["y"])["y"]
    ty = torch.softmax(torch.from_numpy(x), -1).numpy()
    tally.check("softmax", np.array_equal(np.isnan(y), np.isnan(ty)) and np.isnan(y[0]).all(),
                "all -inf row")


def check_embedding(qat, rng, tally):
    for case in range(30):
        dtype = np.float64 if case % 5 == 4 else np.float32
        rows, width = int(rng.integers(1, 40)), int(rng.integers(1, 17))
        ishape = rand_shape(rng, 0, 3, 8)
        idx_dtype = np.int64 if case % 2 == 0 else np.int32
        # Few rows for many positions on some cases, so rows repeat.
        idx = rng.integers(0, rows, size=ishape).astype(idx_dtype)
        w = rng.standard_normal((rows, width)).astype(dtype)
        y = run_op(qat, "embedding", {"weight": w, "indices": idx}, ["y"])["y"]
        ty = torch.nn.functional.embedding(torch.from_numpy(idx.astype(np.int64)),
                                           torch.from_numpy(w)).numpy()
        tally.check("embedding", y.shape == ty.shape and np.array_equal(y, ty),
                    f"V {rows} D {width} idx {ishape}")

        dy = rng.standard_normal(ishape + (width,)).astype(dtype)
        tw = torch.from_numpy(w).requires_grad_(True)
        torch.nn.functional.embedding(torch.from_numpy(idx.astype(np.int64)), tw).backward(
            torch.from_numpy(dy))
        want = tw.grad.numpy()
        dw = run_op(qat, "embedding_backward", {"dy": dy, "indices": idx}, ["dweight"],
                    {"num_embeddings": rows})["dweight"]
        repeats = int(np.max(np.bincount(idx.reshape(-1), minlength=rows))) if idx.size else 0
        tol = (1e-6 if dtype == np.float32 else 1e-15) * max(repeats, 1) * \
            max(float(np.max(np.abs(dy))) if dy.size else 0.0, 1.0)
        note(f"embedding_backward {dtype.__name__}", worst(dw, want) / tol)
        tally.check("embedding_backward", dw.shape == want.shape and worst(dw, want) <= tol,
                    f"V {rows} D {width} idx {ishape}: {worst(dw, want)} > {tol}")

    # Out of range: torch raises IndexError, we raise a qg::Error naming the value.
    proc = run_op(qat, "embedding", {"weight": np.zeros((3, 2), np.float32),
                                     "indices": np.array([0, 3], np.int64)}, ["y"],
                  expect_failure=True)
    tally.check("embedding", proc.returncode != 0 and "indices[1] = 3" in proc.stdout + proc.stderr,
                "out-of-range index not reported")


def check_shape(qat, rng, tally):
    for case in range(30):
        shape = rand_shape(rng, 1, 5)
        perm = [int(p) for p in rng.permutation(len(shape))]
        if case % 3 == 0:
            perm = [p - len(shape) if rng.integers(0, 2) else p for p in perm]
        x = rng.standard_normal(shape).astype(np.float32 if case % 4 else np.int64)
        y = run_op(qat, "permute", {"x": x}, ["y"], {"perm": perm})["y"]
        ty = torch.from_numpy(x).permute(*perm).contiguous().numpy()
        tally.check("permute", y.shape == ty.shape and np.array_equal(y, ty), f"{shape} {perm}")

        if x.dtype == np.float32:
            dy = rng.standard_normal(ty.shape).astype(np.float32)
            tx = torch.from_numpy(x).requires_grad_(True)
            tx.permute(*perm).backward(torch.from_numpy(dy))
            inverse = list(np.argsort([p % len(shape) for p in perm]))
            dx = run_op(qat, "permute", {"x": dy}, ["y"], {"perm": inverse})["y"]
            tally.check("permute (gradient)", np.array_equal(dx, tx.grad.numpy()),
                        f"{shape} {perm}")

        d0 = int(rng.integers(-len(shape), len(shape)))
        d1 = int(rng.integers(-len(shape), len(shape)))
        y = run_op(qat, "transpose", {"x": x}, ["y"], {"dim0": d0, "dim1": d1})["y"]
        ty = torch.from_numpy(x).transpose(d0, d1).contiguous().numpy()
        tally.check("transpose", y.shape == ty.shape and np.array_equal(y, ty),
                    f"{shape} ({d0}, {d1})")


def op_t(t, flag):
    return t.transpose(-1, -2) if flag else t


def check_batched_matmul(qat, rng, tally):
    for case in range(32):
        dtype = np.float64 if case % 8 == 7 else np.float32
        eps = EPS32 if dtype == np.float32 else 2.0 ** -53
        ta, tb = bool(case & 1), bool(case & 2)
        batch = rand_shape(rng, 1, 2, 4)
        m, k, n = (int(rng.integers(1, 65)) for _ in range(3))
        a_shape = batch + ((k, m) if ta else (m, k))
        b_shape = batch + ((n, k) if tb else (k, n))
        a = rng.uniform(-1, 1, a_shape).astype(dtype)
        b = rng.uniform(-1, 1, b_shape).astype(dtype)
        attrs = {"transpose_a": ta, "transpose_b": tb}
        y = run_op(qat, "batched_matmul", {"a": a, "b": b}, ["y"], attrs)["y"]
        A = torch.from_numpy(a).requires_grad_(True)
        B = torch.from_numpy(b).requires_grad_(True)
        ty = torch.matmul(op_t(A, ta), op_t(B, tb))
        bound = 2 * k * eps * torch.matmul(op_t(A.detach().abs(), ta),
                                           op_t(B.detach().abs(), tb)).numpy()
        label = f"batch {batch} m{m} k{k} n{n} ta {ta} tb {tb} {dtype.__name__}"
        if y.shape == ty.shape:
            note(f"batched_matmul {dtype.__name__}",
                 np.max(np.abs(y - ty.detach().numpy()) / np.maximum(bound, 1e-300)))
        tally.check("batched_matmul",
                    y.shape == ty.shape and np.all(np.abs(y - ty.detach().numpy()) <= bound),
                    label)

        dy = rng.uniform(-1, 1, ty.shape).astype(dtype)
        ty.backward(torch.from_numpy(dy))
        # The backward rule of batched_matmul_op.cpp, as ops.
        if ta:
            da = run_op(qat, "batched_matmul", {"a": b, "b": dy}, ["y"],
                        {"transpose_a": tb, "transpose_b": True})["y"]
        else:
            da = run_op(qat, "batched_matmul", {"a": dy, "b": b}, ["y"],
                        {"transpose_b": not tb})["y"]
        if tb:
            db = run_op(qat, "batched_matmul", {"a": dy, "b": a}, ["y"],
                        {"transpose_a": True, "transpose_b": ta})["y"]
        else:
            db = run_op(qat, "batched_matmul", {"a": a, "b": dy}, ["y"],
                        {"transpose_a": not ta})["y"]
        adx, abs_a, abs_b = np.abs(dy), np.abs(a), np.abs(b)
        # Bounds on dA' = dy op(b)^T (length n) and dB' = op(a)^T dy (length m), transposed
        # back to the stored layout when a flag is set.
        opb = np.swapaxes(abs_b, -1, -2) if tb else abs_b
        opa = np.swapaxes(abs_a, -1, -2) if ta else abs_a
        bound_da = 2 * n * eps * (adx @ np.swapaxes(opb, -1, -2))
        bound_db = 2 * m * eps * (np.swapaxes(opa, -1, -2) @ adx)
        if ta:
            bound_da = np.swapaxes(bound_da, -1, -2)
        if tb:
            bound_db = np.swapaxes(bound_db, -1, -2)
        tally.check("batched_matmul (da)",
                    da.shape == a.shape and np.all(np.abs(da - A.grad.numpy()) <= bound_da), label)
        tally.check("batched_matmul (db)",
                    db.shape == b.shape and np.all(np.abs(db - B.grad.numpy()) <= bound_db), label)


def main():
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally(SUITE)
    check_softmax(args.qat, rng, tally)
    check_embedding(args.qat, rng, tally)
    check_shape(args.qat, rng, tally)
    check_batched_matmul(args.qat, rng, tally)
    for op, ratio in sorted(HEADROOM.items()):
        print(f"  worst error / tolerance  {op:34s} {ratio:.3g}")
    tally.finish()


if __name__ == "__main__":
    main()
