"""What convert() makes of the QAT modules: inference modules with frozen quantization.

Each holds its weight as integer codes (`weight_int`, int8 or uint8) with `weight_scale`,
`weight_zero_point` and `weight_axis`, dequantized in forward, and applies its input / output
quantizers as FrozenFakeQuantize modules (fixed qparams). A weight whose quantizer computes
its qparams from the weight (the torchao recipes' group-wise ones) is kept as that
quantizer's QuantizedWeight (`weight_quantized.int_data`, `.scale`, `.zero_point`); their
dynamic per-token input quantizer stays as it is. A weight whose quantizer has no
affine qparams, is switched off, or is not f32 is kept as a float buffer `weight` holding the
value the QAT module used. Batch norm runs with its running statistics whatever train() says.
"""
import torch
import torch.nn.functional as F
from torch import nn

from .. import _core
from .dynamic_quantizers import _bits_equal
from .functional import fake_quantize, run

_PREFIX = "[qatgraph.torch] convert"


def _affine_qparams(quantizer):
    """(scale, zero_point, quant_min, quant_max, axis or None) of a torch.ao-style fake-quant
    module, or None when it has no such qparams (another kind of quantizer)."""
    names = ("scale", "zero_point", "quant_min", "quant_max", "fake_quant_enabled")
    if not all(hasattr(quantizer, n) for n in names):
        return None
    per_channel = getattr(quantizer, "is_per_channel", False)
    axis = int(quantizer.ch_axis) if per_channel else None
    return (quantizer.scale.detach().clone(), quantizer.zero_point.detach().clone(),
            int(quantizer.quant_min), int(quantizer.quant_max), axis)


def _fits_8_bits(quant_min, quant_max):
    # The quantize kernel stores int8 for a signed range, uint8 otherwise.
    return -128 <= quant_min and quant_max <= 127 if quant_min < 0 else quant_max <= 255


class FrozenFakeQuantize(nn.Module):
    """Fake quantization with fixed qparams (buffers `scale`, `zero_point`; per tensor, or per
    channel along `axis`): what a trained FakeQuantize computes with its observer off."""

    def __init__(self, scale, zero_point, quant_min, quant_max, axis=None):
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).reshape(-1))
        self.register_buffer("zero_point",
                             torch.as_tensor(zero_point, dtype=torch.int32).reshape(-1))
        self.quant_min, self.quant_max, self.axis = int(quant_min), int(quant_max), axis

    def forward(self, x):
        """fake_quantize(x) with the frozen qparams."""
        return fake_quantize(x, self.scale, self.zero_point, self.quant_min, self.quant_max,
                             self.axis)

    def extra_repr(self):
        """The range, axis and qparams, for repr()."""
        return (f"quant_min={self.quant_min}, quant_max={self.quant_max}, axis={self.axis}, "
                f"scale={self.scale}, zero_point={self.zero_point}")

    @staticmethod
    def freeze(quantizer):
        """The frozen form of a quantizer module: a FrozenFakeQuantize of its current qparams,
        nn.Identity when its fake quantization is off, or for a quantizer without affine
        qparams (a dynamic one), a copy with every observer switched off."""
        if quantizer is None:
            return nn.Identity()
        qparams = _affine_qparams(quantizer)
        if qparams is None:
            import copy
            from torch.ao.quantization import disable_observer
            return copy.deepcopy(quantizer).apply(disable_observer)
        if int(quantizer.fake_quant_enabled[0]) == 0:
            return nn.Identity()
        return FrozenFakeQuantize(*qparams)


