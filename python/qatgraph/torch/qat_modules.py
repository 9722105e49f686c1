"""QAT modules: the float module plus the quantizers a recipe puts on it.

Module names and state_dict layout follow torch.ao's QAT modules (weight, bias,
weight_fake_quant.*, activation_post_process.*; bn.* for conv-bn), so checkpoints move both
ways between these modules and the ones torch.ao's eager prepare_qat makes. The output
quantizer runs inside forward rather than from a forward hook: the module holds no hook, so
copying, pickling and convert need no hook bookkeeping.
"""
import torch
import torch.nn.functional as F
from torch import nn

from . import recipes as _recipes
from .fake_quantize import FakeQuantize
from .functional import dynamic_qat_linear


def _attach_quantizers(module, recipe, relu):
    recipe = _recipes.resolve(recipe)
    if recipe.check is not None:
        recipe.check(module, type(module).__name__)
    module.relu = bool(relu)
    module.input_fake_quant = (None if recipe.input is None
                               else _recipes.build(recipe.input, "input", recipe))
    module.weight_fake_quant = _recipes.build(recipe.weight, "weight", recipe)
    if isinstance(module.weight_fake_quant, FakeQuantize):
        # Data parallelism keeps the weights equal on every rank: each rank's statistics are
        # the global ones already, a sync would only cost an all-reduce.
        module.weight_fake_quant.sync_observers = False
    module.activation_post_process = (None if recipe.activation is None else
                                      _recipes.build(recipe.activation, "activation", recipe))


def _finish(module, y):
    """Shared tail of every QAT forward: ReLU of a fused module, then the output quantizer."""
    if module.relu:
        y = F.relu(y)
    if module.activation_post_process is not None:
        y = module.activation_post_process(y)
    return y


def _quantize_input(module, x):
    return x if module.input_fake_quant is None else module.input_fake_quant(x)


def _dynamic_linear_attrs(module, x):
    """(input attrs, weight attrs) when both quantizers of a QATLinear run dynamic_fake_quantize
    on this call (the 8da4w and w8a8_dynamic recipes on CUDA), else None."""
    xq, wq = module.input_fake_quant, module.weight_fake_quant
    if xq is None or not hasattr(xq, "dynamic_attrs") or not hasattr(wq, "dynamic_attrs"):
        return None
    xa = xq.dynamic_attrs(x)
    wa = wq.dynamic_attrs(module.weight) if xa is not None else None
    return None if wa is None else (xa, wa)


def _same_place(module, like):
    """The quantizers on the device of the float module they came from."""
    return module.to(like.weight.device)


