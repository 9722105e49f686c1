"""Fake quantization as torch.autograd.Functions over qatgraph's CPU kernels, with torch's
signatures, results and gradients."""
import torch

from .. import _core

_PREFIX = "[qatgraph.torch]"


def to_torch(array):
    """A torch tensor sharing the memory of a qatgraph result / DLPack object."""
    return torch.utils.dlpack.from_dlpack(array)


def from_torch(tensor):
    """A NumPy array sharing a CPU tensor's memory (detached)."""
    return tensor.detach().numpy()


def run(op, inputs, attrs=None, states=None):
    """Runs one qatgraph op on the CPU: (outputs, states after the run) as torch tensors."""
    return _core.run_op(op, inputs, attrs, "cpu", True, states, "torch")


def cpu_contiguous(x, what):
    if x.device.type != "cpu":
        raise _core.Error(f"{_PREFIX} {what} must be a CPU tensor, got one on {x.device}")
    return x.detach().contiguous()


def _qparam(value, dtype, n, what, op):
    if torch.is_tensor(value) and value.requires_grad and torch.is_grad_enabled():
        # torch raises here too: these ops give no gradient for their qparams.
        raise _core.Error(f"{_PREFIX} {op} is not differentiable with respect to '{what}': "
                          f"pass it detached (or use LSQ for a learned {what})")
    t = value if torch.is_tensor(value) else torch.tensor(value)
    t = t.detach().to(dtype).reshape(-1).contiguous()
    if t.numel() != n:
        raise _core.Error(f"{_PREFIX} {op}: expected {n} qparams, got {t.numel()}")
    return t


def _unpack_mask(packed, like):
    """The fake-quantize kernel's bit-packed in-range mask (bit k & 7 of byte k >> 3) as a
    tensor of like's dtype and shape."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(-1)[: like.numel()].to(like.dtype).reshape(like.shape)


class _FakeQuantizeFn(torch.autograd.Function):
    """y = fake_quantize(x); backward dy * mask as torch computes it. The multiply (rather than
    qatgraph's ste_backward, which writes +0 where the mask is clear) keeps torch's zero signs
    and its NaN for an infinite dy, and, being torch ops, is differentiable again
    (create_graph=True)."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, attrs):
        y, mask = run("fake_quantize", [cpu_contiguous(x, "x"), scale, zero_point], attrs)[0]
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return dy * _unpack_mask(mask, dy), None, None, None


def fake_quantize(x, scale, zero_point, quant_min, quant_max, axis=None):
    """Per-tensor (axis None) or per-channel (along `axis`) affine fake quantization:
    (clamp(rint(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale, with
    the straight-through gradient. Under torch.jit.trace it records torch's own op (the same
    results), so the traced module holds no Python call and can be saved."""
    op = "fake_quantize_per_tensor_affine" if axis is None else "fake_quantize_per_channel_affine"
    if axis is None:
        n, attrs = 1, {"scope": "tensor"}
    else:
        axis = axis % x.dim()
        n, attrs = x.shape[axis], {"scope": "channel", "axis": axis}
    attrs.update({"quant_min": int(quant_min), "quant_max": int(quant_max)})
    s = _qparam(scale, torch.float32, n, "scale", op)
    zp = _qparam(zero_point, torch.int32, n, "zero_point", op)
    if torch.jit.is_tracing():
        if axis is None:
            return torch.fake_quantize_per_tensor_affine(x, s, zp, quant_min, quant_max)
        return torch.fake_quantize_per_channel_affine(x, s, zp, axis, quant_min, quant_max)
    return _FakeQuantizeFn.apply(x, s, zp, attrs)


def fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max):
    """torch.fake_quantize_per_tensor_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max)


def fake_quantize_per_channel_affine(input, scale, zero_point, axis, quant_min, quant_max):
    """torch.fake_quantize_per_channel_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max, axis=axis)