class _ConvertedBase(nn.Module):
    """Weight storage and the quantizers shared by the converted modules."""

    def _set_weight(self, weight, quantizer, where):
        """Stores the weight as the QAT module fake-quantizes it: integer codes where the
        quantizer has affine 8-bit qparams, otherwise the fake-quantized float values."""
        weight = weight.detach()
        qparams = _affine_qparams(quantizer)
        self.weight_axis = None
        self.weight_quantized = None
        if hasattr(quantizer, "freeze_weight") and getattr(quantizer, "enabled", True):
            self.weight_int = None
            self.weight_quantized = quantizer.freeze_weight(weight)
            with torch.no_grad():
                want = quantizer(weight)
            if not _bits_equal(self.weight_quantized(), want):
                raise _core.Error(f"{_PREFIX}: {where}: the dequantized integer weight differs "
                                  "from the fake-quantized one (a qatgraph bug; please report "
                                  "it)")
            return
        if (qparams is None or weight.dtype != torch.float32 or
                int(quantizer.fake_quant_enabled[0]) == 0 or not _fits_8_bits(*qparams[2:4])):
            with torch.no_grad():
                value = quantizer(weight) if quantizer is not None else weight
            self.register_buffer("weight", value.detach().clone())
            self.weight_int = None
            return
        scale, zero_point, quant_min, quant_max, axis = qparams
        attrs = {"quant_min": quant_min, "quant_max": quant_max}
        if axis is not None:
            attrs.update({"scope": "channel", "axis": axis % weight.dim()})
        codes, _ = run("quantize", [weight.cpu().contiguous(), scale.cpu(),
                                    zero_point.to(torch.int32).cpu()], attrs)[0]
        self.register_buffer("weight_int", codes.to(weight.device))
        self.register_buffer("weight_scale", scale.float())
        self.register_buffer("weight_zero_point", zero_point.to(torch.int32))
        self.weight_axis = None if axis is None else axis % weight.dim()
        want = fake_quantize(weight, scale, zero_point, quant_min, quant_max, axis)
        if not torch.equal(self.dequantized_weight().view(torch.int32), want.view(torch.int32)):
            raise _core.Error(f"{_PREFIX}: {where}: the dequantized integer weight differs from "
                              "the fake-quantized one (a qatgraph bug; please report it)")

    def dequantized_weight(self):
        """The float weight the module computes with: (weight_int - zero_point) * scale, or
        the stored float weight."""
        if getattr(self, "weight_quantized", None) is not None:
            return self.weight_quantized()
        if self.weight_int is None:
            return self.weight
        shape = [1] * self.weight_int.dim()
        if self.weight_axis is not None:
            shape[self.weight_axis] = -1
        # Integers below 2^24 convert exactly and the product is rounded once, as the
        # fake-quantize kernel rounds it: the same bits.
        centred = self.weight_int.to(torch.int32) - self.weight_zero_point.reshape(shape)
        return centred.to(torch.float32) * self.weight_scale.reshape(shape)

    def _set_common(self, qat, where):
        self.relu = bool(getattr(qat, "relu", False))
        self.input_quant = FrozenFakeQuantize.freeze(getattr(qat, "input_fake_quant", None))
        self.output_quant = FrozenFakeQuantize.freeze(
            getattr(qat, "activation_post_process", None))
        bias = None if qat.bias is None else qat.bias.detach().clone()
        self.register_buffer("bias", bias)

    def _finish(self, y):
        return self.output_quant(F.relu(y) if self.relu else y)


class ConvertedLinear(_ConvertedBase):
    """A converted QATLinear: output_quant(relu?(linear(input_quant(x), weight, bias)))."""

    def __init__(self, qat, where="Linear"):
        super().__init__()
        self.in_features, self.out_features = qat.in_features, qat.out_features
        self._set_common(qat, where)
        self._set_weight(qat.weight, qat.weight_fake_quant, where)

    def forward(self, x):
        """The QAT module's eval-mode output, with frozen qparams."""
        return self._finish(F.linear(self.input_quant(x), self.dequantized_weight(), self.bias))


def _weightless_conv(qat):
    """A float conv module without a weight, shaped as `qat`: it does the padding modes and
    the call, on the weight a converted module dequantizes."""
    conv = nn.Conv2d(qat.in_channels, qat.out_channels, qat.kernel_size, qat.stride,
                     qat.padding, qat.dilation, qat.groups, False, qat.padding_mode,
                     device="meta")
    del conv.weight
    return conv


class ConvertedConv2d(_ConvertedBase):
    """A converted QATConv2d: output_quant(relu?(conv2d(input_quant(x), weight, bias)))."""

    def __init__(self, qat, where="Conv2d"):
        super().__init__()
        self.conv = _weightless_conv(qat)
        self._set_common(qat, where)
        self._set_weight(qat.weight, qat.weight_fake_quant, where)

    def forward(self, x):
        """The QAT module's eval-mode output, with frozen qparams."""
        return self._finish(self.conv._conv_forward(self.input_quant(x),
                                                    self.dequantized_weight(), self.bias))


class ConvertedConvBn2d(_ConvertedBase):
    """A converted QATConvBn2d: the folded weight as integer codes, and the QAT module's
    eval-mode arithmetic, batch norm with the running statistics included:
    output_quant(relu?(batch_norm(conv2d(x, weight) / factor + bias))).

    The batch norm is not folded into a bias: that changes the rounding of the result, and
    convert promises the prepared model's outputs bit for bit.
    """

    def __init__(self, qat, where="ConvBn2d"):
        super().__init__()
        self.conv = _weightless_conv(qat)
        self._set_common(qat, where)
        with torch.no_grad():
            factor = qat.folding_factor()
            folded = qat.weight * factor.reshape(-1, 1, 1, 1)
        self.register_buffer("factor", factor.detach().clone())
        for name in ("running_mean", "running_var", "weight", "bias"):
            self.register_buffer(f"bn_{name}", getattr(qat.bn, name).detach().clone())
        self.bn_eps = qat.bn.eps
        self._set_weight(folded, qat.weight_fake_quant, where)

    def forward(self, x):
        """The QAT module's eval-mode output, with frozen qparams."""
        zero = torch.zeros(self.factor.numel(), dtype=x.dtype, device=self.factor.device)
        y = self.conv._conv_forward(self.input_quant(x), self.dequantized_weight(), zero)
        y = y / self.factor.reshape(1, -1, 1, 1)
        if self.bias is not None:
            y = y + self.bias.reshape(1, -1, 1, 1)
        y = F.batch_norm(y, self.bn_running_mean, self.bn_running_var, self.bn_weight,
                         self.bn_bias, False, 0.0, self.bn_eps)
        return self._finish(y)