class QATLinear(nn.Linear):
    """nn.Linear with a weight quantizer (`weight_fake_quant`), an output quantizer
    (`activation_post_process`), optionally an input quantizer (`input_fake_quant`) and a
    fused ReLU (`relu=True`, torch.ao's LinearReLU), as the recipe says."""

    def __init__(self, in_features, out_features, bias=True, recipe="default", relu=False,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        _attach_quantizers(self, recipe, relu)

    def forward(self, input):
        """relu?(linear(input, weight_fake_quant(weight), bias)), then the output quantizer."""
        fused = _dynamic_linear_attrs(self, input)
        if fused is not None:  # the dynamic recipes on CUDA: one autograd node
            return _finish(self, dynamic_qat_linear(input, self.weight, self.bias, *fused))
        x = _quantize_input(self, input)
        return _finish(self, F.linear(x, self.weight_fake_quant(self.weight), self.bias))

    @classmethod
    def from_float(cls, mod, recipe="default", relu=False):
        """The QAT module of an nn.Linear, sharing its weight and bias Parameters."""
        qat = cls(mod.in_features, mod.out_features, mod.bias is not None, recipe, relu,
                  device="meta")
        qat.weight, qat.bias = mod.weight, mod.bias
        return _same_place(qat, mod).train(mod.training)

    def extra_repr(self):
        """The float module's repr arguments, and relu=True for a fused ReLU."""
        return super().extra_repr() + (", relu=True" if self.relu else "")


class QATConv2d(nn.Conv2d):
    """nn.Conv2d with the recipe's quantizers, as QATLinear; `relu=True` is torch.ao's
    ConvReLU2d."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", recipe="default", relu=False,
                 device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device=device, dtype=dtype)
        _attach_quantizers(self, recipe, relu)

    def forward(self, input):
        """relu?(conv2d(input, weight_fake_quant(weight), bias)), then the output quantizer."""
        x = _quantize_input(self, input)
        return _finish(self, self._conv_forward(x, self.weight_fake_quant(self.weight),
                                                self.bias))

    @classmethod
    def from_float(cls, mod, recipe="default", relu=False):
        """The QAT module of an nn.Conv2d, sharing its weight and bias Parameters."""
        qat = cls(**_conv_args(mod), recipe=recipe, relu=relu, device="meta")
        qat.weight, qat.bias = mod.weight, mod.bias
        return _same_place(qat, mod).train(mod.training)

    def extra_repr(self):
        """The float module's repr arguments, and relu=True for a fused ReLU."""
        return super().extra_repr() + (", relu=True" if self.relu else "")


def _conv_args(conv):
    return dict(in_channels=conv.in_channels, out_channels=conv.out_channels,
                kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding,
                dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                padding_mode=conv.padding_mode)


class QATConvBn2d(nn.Conv2d):
    """Conv2d followed by BatchNorm2d (and ReLU with `relu=True`), the batch norm folded into
    the weight before it is fake-quantized: torch.ao's intrinsic QAT ConvBn2d /
    ConvBnReLU2d, with the same state_dict (weight, bias, bn.*, weight_fake_quant.*,
    activation_post_process.*) and the same arithmetic, so results agree bit for bit.

    The weight is scaled by gamma / sqrt(running_var + eps) and fake-quantized; the conv output
    is divided by that factor again and goes through `bn`, which in training normalizes with
    the batch statistics (and updates the running ones), in eval with the running ones.
    `freeze_bn_stats()` keeps `bn` in eval mode whatever `train()` says (the running
    statistics stop moving, as late in QAT); `update_bn_stats()` undoes it.
    """

    # torch.ao's ConvBn layout version 2 (bn as a submodule): its loader then reads our keys.
    _version = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=False, padding_mode="zeros", eps=1e-5, momentum=0.1,
                 freeze_bn=False, recipe="default", relu=False, device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device=device, dtype=dtype)
        self.bn = nn.BatchNorm2d(out_channels, eps, momentum, device=device, dtype=dtype)
        _attach_quantizers(self, recipe, relu)
        self.freeze_bn = False
        if freeze_bn:
            self.freeze_bn_stats()

    def freeze_bn_stats(self):
        """Stops updating the running statistics: bn stays in eval mode. Returns self."""
        self.freeze_bn = True
        self.bn.training = False
        return self

    def update_bn_stats(self):
        """Updates the running statistics again (bn in training mode). Returns self."""
        self.freeze_bn = False
        self.bn.training = True
        return self

    def train(self, mode=True):
        """As nn.Module.train, except that a frozen bn stays in eval mode."""
        self.training = mode
        for name, child in self.named_children():
            if not (name == "bn" and self.freeze_bn):
                child.train(mode)
        return self

    def folding_factor(self):
        """gamma / sqrt(running_var + eps), per output channel: the weight's BN scale."""
        return self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)

    def forward(self, input):
        """relu?(bn(conv2d(input, weight_fake_quant(weight * f)) / f + bias)), f the folding
        factor, then the output quantizer."""
        x = _quantize_input(self, input)
        factor = self.folding_factor()
        weight = self.weight_fake_quant(self.weight * factor.reshape(-1, 1, 1, 1))
        # A zero bias tensor, not None: the very conv call torch.ao's module makes (a None
        # bias would also leave -0.0 where its +0.0 bias turns a zero sum into +0.0).
        zero = torch.zeros(self.out_channels, dtype=x.dtype, device=weight.device)
        # Dividing by the factor again hands bn the unscaled conv output: in training bn
        # normalizes with the batch's own statistics, which the running-statistics scale
        # folded into the weight must not distort.
        y = self._conv_forward(x, weight, zero) / factor.reshape(1, -1, 1, 1)
        if self.bias is not None:
            y = y + self.bias.reshape(1, -1, 1, 1)
        return _finish(self, self.bn(y))

    @classmethod
    def from_float(cls, conv, bn, recipe="default", relu=False):
        """The fused QAT module of an nn.Conv2d and the nn.BatchNorm2d after it, sharing their
        Parameters and running-statistics buffers."""
        qat = cls(**_conv_args(conv), eps=bn.eps, momentum=bn.momentum, recipe=recipe,
                  relu=relu, device="meta")
        qat.weight, qat.bias = conv.weight, conv.bias
        qat.bn = bn
        qat = _same_place(qat, conv).train(conv.training)
        return qat

    def extra_repr(self):
        """Conv2d's repr arguments, relu=True for a fused ReLU, freeze_bn=True when frozen."""
        return super().extra_repr() + (", relu=True" if self.relu else "") + (
            ", freeze_bn=True" if self.freeze_bn else "")


BN_MODULES = (QATConvBn2d,)


def freeze_bn_stats(module):
    """For model.apply: freezes the batch-norm statistics of a fused QAT conv-bn module
    (qatgraph's or torch.ao's), leaves any other module alone."""
    if isinstance(module, BN_MODULES + _torch_conv_bn()):
        module.freeze_bn_stats()


def update_bn_stats(module):
    """For model.apply: lets a fused QAT conv-bn module (qatgraph's or torch.ao's) update its
    batch-norm statistics again; leaves any other module alone."""
    if isinstance(module, BN_MODULES + _torch_conv_bn()):
        module.update_bn_stats()


def _torch_conv_bn():
    import torch.nn.intrinsic.qat as nniqat  # torch 1.13 keeps them here
    return (nniqat.ConvBn1d, nniqat.ConvBn2d, nniqat.ConvBn3d)
