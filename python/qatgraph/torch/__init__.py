"""PyTorch interop: qatgraph's quantization ops as torch.autograd.Functions on CPU and CUDA
tensors.

    import torch, qatgraph.torch as qgt
    from torch.ao.quantization import MovingAverageMinMaxObserver
    y = qgt.fake_quantize_per_tensor_affine(x, 0.1, 128, 0, 255)     # as torch's, STE backward
    y = qgt.fake_quantize_per_channel_affine(w, scales, zero_points, 0, -128, 127)
    fq = qgt.FakeQuantize(observer=MovingAverageMinMaxObserver,       # torch.ao's signature
                          quant_min=0, quant_max=255)
    y = fq(x)

Tensors cross into qatgraph through DLPack without a copy (contiguous inputs). On CUDA the
kernels run on torch's current stream into outputs torch allocates, and nothing waits for the
device: what a kernel finds wrong on the device (a scale <= 0) is raised by check_errors().
For f32 the results and gradients are PyTorch's bit for bit; f64 inputs do their math in f64
(SEMANTICS.md), where PyTorch takes 1/scale in f32. Under torch.compile the kernels are one
torch.library custom op with a fake kernel, so fullgraph=True does not break.
"""
from .dynamic_quantizers import (
    GroupFloatZeroFakeQuantize,
    GroupSymmetricFakeQuantize,
    PerTokenFakeQuantize,
    QuantizedWeight,
)
from .converted import ConvertedConv2d, ConvertedConvBn2d, ConvertedLinear, FrozenFakeQuantize
from .fake_quantize import FakeQuantize
from .functional import (
    check_errors,
    dynamic_quantize_per_token,
    fake_quantize,
    fake_quantize_per_channel_affine,
    fake_quantize_per_group,
    fake_quantize_per_tensor_affine,
    fake_quantize_per_token,
    from_torch,
    int4_pack,
    lsq_fake_quantize,
    nf4_pack,
    to_torch,
)
from .prepare import convert, prepare_qat
from .qat_modules import QATConv2d, QATConvBn2d, QATLinear, freeze_bn_stats, update_bn_stats
from .recipes import GROUP_SIZES, RECIPES, Recipe, recipe

__all__ = [
    "FakeQuantize",
    "check_errors",
    "dynamic_quantize_per_token",
    "fake_quantize",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_group",
    "fake_quantize_per_tensor_affine",
    "fake_quantize_per_token",
    "from_torch",
    "int4_pack",
    "lsq_fake_quantize",
    "nf4_pack",
    "to_torch",
    "prepare_qat",
    "convert",
    "Recipe",
    "RECIPES",
    "GROUP_SIZES",
    "recipe",
    "PerTokenFakeQuantize",
    "GroupSymmetricFakeQuantize",
    "GroupFloatZeroFakeQuantize",
    "QuantizedWeight",
    "QATLinear",
    "QATConv2d",
    "QATConvBn2d",
    "freeze_bn_stats",
    "update_bn_stats",
    "ConvertedLinear",
    "ConvertedConv2d",
    "ConvertedConvBn2d",
    "FrozenFakeQuantize",
]
