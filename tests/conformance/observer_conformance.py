"""Observer conformance: moving-average (per tensor / per channel) qparams bit-exact against
torch.ao.quantization 1.13, histogram observer ranges within one bin of PyTorch's
HistogramObserver, percentile observer bit-exact against a NumPy reference of SEMANTICS.md
and ops/observer/percentile_histogram.h. State is carried across batches with --state and
--state-out, so every batch is a separate `qat op` run, as a user would drive it.
"""
import os
import sys
import warnings

import numpy as np
import torch
from torch.ao.quantization import (HistogramObserver, MovingAverageMinMaxObserver,
                                   MovingAveragePerChannelMinMaxObserver)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qatop import Tally, fresh_rng, parse_args, run_op  # noqa: E402

MA_STATES = ["min", "max", "initialized", "nonfinite_count", "observer_enabled"]
HIST_STATES = ["histogram", "min", "max", "initialized", "nonfinite_count", "observer_enabled"]
PCT_STATES = ["histogram", "lo", "width", "initialized", "nonfinite_count", "observer_enabled"]


def random_shape(rng, min_rank=1):
    rank = int(rng.integers(min_rank, 5))
    return [int(rng.choice([1, 2, 3, 5, 7, 16])) for _ in range(rank)]


def random_batch(rng, shape, scale=None):
    """Values at a random scale, with ±0 and the odd far outlier."""
    if scale is None:
        scale = float(10.0 ** rng.uniform(-3, 2))
    x = rng.standard_normal(shape) * scale + rng.uniform(-1, 1) * scale
    flat = x.reshape(-1)
    if flat.size > 3 and rng.random() < 0.5:
        flat[rng.integers(flat.size)] = 0.0
        flat[rng.integers(flat.size)] = -0.0
    if flat.size > 3 and rng.random() < 0.3:
        flat[rng.integers(flat.size)] = scale * 50.0 * rng.choice([-1, 1])
    if rng.random() < 0.15:
        flat[:] = np.abs(flat)  # one-sided
    return x.astype(np.float32)


def random_range_attrs(rng, allow_custom=True):
    """Our attributes plus the matching torch observer kwargs."""
    attrs, kw = {}, {}
    symmetric = bool(rng.random() < 0.5)
    attrs["qscheme"] = "symmetric" if symmetric else "affine"
    signed = bool(rng.random() < 0.5)
    attrs["signed"] = signed
    kw["dtype"] = torch.qint8 if signed else torch.quint8
    if allow_custom and rng.random() < 0.25:
        if signed:
            lo = -int(rng.integers(1, 129))
            hi = int(rng.integers(1, 128))
        else:
            lo = 0
            hi = int(rng.integers(1, 256))
        attrs["quant_min"], attrs["quant_max"] = lo, hi
        kw["quant_min"], kw["quant_max"] = lo, hi
    # PyTorch's observers refuse reduce_range with symmetric quint8.
    if rng.random() < 0.25 and not (symmetric and not signed):
        attrs["reduce_range"] = True
        kw["reduce_range"] = True
    return attrs, kw, symmetric


def as_state_inputs(res, names):
    return {n: res["state:" + n] for n in names}


def same_bits(a, b):
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32)).reshape(-1)
    b = np.ascontiguousarray(np.asarray(b, dtype=np.float32)).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def same_stat(a, b):
    """Bit-equal statistics, except that -0 and +0 count as equal: which zero torch.aminmax
    returns depends on its vectorisation; ours prefers -0 for min and +0 for max."""
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    return a.shape == b.shape and all(same_bits(x, y) or (x == 0 and y == 0)
                                      for x, y in zip(a, b))


