"""PyTorch interop: qatgraph's quantization ops as torch.autograd.Functions on CPU tensors.

    import torch, qatgraph.torch as qgt
    from torch.ao.quantization import MovingAverageMinMaxObserver
    y = qgt.fake_quantize_per_tensor_affine(x, 0.1, 128, 0, 255)     # as torch's, STE backward
    y = qgt.fake_quantize_per_channel_affine(w, scales, zero_points, 0, -128, 127)
    fq = qgt.FakeQuantize(observer=MovingAverageMinMaxObserver,       # torch.ao's signature
                          quant_min=0, quant_max=255)
    y = fq(x)

Tensors cross into qatgraph through DLPack without a copy (contiguous inputs). The ops run on
qatgraph's CPU kernels (the numerical reference): for f32 they give PyTorch's results and
gradients bit for bit; f64 inputs do their math in f64 (SEMANTICS.md), where PyTorch takes
1/scale in f32.
"""
from .converted import ConvertedConv2d, ConvertedConvBn2d, ConvertedLinear, FrozenFakeQuantize
from .fake_quantize import FakeQuantize
from .functional import (
    fake_quantize,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
    from_torch,
    to_torch,
)
from .prepare import convert, prepare_qat
from .qat_modules import QATConv2d, QATConvBn2d, QATLinear, freeze_bn_stats, update_bn_stats
from .recipes import RECIPES, Recipe

__all__ = [
    "FakeQuantize",
    "fake_quantize",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_tensor_affine",
    "from_torch",
    "to_torch",
    "prepare_qat",
    "convert",
    "Recipe",
    "RECIPES",
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
