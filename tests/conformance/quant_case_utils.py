"""Random-case helpers shared by the lsq, quantize and dynamic_quant conformance scripts:
shapes (size-1 and odd sizes), integer ranges, scales that make exact .5 ties, values in and
far outside the range, +/-0, scope broadcasting and bit-level comparison."""
import numpy as np

SIZES = [1, 1, 2, 3, 5, 7, 8, 13]


def rand_shape(rng, min_rank=1, max_rank=4):
    rank = int(rng.integers(min_rank, max_rank + 1))
    return tuple(int(rng.choice(SIZES)) for _ in range(rank))


def rand_scale(rng, n, ties):
    """Powers of two make x = (k + 0.5) * scale an exact tie after x * (1 / scale)."""
    if ties:
        return (2.0 ** rng.integers(-10, 5, size=n)).astype(np.float32)
    return np.exp(rng.uniform(-9, 3, size=n)).astype(np.float32)


def rand_values(rng, shape, scale_b, zp_b, qmin, qmax, ties, far=True):
    """f32 values around [qmin, qmax] * scale: exact ties, far outside (up to 1000 ranges
    away), +0 and -0."""
    scale_b = np.broadcast_to(scale_b, shape).astype(np.float64)
    zp_b = np.broadcast_to(zp_b, shape).astype(np.float64)
    lo = (qmin - zp_b - 3) * scale_b
    hi = (qmax - zp_b + 3) * scale_b
    x = rng.uniform(0, 1, size=shape) * (hi - lo) + lo
    pick = rng.uniform(size=shape)
    k = rng.integers(qmin - 2, qmax + 2, size=shape) - zp_b
    if ties:
        x = np.where(pick < 0.5, (k + 0.5) * scale_b, x)
    if far:
        big = (qmax - qmin) * scale_b * rng.uniform(10, 1000, size=shape)
        x = np.where((pick >= 0.5) & (pick < 0.6), big * rng.choice([-1, 1], size=shape), x)
    x = np.where((pick >= 0.6) & (pick < 0.65), 0.0, x)
    x = np.where((pick >= 0.65) & (pick < 0.7), -0.0, x)
    return x.astype(np.float32)


def qparam_shape(scope, shape, axis, gs):
    if scope == "tensor":
        return (1,)
    if scope == "channel":
        return (shape[axis],)
    if scope == "token":
        return shape[:-1] + (1,)
    q = list(shape)
    q[axis] = -(-shape[axis] // gs)
    return tuple(q)


def broadcast(scope, x_shape, v, axis, gs):
    """Expands per-scope values to x's shape (SEMANTICS.md scope definitions)."""
    if scope == "tensor":
        return v.reshape(())
    rank = len(x_shape)
    if scope == "channel":
        shp = [1] * rank
        shp[axis] = x_shape[axis]
        return v.reshape(shp)
    if scope == "token":
        return v.reshape(x_shape[:-1] + (1,))
    rep = np.repeat(v, gs, axis=axis)
    return np.take(rep, np.arange(x_shape[axis]), axis=axis)


def scope_attrs(scope, axis, gs):
    a = {"scope": scope}
    if scope in ("channel", "group"):
        a["axis"] = axis
    if scope == "group":
        a["group_size"] = gs
    return a


def same_bits(a, b):
    """Same dtype, shape, NaN positions and bit patterns (so -0 differs from +0)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    view = {8: np.uint64, 4: np.uint32, 2: np.uint16}[a.itemsize]
    return bool(np.array_equal(a.view(view)[~nan_a], b.view(view)[~nan_b]))


def first_diff(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"dtype/shape differ: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    fa, fb = a.reshape(-1), b.reshape(-1)
    if a.dtype.kind == "f":
        bad = np.flatnonzero(~((fa == fb) | (np.isnan(fa) & np.isnan(fb))) |
                             (np.signbit(fa) != np.signbit(fb)))
    else:
        bad = np.flatnonzero(fa != fb)
    if bad.size == 0:
        return "equal"
    i = bad[0]
    return f"first of {bad.size} diffs at {i}: ours {fa[i]!r} expected {fb[i]!r}"