def check_moving_average(qat, rng, tally, per_channel):
    op_label = "moving_average_observer/" + ("channel" if per_channel else "tensor")
    # PyTorch's per-channel observers flatten dims 1.. and so need rank >= 2.
    shape = random_shape(rng, 2 if per_channel else 1)
    attrs, kw, symmetric = random_range_attrs(rng)
    if rng.random() < 0.6:
        c = float(rng.choice([1.0, 0.5, 0.3, float(rng.uniform(1e-4, 1.0))]))
        attrs["averaging_constant"] = c
        kw["averaging_constant"] = c
    if per_channel:
        axis = int(rng.integers(-len(shape), len(shape)))
        attrs["scope"], attrs["axis"] = "channel", axis
        kw["ch_axis"] = axis
        kw["qscheme"] = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        obs = MovingAveragePerChannelMinMaxObserver(**kw)
    else:
        kw["qscheme"] = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
        obs = MovingAverageMinMaxObserver(**kw)
    states = {}
    # f64 and f16 inputs: both sides observe them after a cast to f32.
    dtype = rng.choice([np.float32, np.float32, np.float64, np.float16])
    for _ in range(int(rng.integers(1, 6))):
        x = random_batch(rng, shape).astype(dtype)
        res = run_op(qat, "moving_average_observer", {"x": x}, ["scale", "zero_point"], attrs,
                     states=states, state_out=MA_STATES)
        states = as_state_inputs(res, MA_STATES)
        obs(torch.from_numpy(x))
        ts, tz = obs.calculate_qparams()
        ok = (same_bits(res["scale"], ts.numpy())
              and np.array_equal(res["zero_point"].reshape(-1), tz.numpy().reshape(-1))
              and same_stat(res["state:min"], obs.min_val.numpy())
              and same_stat(res["state:max"], obs.max_val.numpy()))
        tally.check(op_label, ok, f"shape {shape} attrs {attrs}: scale {res['scale']} vs "
                    f"{ts.numpy()}, zp {res['zero_point']} vs {tz.numpy()}, min {res['state:min']} vs "
                    f"{obs.min_val.numpy()}, max {res['state:max']} vs {obs.max_val.numpy()}, "
                    f"c {attrs.get('averaging_constant')}, x {x.reshape(-1)[:8]}")


class FloatBoundsHistogramObserver(HistogramObserver):
    """PyTorch 1.13's HistogramObserver with histc bounded by the float min/max instead of
    int(min)/int(max) (the truncation later releases dropped). Every other step (merging,
    L2 search, qparams) is the inherited PyTorch code."""

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        if (self.min_val == float("inf") and self.max_val == float("-inf")) or \
                self.min_val.item() == self.max_val.item():
            mn, mx = torch.aminmax(x)
            self.min_val.copy_(mn)
            self.max_val.copy_(mx)
            self.histogram.copy_(torch.histc(x, self.bins, min=mn.item(), max=mx.item()))
            return x_orig
        mn, mx = torch.aminmax(x)
        cmin, cmax, down, start = self._adjust_min_max(torch.min(mn, self.min_val),
                                                       torch.max(mx, self.max_val),
                                                       self.upsample_rate)
        fresh = torch.histc(x, self.bins, min=cmin.item(), max=cmax.item())
        if cmin == self.min_val and cmax == self.max_val:
            fresh += self.histogram
        else:
            fresh = self._combine_histograms(fresh, self.histogram, self.upsample_rate, down,
                                             start, self.bins)
        self.histogram.copy_(fresh)
        self.min_val.copy_(cmin)
        self.max_val.copy_(cmax)
        return x_orig


def hist_bin_distance(ours_lo, ours_hi, t_lo, t_hi, t_min, t_max, bins):
    width = (float(t_max) - float(t_min)) / bins
    if width == 0:
        return 0.0 if (ours_lo == t_lo and ours_hi == t_hi) else float("inf")
    return max(abs(float(ours_lo) - float(t_lo)), abs(float(ours_hi) - float(t_hi))) / width


