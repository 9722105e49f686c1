"""Dynamic quantizers: modules whose qparams come from the very tensor they quantize, on every
call, with torchao's QAT numerics (its 8da4w and int4 weight-only QAT linears, and
per-channel int8 weights). They hold no state, so a QAT linear using them has the float
linear's state_dict (`weight`, `bias`), as torchao's QAT linears have, and nothing to sync
across data-parallel ranks (each rank's qparams are its tensor's own, as in torchao).

The qparams are computed with torch ops in the tensor's own dtype, as torchao computes them
(the scales of a bf16 tensor are bf16 values): qatgraph's qparam kernels work in f32. The
fake quantization runs on qatgraph's kernels where torchao's arithmetic is theirs, the integer
zero point: `q = clamp(rint(x * (1 / scale)) + zp)`, `(q - zp) * scale` in f32, rounded once to
the input's dtype. torchao's float zero point (tinygemm's int4 format) runs on qatgraph's
dynamic_fake_quantize (mode float_zero) on CUDA, and on the CPU is composed of the same torch
ops as torchao's, in the same order and dtypes.

Gradients are the straight-through estimator `dx = dy * mask`, exactly. torchao differentiates
its composition instead, which gives `dy * scale * (1 / scale) * mask` (or `/ scale`): equal up
to the rounding of that product.
"""
import torch
from torch import nn

from .. import _core
from . import _kernels
from .functional import (
    _DynamicFakeQuantizeFn,
    _dynamic_attrs,
    dynamic_fake_quantize,
    fake_quantize,
)

_PREFIX = "[qatgraph.torch]"
# The dtypes torchao's quantize primitives take.
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# torchao's activation eps of the 8da4w recipe: f32's machine epsilon, whatever the input dtype.
F32_EPS = torch.finfo(torch.float32).eps
# torchao's scale floor of the float-zero-point (tinygemm) int4 weights.
TINYGEMM_EPS = 1e-6


def _signed_range(bits):
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _check_float(x, who, what):
    if x.dtype not in FLOAT_DTYPES:
        raise _core.Error(f"{_PREFIX} {who}: the {what} has dtype {x.dtype}; torchao's numerics "
                          f"are defined for {[str(d) for d in FLOAT_DTYPES]}")


