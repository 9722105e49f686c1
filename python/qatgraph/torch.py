"""PyTorch interop: qatgraph's quantization ops as torch.autograd.Functions on CPU tensors.

    import torch, qatgraph.torch as qgt
    y = qgt.fake_quantize_per_tensor_affine(x, 0.1, 128, 0, 255)     # as torch's, STE backward
    y = qgt.fake_quantize_per_channel_affine(w, scales, zero_points, 0, -128, 127)
    fq = qgt.FakeQuantize(quant_min=0, quant_max=255)                 # observer + fake-quant
    y = fq(x)

Tensors cross into qatgraph through DLPack without a copy (contiguous inputs); results come
back as torch tensors over qatgraph's memory. The ops run on qatgraph's CPU kernels (the
numerical reference): for f32 they give PyTorch's results and gradients bit for bit; f64
inputs do their math in f64 (SEMANTICS.md), where PyTorch takes 1/scale in f32.
"""
import torch

from . import _core

__all__ = [
    "FakeQuantize",
    "fake_quantize",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_tensor_affine",
    "from_torch",
    "to_torch",
]


def to_torch(array):
    """A torch tensor sharing the memory of a qatgraph result / DLPack object."""
    return torch.utils.dlpack.from_dlpack(array)


def from_torch(tensor):
    """A NumPy array sharing a CPU tensor's memory (detached)."""
    return tensor.detach().numpy()


def _run(op, inputs, attrs=None, states=None):
    outs, new_states = _core.run_op(op, inputs, attrs, "cpu", True, states, "torch")
    return outs, new_states


def _cpu_contiguous(x, what):
    if x.device.type != "cpu":
        raise _core.Error(f"[qatgraph.torch] {what} must be a CPU tensor, got one on {x.device}")
    return x.detach().contiguous()


def _qparam(value, dtype, n):
    t = value if torch.is_tensor(value) else torch.tensor(value)
    t = t.detach().to(dtype).reshape(-1).contiguous()
    if t.numel() != n:
        raise _core.Error(f"[qatgraph.torch] expected {n} qparams, got {t.numel()}")
    return t


class _FakeQuantizeFn(torch.autograd.Function):
    """y = fake_quantize(x) with the straight-through gradient dy * mask (the in-range bit
    mask the forward kernel writes, so x itself is not kept for the backward)."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, attrs):
        y, mask = _run("fake_quantize", [_cpu_contiguous(x, "x"), scale, zero_point], attrs)[0]
        ctx.mask = mask
        return y

    @staticmethod
    def backward(ctx, dy):
        (dx,) = _run("ste_backward", [_cpu_contiguous(dy, "dy"), ctx.mask])[0]
        return dx, None, None, None


def fake_quantize(x, scale, zero_point, quant_min, quant_max, axis=None):
    """Per-tensor (axis None) or per-channel (along `axis`) affine fake quantization:
    clamp(rint(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale."""
    if axis is None:
        n, attrs = 1, {"scope": "tensor"}
    else:
        axis = axis % x.dim()
        n, attrs = x.shape[axis], {"scope": "channel", "axis": axis}
    attrs.update({"quant_min": int(quant_min), "quant_max": int(quant_max)})
    s = _qparam(scale, torch.float32, n)
    zp = _qparam(zero_point, torch.int32, n)
    return _FakeQuantizeFn.apply(x, s, zp, attrs)


def fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max):
    """torch.fake_quantize_per_tensor_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max)


def fake_quantize_per_channel_affine(input, scale, zero_point, axis, quant_min, quant_max):
    """torch.fake_quantize_per_channel_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max, axis=axis)


class _ObserveFakeQuantizeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module):
        y, mask, scale, zero_point = module._observe_and_quantize(_cpu_contiguous(x, "x"))
        ctx.mask = mask
        return y

    @staticmethod
    def backward(ctx, dy):
        (dx,) = _run("ste_backward", [_cpu_contiguous(dy, "dy"), ctx.mask])[0]
        return dx, None


class FakeQuantize(torch.nn.Module):
    """An observer followed by fake quantization, as torch.ao.quantization.FakeQuantize with
    a MovingAverageMinMaxObserver (observer='moving_average') or MinMaxObserver ('minmax'),
    per tensor or per channel (ch_axis), affine or symmetric. As in PyTorch, the observer
    runs while observer_enabled (not tied to train/eval: disable_observer() freezes it),
    fake quantization while fake_quant_enabled, and scale / zero_point are buffers. The
    observer statistics live in qatgraph's executor state between calls."""

    def __init__(self, quant_min=0, quant_max=255, observer="moving_average",
                 qscheme="affine", ch_axis=None, averaging_constant=0.01):
        super().__init__()
        self.attrs = {"quant_min": int(quant_min), "quant_max": int(quant_max), "qscheme": qscheme}
        self.fq_attrs = {"quant_min": int(quant_min), "quant_max": int(quant_max)}
        if observer == "moving_average":
            self.attrs["averaging_constant"] = float(averaging_constant)
        self.observer = f"{observer}_observer"
        self.ch_axis = ch_axis
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("scale", torch.tensor([1.0]))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int32))
        self._executors = {}  # (shape, dtype) -> (graph, executor, fetched value ids)
        self._state = {}      # the observer's state, carried between executors

    def enable_observer(self, enabled=True):
        self.observer_enabled[0] = int(enabled)
        return self

    def disable_observer(self):
        return self.enable_observer(False)

    def enable_fake_quant(self, enabled=True):
        self.fake_quant_enabled[0] = int(enabled)
        return self

    def disable_fake_quant(self):
        return self.enable_fake_quant(False)

    def _executor(self, x):
        key = (tuple(x.shape), x.dtype)
        if key not in self._executors:
            attrs, fq_attrs = dict(self.attrs), dict(self.fq_attrs)
            if self.ch_axis is not None:
                scope = {"scope": "channel", "axis": self.ch_axis % x.dim()}
                attrs.update(scope)
                fq_attrs.update(scope)
            g = _core.Graph()
            xv = g.input("x", _dtype_name(x.dtype), list(x.shape))
            scale, zp = g.apply(self.observer, [xv], attrs, "observer")
            y, mask = g.apply("fake_quantize", [xv, scale, zp], fq_attrs, "fake_quantize")
            for v in (scale, zp, y, mask):
                g.mark_output(v)
            self._executors[key] = (g, _core.Executor(g), [y, mask, scale, zp])
        return self._executors[key]

    def _observe_and_quantize(self, x):
        g, ex, fetches = self._executor(x)
        states = dict(self._state)
        states["observer/observer_enabled"] = self.observer_enabled.contiguous()
        states["fake_quantize/fake_quant_enabled"] = self.fake_quant_enabled.contiguous()
        ex.load_state_dict(states, strict=False)
        y, mask, scale, zp = ex.run({"x": x}, fetches, framework="torch")
        self._state = {k: v for k, v in ex.state_dict(framework="torch").items()
                       if k.startswith("observer/") and not k.endswith("_enabled")}
        with torch.no_grad():
            self.scale.resize_(scale.shape).copy_(scale)
            self.zero_point.resize_(zp.shape).copy_(zp)
        return y, mask, scale, zp

    def forward(self, x):
        return _ObserveFakeQuantizeFn.apply(x, self)


def _dtype_name(dtype):
    names = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
             torch.bfloat16: "bf16"}
    if dtype not in names:
        raise _core.Error(f"[qatgraph.torch] fake quantization of {dtype} (f32, f64, f16, bf16)")
    return names[dtype]