def check_histogram(qat, rng, tally, stats, per_channel, integer_extremes):
    """integer_extremes: each batch holds its min and max as exact integers, so the stock
    1.13 observer (int(min)/int(max) histc bounds) is the oracle; otherwise the float-bounds
    variant above is. One batch only for the stock oracle: later growth makes the combined
    bounds non-integer."""
    label = "histogram_observer/" + ("channel" if per_channel else "tensor") + \
        ("/stock" if integer_extremes else "")
    attrs, kw, symmetric = random_range_attrs(rng)
    kw["qscheme"] = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    shape = [int(rng.integers(50, 5000))] if not per_channel else \
        [int(rng.integers(2, 4)), int(rng.integers(40, 200))]
    axis = 0
    if per_channel:
        if rng.random() < 0.5:
            shape = shape[::-1]
            axis = -1
        attrs["scope"], attrs["axis"] = "channel", axis
    nch = shape[axis] if per_channel else 1
    cls = HistogramObserver if integer_extremes else FloatBoundsHistogramObserver
    torch_obs = [cls(**kw) for _ in range(nch)]
    states = {}
    batches = 1 if integer_extremes else int(rng.integers(1, 5))
    # PyTorch materialises the merge grid (bins * downsample_rate cells), so batch scales
    # stay within a factor of a few of each other here; the C++ side has no such limit.
    base = float(10.0 ** rng.uniform(-2, 1))
    for _ in range(batches):
        x = random_batch(rng, shape, base * float(rng.uniform(0.25, 4.0)))
        if integer_extremes:
            xm = np.moveaxis(x, axis, 0).reshape(nch, -1) if per_channel else x.reshape(1, -1)
            xm[:, 0] = -float(rng.integers(1, 6))
            xm[:, 1] = float(rng.integers(1, 9))
            xm[:, 2:] = np.clip(xm[:, 2:], xm[:, :1], xm[:, 1:2])
            x = np.moveaxis(xm.reshape([nch] + [s for i, s in enumerate(shape)
                                                if i != axis % len(shape)]), 0, axis) \
                if per_channel else xm.reshape(shape)
            x = np.ascontiguousarray(x, dtype=np.float32)
        res = run_op(qat, "histogram_observer", {"x": x},
                     ["scale", "zero_point", "range_min", "range_max"], attrs, states=states,
                     state_out=HIST_STATES)
        states = as_state_inputs(res, HIST_STATES)
        xc = np.moveaxis(x, axis, 0).reshape(nch, -1) if per_channel else x.reshape(1, -1)
        for c in range(nch):
            o = torch_obs[c]
            o(torch.from_numpy(np.ascontiguousarray(xc[c])))
            t_lo, t_hi = o._non_linear_param_search()
            ts, tz = o.calculate_qparams()
            d = hist_bin_distance(res["range_min"].reshape(-1)[c], res["range_max"].reshape(-1)[c],
                                  t_lo, t_hi, o.min_val, o.max_val, o.bins)
            stats["max_bin_distance"] = max(stats["max_bin_distance"], d)
            exact = same_bits(res["scale"].reshape(-1)[c], ts.numpy()) and \
                int(res["zero_point"].reshape(-1)[c]) == int(tz.numpy().reshape(-1)[0])
            stats["hist_exact"] += int(exact)
            stats["hist_total"] += 1
            tally.check(label, d <= 1.0, f"shape {shape} attrs {attrs} channel {c}: range "
                        f"[{res['range_min'].reshape(-1)[c]}, {res['range_max'].reshape(-1)[c]}]"
                        f" vs torch [{float(t_lo)}, {float(t_hi)}] ({d:.3f} bins)")