def _bits_equal(a, b):
    """Whether two float tensors hold the same bits (signed zeros and NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {torch.float32: torch.int32, torch.float64: torch.int64}.get(a.dtype, torch.int16)
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


class _Switch(nn.Module):
    """The on/off switch torchao's fake quantizers have (`enabled`), and the recipe name the
    errors give."""

    def __init__(self, recipe):
        super().__init__()
        self.recipe = str(recipe)
        self.enabled = True

    def enable_fake_quant(self, enabled=True):
        """Switches fake quantization on (off with enabled=False); off, forward is identity."""
        self.enabled = bool(enabled)
        return self

    def disable_fake_quant(self):
        """Switches fake quantization off: forward returns its input."""
        return self.enable_fake_quant(False)


class PerTokenFakeQuantize(_Switch):
    """Per-token asymmetric dynamic fake quantization (activations): one (scale, zero point)
    per row of the last dimension, from the row's range extended to include 0.

    torchao's choose_qparams_affine (asymmetric), in the input's dtype:
    `scale = max((max_pos - min_neg) / (qmax - qmin), eps)`,
    `zp = clamp(qmin - rint(min_neg / scale), qmin, qmax)`; then qatgraph's per-token fake
    quantize. `eps` defaults to f32's machine epsilon (torchao's 8da4w activations). A row
    holding a non-finite value has no finite scale: qatgraph's kernel raises there (torchao
    returns NaN for that row).
    """

    def __init__(self, bits=8, eps=F32_EPS, recipe="8da4w"):
        super().__init__(recipe)
        self.bits, self.eps = int(bits), float(eps)
        self.quant_min, self.quant_max = _signed_range(self.bits)

    def qparams(self, x):
        """(scale f32, zero_point int32), each of shape x.shape[:-1]."""
        _check_float(x, f"recipe '{self.recipe}' activation quantizer", "input")
        with torch.no_grad():
            x = x.detach()
            min_val, max_val = torch.amin(x, dim=-1), torch.amax(x, dim=-1)
            min_neg = torch.min(min_val, torch.zeros_like(min_val))
            max_pos = torch.max(max_val, torch.zeros_like(max_val))
            scale = (max_pos - min_neg) / float(self.quant_max - self.quant_min)
            scale = torch.clamp(scale, min=self.eps)
            zero_point = self.quant_min - torch.round(min_neg / scale)
            zero_point = torch.clamp(zero_point, self.quant_min, self.quant_max)
        return scale.to(torch.float32), zero_point.to(torch.int32)

    def dynamic_attrs(self, x):
        """dynamic_fake_quantize's attribute key for x when this quantizer runs it (enabled, x on
        CUDA), else None; QATLinear then fuses it into one autograd node with the linear."""
        if not (self.enabled and x.is_cuda):
            return None
        _check_float(x, f"recipe '{self.recipe}' activation quantizer", "input")
        return _dynamic_attrs(0, False, self.quant_min, self.quant_max, self.eps)

    def forward(self, x):
        """x fake-quantized per token with its own qparams (x itself when disabled)."""
        if not self.enabled:
            return x
        if x.is_cuda:  # one kernel: the same qparams as qparams(), as PyTorch's CUDA ops give
            return dynamic_fake_quantize(x, self.quant_min, self.quant_max, eps=self.eps)[0]
        scale, zero_point = self.qparams(x)
        return fake_quantize(x, scale, zero_point, self.quant_min, self.quant_max,
                             scope="token")

    def extra_repr(self):
        """Bits, eps, recipe and switch, for repr()."""
        return (f"bits={self.bits}, asymmetric, per token, eps={self.eps}, "
                f"recipe={self.recipe!r}, enabled={self.enabled}")


class _WeightQuantizer(_Switch):
    """Shared checks of the weight quantizers: a 2-D weight whose rows split into groups."""

    def __init__(self, bits, group_size, recipe):
        super().__init__(recipe)
        self.bits = int(bits)
        self.group_size = None if group_size is None else int(group_size)

    def _groups(self, w):
        """The group size used on w: `group_size`, or the whole row when it is None."""
        who = f"recipe '{self.recipe}' weight quantizer"
        _check_float(w, who, "weight")
        if w.dim() != 2:
            raise _core.Error(f"{_PREFIX} {who}: the weight must be 2-D (a Linear's), got "
                              f"shape {list(w.shape)}")
        size = w.shape[1] if self.group_size is None else self.group_size
        if size <= 0 or w.shape[1] % size:
            raise _core.Error(f"{_PREFIX} {who}: group_size = {size} does not divide "
                              f"in_features = {w.shape[1]} (weight shape {list(w.shape)})")
        return size


class GroupSymmetricFakeQuantize(_WeightQuantizer):
    """Symmetric fake quantization of a Linear weight to signed `bits`, one scale per group of
    `group_size` consecutive input features of each output row (per output channel when
    group_size is None); zero point 0.

    torchao's get_group_qparams_symmetric, in the weight's dtype:
    `scale = max(max(-min_neg, max_pos) / ((qmax - qmin) / 2), smallest normal of the dtype)`
    (so int4 divides by 7.5, int8 by 127.5), stored as f32; then qatgraph's per-group (or
    per-channel) fake quantize over [qmin, qmax] = [-2^(bits-1), 2^(bits-1) - 1].
    """

    def __init__(self, bits=4, group_size=32, recipe="8da4w"):
        super().__init__(bits, group_size, recipe)
        self.quant_min, self.quant_max = _signed_range(self.bits)

    def qparams(self, w):
        """(scale f32, zero_point int32): [out, in / group_size], or [out] per channel."""
        size = self._groups(w)
        with torch.no_grad():
            v = w.detach().reshape(w.shape[0], -1, size)
            min_val, max_val = torch.amin(v, dim=-1), torch.amax(v, dim=-1)
            min_neg = torch.min(min_val, torch.zeros_like(min_val))
            max_pos = torch.max(max_val, torch.zeros_like(max_val))
            amax = torch.max(-min_neg, max_pos)
            scale = amax / (float(self.quant_max - self.quant_min) / 2)
            scale = torch.clamp(scale, min=torch.finfo(w.dtype).smallest_normal)
            scale = scale.to(torch.float32)
        if self.group_size is None:
            scale = scale.reshape(-1)
        return scale, torch.zeros_like(scale, dtype=torch.int32)

    def _fake_quantize(self, w, scale, zero_point):
        if self.group_size is None:
            return fake_quantize(w, scale, zero_point, self.quant_min, self.quant_max, axis=0)
        return fake_quantize(w, scale, zero_point, self.quant_min, self.quant_max, axis=1,
                             scope="group", group_size=self.group_size)

    def forward(self, w):
        """w fake-quantized with its own qparams (w itself when disabled)."""
        if not self.enabled:
            return w
        if w.is_cuda:  # one kernel: the same qparams as qparams(), as PyTorch's CUDA ops give
            size = self._groups(w)
            return dynamic_fake_quantize(
                w, self.quant_min, self.quant_max, group_size=0 if self.group_size is None else size,
                symmetric=True, eps=torch.finfo(w.dtype).smallest_normal)[0]
        return self._fake_quantize(w, *self.qparams(w))

    def dynamic_attrs(self, w):
        """dynamic_fake_quantize's attribute key for w when this quantizer runs it (enabled, w on
        CUDA), else None (see PerTokenFakeQuantize.dynamic_attrs)."""
        if not (self.enabled and w.is_cuda):
            return None
        size = self._groups(w)
        return _dynamic_attrs(0 if self.group_size is None else size, True, self.quant_min,
                              self.quant_max, torch.finfo(w.dtype).smallest_normal)

    def freeze_weight(self, w):
        """The integer form of w that convert stores: a QuantizedWeight whose forward gives
        this quantizer's output on w bit for bit."""
        scale, zero_point = self.qparams(w)
        size = self._groups(w)
        attrs = {"quant_min": self.quant_min, "quant_max": self.quant_max}
        if self.group_size is None:
            attrs.update({"scope": "channel", "axis": 0})
        else:
            attrs.update({"scope": "group", "axis": 1, "group_size": size})
        from . import _kernels
        codes = _kernels.run("quantize", attrs, [w.detach(), scale, zero_point])[0]
        return QuantizedWeight(codes, scale, zero_point, size, w.dtype, "integer")

    def extra_repr(self):
        """Bits, group size, recipe and switch, for repr()."""
        groups = "per channel" if self.group_size is None else f"group_size={self.group_size}"
        return (f"bits={self.bits}, symmetric, {groups}, recipe={self.recipe!r}, "
                f"enabled={self.enabled}")


def float_zero_qparams(w, bits, group_size, eps=TINYGEMM_EPS, dtype=torch.bfloat16):
    """torchao's float-zero-point (tinygemm) qparams of a 2-D weight, per group: in w's dtype,
    `scale = max((max - min) / (2^bits - 1), eps)`, `zero = min + scale * 2^(bits-1)` (from the
    unrounded scale), both then rounded to `dtype`. Shapes [out, in / group_size]."""
    qmax = 2 ** bits - 1
    with torch.no_grad():
        v = w.detach().reshape(w.shape[0], -1, group_size)
        min_val, max_val = torch.amin(v, dim=-1), torch.amax(v, dim=-1)
        scale = (max_val - min_val) / float(qmax)
        scale = torch.clamp(scale, min=eps)
        zero = min_val + scale * ((qmax + 1) / 2)
    return scale.to(dtype), zero.to(dtype)


def float_zero_codes(w, scale, zero, bits, group_size):
    """(codes clamped to [0, 2^bits - 1], in-range mask), torchao's float-zero-point quantize:
    `rint((w - (zero - scale * mid)) / scale)`, mid = 2^(bits-1), in the dtype torch promotes
    w and the bf16 qparams to (the subtraction and the true division each round there)."""
    qmax = 2 ** bits - 1
    v = w.reshape(w.shape[0], -1, group_size)
    s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
    low = z - s * ((qmax + 1) / 2)
    q = torch.round((v - low) / s)
    mask = (q >= 0) & (q <= qmax)
    return torch.clamp(q, 0, qmax), mask


def float_zero_dequantize(codes, scale, zero, bits, dtype):
    """torchao's float-zero-point dequantize of grouped codes [out, groups, group_size]:
    `(q - mid)` cast to `dtype`, then `*= scale` and `+= zero` in place (each rounded to
    `dtype`); returns [out, in]."""
    d = (codes - (2 ** bits) / 2).to(dtype)
    d *= scale.unsqueeze(-1)
    d += zero.unsqueeze(-1)
    return d.reshape(d.shape[0], -1)


class _FloatZeroFakeQuantizeFn(torch.autograd.Function):
    """The float-zero-point fake quantize with the straight-through gradient dy * mask."""

    @staticmethod
    def forward(ctx, w, scale, zero, bits, group_size):
        codes, mask = float_zero_codes(w, scale, zero, bits, group_size)
        ctx.save_for_backward(mask.reshape(w.shape))
        return float_zero_dequantize(codes, scale, zero, bits, w.dtype)

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return dy * mask.to(dy.dtype), None, None, None, None