# ---- percentile observer: NumPy reference of ops/observer/percentile_histogram.h ----------
class RefPercentile:
    def __init__(self, bins):
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.int64)
        self.lo = 0.0
        self.width = 0.0
        self.init = False

    def update(self, v):
        v = v.astype(np.float64)
        if v.size == 0:
            return
        vmin, vmax = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
        if not self.init:
            self.lo = vmin
            span = vmax - vmin
            self.width = (span if span > 0 else 1.0) / self.bins
            self.init = True
            self.counts[:] = 0
        while not (vmin >= self.lo and vmax <= self.lo + self.bins * self.width):
            w2 = 2.0 * self.width
            need = np.ceil((self.lo - vmin) / w2)
            m = int(min(need, self.bins // 2)) if need > 0 else 0
            merged = np.zeros(self.bins, dtype=np.int64)
            np.add.at(merged, m + np.arange(self.bins) // 2, self.counts)
            self.counts = merged
            self.lo = self.lo - m * w2
            self.width = w2
        k = np.floor((v - self.lo) / self.width)
        k = np.clip(k, 0, self.bins - 1).astype(np.int64)
        np.add.at(self.counts, k, 1)

    def value(self, q):
        before = 0
        for k in np.nonzero(self.counts)[0]:
            c = int(self.counts[k])
            if before + c >= q:
                frac = max((q - before) / c, 0.0)
                return self.lo + self.width * (k + frac)
            before += c
        return self.lo + self.width * self.bins


def ref_qparams(lo, hi, attrs):
    """SEMANTICS.md qparams from (min, max), in f32 (via torch's own _calculate_qparams)."""
    kw = {"dtype": torch.qint8 if attrs.get("signed") else torch.quint8,
          "qscheme": torch.per_tensor_symmetric if attrs["qscheme"] == "symmetric"
          else torch.per_tensor_affine,
          "reduce_range": attrs.get("reduce_range", False)}
    if "quant_min" in attrs:
        kw["quant_min"], kw["quant_max"] = attrs["quant_min"], attrs["quant_max"]
        kw["dtype"] = torch.qint8 if attrs["quant_min"] < 0 else torch.quint8
    o = MovingAverageMinMaxObserver(**kw)
    s, z = o._calculate_qparams(torch.tensor(np.float32(lo)), torch.tensor(np.float32(hi)))
    return s.numpy().reshape(-1)[0], int(z.numpy().reshape(-1)[0])


def check_percentile(qat, rng, tally, per_channel):
    label = "percentile_observer/" + ("channel" if per_channel else "tensor")
    attrs, _, symmetric = random_range_attrs(rng)
    p = float(rng.choice([100.0, 99.99, 99.9, 99.0, 90.0, 50.0, 10.0,
                          float(rng.uniform(0.1, 100.0))]))
    bins = int(rng.choice([2, 3, 16, 255, 2048]))
    attrs["percentile"], attrs["bins"] = p, bins
    shape = random_shape(rng)
    axis = int(rng.integers(-len(shape), len(shape))) if per_channel else 0
    if per_channel:
        attrs["scope"], attrs["axis"] = "channel", axis
    nch = shape[axis] if per_channel else 1
    refs = [RefPercentile(bins) for _ in range(nch)]
    states = {}
    batches = int(rng.integers(1, 5))
    for b in range(batches):
        x = random_batch(rng, shape) * np.float32(10.0 ** rng.uniform(-1, 1))
        res = run_op(qat, "percentile_observer", {"x": x},
                     ["scale", "zero_point", "range_min", "range_max"], attrs, states=states,
                     state_out=PCT_STATES)
        states = as_state_inputs(res, PCT_STATES)
        xc = np.moveaxis(x, axis, 0).reshape(nch, -1) if per_channel else x.reshape(1, -1)
        for c in range(nch):
            r = refs[c]
            r.update(np.abs(xc[c]) if symmetric else xc[c])
            total = float(r.counts.sum())
            top = r.value(p / 100.0 * total)
            bottom = -top if symmetric else r.value((100.0 - p) / 100.0 * total)
            lo, hi = np.float32(min(bottom, top)), np.float32(max(bottom, top))
            s, z = ref_qparams(lo, hi, attrs)
            ok = (same_bits(res["range_min"].reshape(-1)[c], lo)
                  and same_bits(res["range_max"].reshape(-1)[c], hi)
                  and same_bits(res["scale"].reshape(-1)[c], s)
                  and int(res["zero_point"].reshape(-1)[c]) == z)
            if b == 0 and not per_channel:
                # Independent check of the reference itself on one batch: the bin where the
                # cumulative count reaches q = p/100 * N holds the sample of rank ceil(q), so
                # the value is within one bin width of that order statistic.
                v = np.sort((np.abs(xc[c]) if symmetric else xc[c]).astype(np.float64))
                rank = min(max(int(np.ceil(p / 100.0 * v.size)), 1), v.size)
                want = v[rank - 1]
                tally.check("percentile_observer/order_statistic",
                            abs(top - want) <= r.width * (1 + 1e-9),
                            f"p {p} bins {bins}: {top} vs sample {want}, width {r.width}")
            tally.check(label, ok, f"shape {shape} attrs {attrs} ch {c}: range "
                        f"[{res['range_min'].reshape(-1)[c]}, {res['range_max'].reshape(-1)[c]}]"
                        f" vs [{lo}, {hi}], scale {res['scale'].reshape(-1)[c]} vs {s}")


def main():
    warnings.filterwarnings("ignore")  # PyTorch's reduce_range deprecation notice
    args = parse_args()
    rng = fresh_rng(args.seed)
    tally = Tally("observer_conformance")
    stats = {"max_bin_distance": 0.0, "hist_exact": 0, "hist_total": 0}
    for _ in range(30):
        check_moving_average(args.qat, rng, tally, per_channel=False)
        check_moving_average(args.qat, rng, tally, per_channel=True)
    for _ in range(12):
        check_histogram(args.qat, rng, tally, stats, per_channel=False, integer_extremes=False)
    for _ in range(6):
        check_histogram(args.qat, rng, tally, stats, per_channel=False, integer_extremes=True)
    for _ in range(5):
        check_histogram(args.qat, rng, tally, stats, per_channel=True, integer_extremes=False)
    for _ in range(20):
        check_percentile(args.qat, rng, tally, per_channel=False)
        check_percentile(args.qat, rng, tally, per_channel=True)
    print(f"histogram_observer: max range distance from PyTorch {stats['max_bin_distance']:.4f} "
          f"bins; scale/zp identical in {stats['hist_exact']}/{stats['hist_total']} checks")
    tally.finish()


if __name__ == "__main__":
    main()