class GroupFloatZeroFakeQuantize(_WeightQuantizer):
    """Asymmetric fake quantization of a Linear weight to unsigned `bits` (int4: [0, 15]) per
    group of `group_size` input features, with the zero point a float (torchao's
    ZeroPointDomain.FLOAT, the format of tinygemm's int4 kernel, its int4 weight-only QAT):
    scale and zero as float_zero_qparams (bf16), then
    `q = clamp(rint((w - (zero - scale * mid)) / scale), 0, 2^bits - 1)`,
    `w' = (q - mid) * scale + zero`, mid = 2^(bits-1). On CUDA one dynamic_fake_quantize
    kernel (mode float_zero, bf16 qparams) computes it; on the CPU torch ops do, torchao's, in
    its order and dtypes (torch's CPU division by a number divides, where CUDA's multiplies by
    the reciprocal as the kernel does).
    """

    def __init__(self, bits=4, group_size=128, recipe="int4_weight_only"):
        super().__init__(bits, group_size, recipe)
        self.quant_min, self.quant_max = 0, 2 ** self.bits - 1

    def qparams(self, w):
        """(scale bf16, zero bf16), each [out, in / group_size]."""
        return float_zero_qparams(w, self.bits, self._groups(w))

    def forward(self, w):
        """w fake-quantized with its own qparams (w itself when disabled)."""
        if not self.enabled:
            return w
        size = self._groups(w)
        if w.is_cuda:
            attrs = _kernels.attrs_key({
                "group_size": size, "mode": "float_zero", "quant_min": 0,
                "quant_max": self.quant_max, "eps": TINYGEMM_EPS, "qparam_dtype": "bf16"})
            return _DynamicFakeQuantizeFn.apply(w, attrs)[0]
        scale, zero = float_zero_qparams(w, self.bits, size)
        return _FloatZeroFakeQuantizeFn.apply(w, scale, zero, self.bits, size)

    def freeze_weight(self, w):
        """The integer form of w that convert stores (uint8 codes, bf16 scale and zero): a
        QuantizedWeight whose forward gives this quantizer's output on w bit for bit."""
        size = self._groups(w)
        scale, zero = float_zero_qparams(w, self.bits, size)
        with torch.no_grad():
            codes, _ = float_zero_codes(w.detach(), scale, zero, self.bits, size)
        codes = codes.reshape(w.shape).to(torch.uint8)
        return QuantizedWeight(codes, scale, zero, size, w.dtype, "float", self.bits)

    def extra_repr(self):
        """Bits, group size, recipe and switch, for repr()."""
        return (f"bits={self.bits}, asymmetric float zero point, group_size={self.group_size},"
                f" recipe={self.recipe!r}, enabled={self.enabled}")


class QuantizedWeight(nn.Module):
    """A Linear weight as integer codes with per-group (or per-channel) qparams, dequantized
    by forward: what convert keeps of a dynamic weight quantizer.

    Buffers: `int_data` (the codes, one per byte: int8 for the symmetric quantizer, uint8
    [0, 2^bits - 1] for the float zero point), `scale`, `zero_point`. zero_point_domain
    "integer": `(int_data - zero_point) * scale` in f32, rounded to `dtype`; "float":
    float_zero_dequantize.
    """

    def __init__(self, int_data, scale, zero_point, group_size, dtype, zero_point_domain,
                 bits=4):
        super().__init__()
        self.register_buffer("int_data", int_data.detach().clone())
        self.register_buffer("scale", scale.detach().clone())
        self.register_buffer("zero_point", zero_point.detach().clone())
        self.group_size, self.dtype = int(group_size), dtype
        self.zero_point_domain, self.bits = zero_point_domain, int(bits)

    def forward(self):
        """The dequantized weight, [out, in] in `dtype`."""
        rows = self.int_data.shape[0]
        codes = self.int_data.reshape(rows, -1, self.group_size)
        scale = self.scale.reshape(rows, -1)
        zero = self.zero_point.reshape(rows, -1)
        if self.zero_point_domain == "float":
            return float_zero_dequantize(codes.to(self.dtype), scale, zero, self.bits,
                                         self.dtype)
        # Integers below 2^24 convert to f32 exactly and the product rounds once, as the
        # fake-quantize kernel's: the same bits.
        centred = (codes.to(torch.int32) - zero.unsqueeze(-1)).to(torch.float32)
        return (centred * scale.unsqueeze(-1)).reshape(rows, -1).to(self.dtype)

    def extra_repr(self):
        """Shape, group size, zero-point domain and dtype, for repr()."""
        return (f"shape={list(self.int_data.shape)}, group_size={self.group_size}, "
                f"zero_point_domain={self.zero_point_domain!r}, dtype={self.dtype}")
